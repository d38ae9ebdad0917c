//! The config loader: `fulcrum_config::parse` on any text (lossy UTF-8) must
//! return a validated config or an error, never panic.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Err(e) = fulcrum_config::parse(&text, Path::new("fuzz.toml")) {
        let _ = e.to_string();
    }
});
