//! The SQL classifier on both dialects: the first byte picks PostgreSQL or
//! MySQL, the rest is statement text (lossy UTF-8, as the front ends pass
//! it). `classify_unit` must return a decision for any text, never panic.
#![no_main]

use std::sync::OnceLock;

use fulcrum_sql::{Classifier, ClassifierConfig, Dialect};
use libfuzzer_sys::fuzz_target;

fn classifiers() -> &'static [Classifier; 2] {
    static C: OnceLock<[Classifier; 2]> = OnceLock::new();
    C.get_or_init(|| {
        let config = ClassifierConfig::default();
        [
            Classifier::new(Dialect::Postgres, &config),
            Classifier::new(Dialect::MySql, &config),
        ]
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, text)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(text);
    let _ = classifiers()[usize::from(which & 1)].classify_unit(&text);
});
