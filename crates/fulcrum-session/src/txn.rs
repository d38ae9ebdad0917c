//! Transaction control Fulcrum answers itself under transaction pooling, so
//! that a transaction's first real statement chooses its server: a lone
//! `BEGIN`/`START TRANSACTION` (answered, and sent later with that
//! statement), `SET TRANSACTION ...` before any statement (which may make
//! it read-only, or read-write again), and the `COMMIT`/`ROLLBACK` of a
//! transaction that ran nothing. Pure over one statement's text and its
//! classification.

use fulcrum_sql::Decision;

/// A transaction Fulcrum opened for the client and no server has yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeferredTxn {
    /// The statements to send ahead of the first real one (`BEGIN ...;
    /// SET TRANSACTION ...`).
    pub sql: String,
    /// A standby may run it.
    pub read_only: bool,
}

/// Fulcrum's answer to one transaction-control statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deferral {
    /// `BEGIN`: answered "BEGIN"; the client is in a transaction now.
    Opened(DeferredTxn),
    /// `SET TRANSACTION`: answered "SET"; the mode may have changed.
    Changed,
    /// `COMMIT/ROLLBACK AND CHAIN`: answered with its tag; a new empty
    /// transaction opens at once, still deferred.
    Chained(&'static str),
    /// `COMMIT`/`ROLLBACK`/`END`/`ABORT`: answered with its tag; the
    /// client is out of the transaction.
    Ended(&'static str),
}

/// Whether a statement starting with `first_word` may be answered here: a
/// cheap test before classifying.
pub fn candidate(first_word: &[u8], deferred: bool) -> bool {
    let words: &[&str] = if deferred {
        &["set", "commit", "end", "rollback", "abort"]
    } else {
        &["begin", "start"]
    };
    words
        .iter()
        .any(|w| first_word.eq_ignore_ascii_case(w.as_bytes()))
}

/// Fulcrum's answer to `sql` (one statement, classified `decision`) given
/// the transaction it deferred, if any (updated in place); `None` when the
/// statement must go to a server.
pub fn defer(decision: Decision, sql: &str, current: Option<&mut DeferredTxn>) -> Option<Deferral> {
    let sql = sql.trim().trim_end_matches(';').trim();
    match (decision, current) {
        (Decision::Begin { read_only }, None) => Some(Deferral::Opened(DeferredTxn {
            sql: sql.to_owned(),
            read_only,
        })),
        (Decision::TxnReadOnly, Some(d)) => {
            d.append(sql);
            d.read_only = true;
            Some(Deferral::Changed)
        }
        (Decision::Txn, Some(d)) if starts_with_ci(sql, "set transaction") => {
            // Standbys refuse SERIALIZABLE, and READ WRITE undoes READ ONLY:
            // such a transaction needs the primary.
            let lower = sql.to_ascii_lowercase();
            if lower.contains("serializable") || lower.contains("read write") {
                d.read_only = false;
            }
            d.append(sql);
            Some(Deferral::Changed)
        }
        (Decision::End, Some(_)) => {
            let rollback = ["rollback", "abort"].iter().any(|w| starts_with_ci(sql, w));
            let tag = if rollback { "ROLLBACK" } else { "COMMIT" };
            Some(if is_chained(sql) {
                Deferral::Chained(tag)
            } else {
                Deferral::Ended(tag)
            })
        }
        _ => None,
    }
}

impl DeferredTxn {
    fn append(&mut self, sql: &str) {
        self.sql.push_str("; ");
        self.sql.push_str(sql);
    }
}

pub use fulcrum_sql::statements::may_commit;

/// The statement begins a transaction (`BEGIN`, `START TRANSACTION`):
/// a unit that starts with one can be logged for `transaction_replay`.
pub fn begins(text: &[u8]) -> bool {
    let w = fulcrum_sql::statements::first_word(text);
    w.eq_ignore_ascii_case(b"BEGIN") || w.eq_ignore_ascii_case(b"START")
}

/// Whether `text` starts with `prefix`, ignoring ASCII case (never slices
/// inside a multi-byte character).
pub fn starts_with_ci(text: &str, prefix: &str) -> bool {
    text.as_bytes()
        .get(..prefix.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(prefix.as_bytes()))
}

/// `COMMIT AND CHAIN` / `ROLLBACK AND CHAIN` (not `AND NO CHAIN`).
pub fn is_chained(sql: &str) -> bool {
    let mut words = sql
        .split_whitespace()
        .map(|w| w.trim_end_matches(';'))
        .rev();
    let (Some(last), Some(before)) = (words.next(), words.next()) else {
        return false;
    };
    last.eq_ignore_ascii_case("chain") && before.eq_ignore_ascii_case("and")
}

/// The isolation level `sql` names (a transaction's `BEGIN ...; SET
/// TRANSACTION ...`, or a `default_transaction_isolation` setting):
/// `Some(true)` when every level it names is READ COMMITTED or READ
/// UNCOMMITTED (PostgreSQL runs the latter as the former), `Some(false)`
/// when it names another or a level it cannot read, `None` when it names
/// none. The result cache serves reads inside a transaction only at READ
/// COMMITTED, where each statement sees what is committed when it starts.
pub fn names_read_committed(sql: &str) -> Option<bool> {
    let lower = sql.to_ascii_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .filter(|w| !w.is_empty())
        .collect();
    let mut named = None;
    for (i, w) in words.iter().enumerate() {
        let level = match *w {
            // `ISOLATION LEVEL x`, `default_transaction_isolation = 'x'`,
            // `transaction_isolation TO x`.
            "level" if i > 0 && words[i - 1] == "isolation" => &words[i + 1..],
            "default_transaction_isolation" | "transaction_isolation" | "tx_isolation" => {
                let rest = &words[i + 1..];
                match rest.first() {
                    Some(&"to") => &rest[1..],
                    _ => rest,
                }
            }
            _ => continue,
        };
        let committed = matches!(
            level,
            ["read", "committed", ..] | ["read", "uncommitted", ..]
        );
        named = Some(named.unwrap_or(true) && committed);
    }
    // A mention of isolation this does not read is not a proof.
    match named {
        None if lower.contains("isolation") => Some(false),
        named => named,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RO: Decision = Decision::Begin { read_only: true };
    const RW: Decision = Decision::Begin { read_only: false };

    fn open(sql: &str, decision: Decision) -> DeferredTxn {
        match defer(decision, sql, None) {
            Some(Deferral::Opened(d)) => d,
            other => panic!("{sql}: {other:?}"),
        }
    }

    #[test]
    fn begin_opens_and_set_transaction_changes_the_mode() {
        let mut d = open("BEGIN;", RW);
        assert_eq!(d.sql, "BEGIN");
        assert!(!d.read_only);
        assert_eq!(
            defer(
                Decision::TxnReadOnly,
                "SET TRANSACTION READ ONLY",
                Some(&mut d)
            ),
            Some(Deferral::Changed)
        );
        assert!(d.read_only);
        assert_eq!(d.sql, "BEGIN; SET TRANSACTION READ ONLY");
        // READ WRITE undoes it: the transaction needs the primary again.
        defer(Decision::Txn, "set transaction read write", Some(&mut d));
        assert!(!d.read_only);
        let mut d = open("START TRANSACTION READ ONLY", RO);
        assert!(d.read_only);
        defer(
            Decision::Txn,
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
            Some(&mut d),
        );
        assert!(!d.read_only, "standbys refuse serializable");
        let mut d = open("BEGIN READ ONLY", RO);
        defer(
            Decision::Txn,
            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
            Some(&mut d),
        );
        assert!(d.read_only, "isolation alone keeps it read-only");
    }

    #[test]
    fn ends_and_chains_are_answered_with_their_tag() {
        let mut d = open("BEGIN", RW);
        let cases = [
            ("COMMIT", Deferral::Ended("COMMIT")),
            ("end", Deferral::Ended("COMMIT")),
            ("ROLLBACK", Deferral::Ended("ROLLBACK")),
            ("abort;", Deferral::Ended("ROLLBACK")),
            ("COMMIT AND CHAIN", Deferral::Chained("COMMIT")),
            ("rollback work and chain", Deferral::Chained("ROLLBACK")),
            ("COMMIT AND NO CHAIN", Deferral::Ended("COMMIT")),
        ];
        for (sql, want) in cases {
            assert_eq!(defer(Decision::End, sql, Some(&mut d)), Some(want), "{sql}");
        }
    }

    #[test]
    fn anything_else_goes_to_a_server() {
        let mut d = open("BEGIN", RW);
        assert_eq!(defer(RW, "BEGIN", Some(&mut d)), None, "BEGIN twice");
        assert_eq!(defer(Decision::Txn, "SAVEPOINT a", Some(&mut d)), None);
        assert_eq!(defer(Decision::Set, "SET x = 1", Some(&mut d)), None);
        assert_eq!(
            defer(Decision::End, "COMMIT", None),
            None,
            "nothing deferred"
        );
        assert_eq!(defer(Decision::Read, "SELECT 1", None), None);
        // A non-ASCII statement never panics.
        assert_eq!(defer(Decision::Txn, "SET TRANSACTIOé", Some(&mut d)), None);
    }

    #[test]
    fn the_cheap_test_picks_the_words() {
        assert!(candidate(b"BEGIN", false));
        assert!(candidate(b"start", false));
        assert!(!candidate(b"commit", false));
        assert!(candidate(b"COMMIT", true));
        assert!(candidate(b"set", true));
        assert!(!candidate(b"select", true));
        assert!(!candidate(b"begin", true));
    }

    #[test]
    fn statements_that_may_commit_are_seen() {
        assert!(may_commit(b"COMMIT"));
        assert!(may_commit(b"  end"));
        assert!(may_commit(b"INSERT INTO t VALUES (1); commit"));
        assert!(may_commit(b"COMMIT PREPARED 'x'"));
        assert!(!may_commit(b"ROLLBACK"));
        assert!(!may_commit(b"SELECT 1"));
        assert!(!may_commit(b"ending"), "END is a whole word");
    }

    #[test]
    fn and_chain_is_told_from_and_no_chain() {
        assert!(is_chained("COMMIT AND CHAIN"));
        assert!(is_chained("rollback work and chain;"));
        assert!(!is_chained("COMMIT AND NO CHAIN"));
        assert!(!is_chained("COMMIT"));
        assert!(!is_chained("CHAIN"));
    }

    #[test]
    fn prefixes_never_slice_inside_a_character() {
        assert!(starts_with_ci(
            "SET TRANSACTION READ WRITE",
            "set transaction"
        ));
        assert!(!starts_with_ci("SET TRANSACTIOé", "set transaction"));
        assert!(!starts_with_ci("ééééééééé", "set transaction"));
    }

    #[test]
    fn isolation_named_in_text() {
        use super::names_read_committed as rc;
        assert_eq!(rc("BEGIN"), None);
        assert_eq!(rc("BEGIN READ ONLY"), None);
        assert_eq!(rc("BEGIN ISOLATION LEVEL READ COMMITTED"), Some(true));
        assert_eq!(
            rc("start transaction isolation level read uncommitted, read only"),
            Some(true)
        );
        assert_eq!(rc("BEGIN ISOLATION LEVEL REPEATABLE READ"), Some(false));
        assert_eq!(
            rc("BEGIN; SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"),
            Some(false)
        );
        assert_eq!(
            rc("BEGIN ISOLATION LEVEL READ COMMITTED; SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"),
            Some(false),
            "every level named must be read committed"
        );
        assert_eq!(
            rc("SET default_transaction_isolation = 'read committed'"),
            Some(true)
        );
        assert_eq!(
            rc("SET default_transaction_isolation TO 'repeatable read'"),
            Some(false)
        );
        assert_eq!(
            rc("SET SESSION transaction_isolation = 'READ-COMMITTED'"),
            Some(true)
        );
        assert_eq!(rc("SET tx_isolation = 'REPEATABLE-READ'"), Some(false));
        assert_eq!(rc("SET transaction isolation something"), Some(false));
    }
}
