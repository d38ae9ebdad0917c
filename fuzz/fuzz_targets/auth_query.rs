//! The `auth_query` login path's inputs: a stored password as a server row
//! gives it (PostgreSQL: SCRAM verifier, md5 hash or plain; MariaDB: the
//! native hash), checked against a client's md5 response, and the user name
//! quoted into the query. Any bytes: no panic; an empty password is never a
//! secret; a quoted name is one SQL literal.
#![no_main]

use fulcrum_postgres::auth::secret::StoredSecret;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (stored, rest) = text.split_once('\u{0}').unwrap_or((&text, ""));
    match StoredSecret::parse(stored) {
        Some(StoredSecret::Md5(hash)) => {
            let _ = fulcrum_postgres::auth::md5::verify_hash(&hash, [1, 2, 3, 4], rest.as_bytes());
        }
        Some(_) => assert!(!stored.is_empty()),
        None => {}
    }
    let _ = fulcrum_mysql::auth::native::parse_stored_hash(stored);
    let quoted = fulcrum_postgres::frontend::auth_query::quote_literal(rest);
    // One literal: it ends with its quote and every inner quote is doubled.
    assert!(quoted.ends_with('\''));
    let inner = quoted
        .trim_start_matches('E')
        .strip_prefix('\'')
        .and_then(|q| q.strip_suffix('\''))
        .expect("quoted");
    assert!(!inner.replace("''", "").contains('\''), "{quoted}");
});
