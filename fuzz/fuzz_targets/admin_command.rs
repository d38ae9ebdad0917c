//! The admin console's command parser: `fulcrum_admin::command::parse` on
//! any text (lossy UTF-8, as the console reads a Query) must give a command
//! or an error message, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match fulcrum_admin::command::parse(&text) {
        Ok(command) => {
            let _ = format!("{command:?}");
        }
        Err(message) => {
            let _ = message.len();
        }
    }
});
