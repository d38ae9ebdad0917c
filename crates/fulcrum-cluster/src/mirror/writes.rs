//! Which units a reads-only mirror (`mirror_writes = false`) takes, for
//! both protocols: judged by the classifier's decisions, never by a unit's
//! first word. Reads, transaction control and session settings are its
//! traffic; anything that may write (a write such as `SET PASSWORD`, a read
//! that must run on the primary, a pin, text that cannot be parsed) is not.

use fulcrum_sql::Decision;

/// Pins that only move the client's own session state (a mirror's lane is
/// a connection of the client's own, so a pin means nothing to it): a
/// reads-only mirror takes these. Pins for what may write or lock (LOCK
/// TABLES, temporary objects, sequences, unparsed text) are not here.
const SESSION_PINS: &[&str] = &[
    "user variable",
    "SELECT ... INTO @variable",
    "SET ROLE",
    "RESET ROLE",
    "SET SESSION AUTHORIZATION",
    "RESET SESSION AUTHORIZATION",
    "SET autocommit = 0",
    "SET (...) = (...)",
    "SQL PREPARE",
    "DEALLOCATE",
];

/// Whether a reads-only mirror takes a statement classified `decision`.
pub fn reads_only_takes(decision: Decision) -> bool {
    match decision {
        Decision::Read
        | Decision::Set
        | Decision::Begin { .. }
        | Decision::End
        | Decision::Txn
        | Decision::TxnReadOnly => true,
        Decision::Pin(reason) => SESSION_PINS.contains(&reason),
        Decision::Primary | Decision::Write | Decision::Unknown => false,
    }
}

/// Whether the unit `text`, classified `whole`, may write as far as a
/// mirror is concerned: its whole decision, and for a text of several
/// statements each statement's own (`classify`; a combined decision keeps
/// only the strictest kind, and a session pin outranks a write), so that a
/// harmless first statement never carries a write with it.
pub fn unit_may_write(
    whole: Decision,
    text: &str,
    mut classify: impl FnMut(&str) -> Decision,
) -> bool {
    if !reads_only_takes(whole) {
        return true;
    }
    let statements = fulcrum_sql::statements::split_statements(text);
    statements.len() > 1 && statements.iter().any(|s| !reads_only_takes(classify(s)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fulcrum_sql::{Classifier, ClassifierConfig, Dialect};

    fn writes(sql: &str) -> bool {
        let c = Classifier::new(Dialect::MySql, &ClassifierConfig::default());
        unit_may_write(c.classify_unit(sql).decision, sql, |s| {
            c.classify_unit(s).decision
        })
    }

    #[test]
    fn a_harmless_first_statement_carries_no_write() {
        for sql in [
            "SET @a=1; INSERT INTO t VALUES (1)",
            "BEGIN; INSERT INTO t VALUES (1); COMMIT",
            "USE db; INSERT INTO t VALUES (1)",
            "SET PASSWORD = PASSWORD('x')",
            "SET PASSWORD FOR 'u'@'%' = 'x'",
            "START TRANSACTION; UPDATE t SET a = 1",
            "SELECT 1; DELETE FROM t",
            "SET @a=1; DELETE FROM t",
            "SELECT 1 INTO @a; LOCK TABLES t WRITE",
            "CREATE TEMPORARY TABLE x (a int)",
        ] {
            assert!(writes(sql), "{sql}");
        }
        for sql in [
            "SELECT 1",
            "SET @a=1",
            "SET NAMES utf8mb4",
            "BEGIN",
            "COMMIT",
            "USE db",
            "SET @a=1; SELECT @a",
            "SET @a=1; SET NAMES utf8mb4",
            "START TRANSACTION READ ONLY",
        ] {
            let c = Classifier::new(Dialect::MySql, &ClassifierConfig::default());
            assert!(!writes(sql), "{sql} {:?}", c.classify_unit(sql).decision);
        }
    }
}
