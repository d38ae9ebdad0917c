//! Statements longer than `max_classify_bytes`: not parsed (sqlparser
//! would hold the whole token stream in memory, on the async worker), not
//! fingerprinted, not cached; placed by their first words and one pass
//! over their words, which routes a plain read or write and pins the rest.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{with_hint, Classified, Classifier};
use crate::decision::Decision;
use crate::dialect::Dialect;

impl Classifier {
    /// [`Classifier::classify_shared`] for a text longer than
    /// `max_classify_bytes`: counted, its hint applied, never cached.
    pub(super) fn classify_oversized(&self, sql: &str) -> Arc<Classified> {
        self.oversized.fetch_add(1, Ordering::Relaxed);
        let mut unit = Classified::from(with_hint(sql, self.oversized(sql)));
        unit.may_commit = crate::statements::may_commit(sql.as_bytes());
        unit.comments = true;
        Arc::new(unit)
    }

    /// The decision for a statement too long to parse: `Unknown` (placed by
    /// `default_route`) only when it is plainly one read or write (one
    /// statement, starting with SELECT, WITH, VALUES, TABLE, INSERT,
    /// UPDATE, DELETE or MERGE, calling no function that changes session
    /// state, no `SELECT ... INTO`, no MySQL user variable); anything else
    /// pins its client, since guessing wrong there would leak the client's
    /// state to the next one or lose it.
    fn oversized(&self, sql: &str) -> Decision {
        let head = &sql.as_bytes()[..sql.len().min(256)];
        let head = match std::str::from_utf8(head) {
            Ok(h) => h,
            Err(e) => std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or_default(),
        };
        let words = crate::statements::head_words(head, 1);
        let first = words.first().map(String::as_str).unwrap_or("");
        let plain = matches!(
            first,
            "select" | "with" | "values" | "table" | "insert" | "update" | "delete" | "merge"
        );
        let pin = Decision::Pin("statement longer than max_classify_bytes");
        if !plain || !crate::statements::is_single_statement(sql) {
            return pin;
        }
        if self.dialect == Dialect::Postgres && crate::temp_schema::names_temp_schema(sql) {
            return Decision::Pin(crate::session_facts::TEMP_SCHEMA);
        }
        // One pass over the words (the text may be megabytes: no copy).
        let (mut session_call, mut into) = (false, false);
        let b = sql.as_bytes();
        let mut i = 0;
        while i < b.len() && !(session_call || into) {
            if b[i].is_ascii_alphabetic() || b[i] == b'_' {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'$')
                {
                    i += 1;
                }
                let word = &b[start..i];
                if word.len() <= 64 {
                    into = first == "select" && word.eq_ignore_ascii_case(b"into");
                    session_call = word.eq_ignore_ascii_case(b"set_config")
                        || self
                            .rules
                            .pin
                            .iter()
                            .any(|f| word.eq_ignore_ascii_case(f.as_bytes()));
                }
            } else {
                i += 1;
            }
        }
        let variable = self.dialect == Dialect::MySql && b.contains(&b'@');
        if session_call || into || variable {
            pin
        } else {
            Decision::Unknown
        }
    }
}
