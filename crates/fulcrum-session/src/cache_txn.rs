//! Whether the transaction a client has open on its server connection may be
//! answered from the result cache (a rule's `in_transactions`), for a front
//! end whose transactions start on the server (MySQL and MariaDB: BEGIN is
//! forwarded, not deferred as on PostgreSQL). Pure: fed the statements the
//! client sends and the transaction status of each answer, it knows no wire
//! format and reads SQL text only through [`names_read_committed`].
//!
//! A transaction may be served while it is proven READ COMMITTED (each
//! statement sees what is committed when it starts, so a kept answer is
//! what the statement would read) and it has sent its server nothing but
//! its opening statement, reads and session settings: no write of its own
//! that a kept answer would not show. The level is MySQL's: the session's
//! (its `SET SESSION TRANSACTION ISOLATION LEVEL`, `tx_isolation`,
//! `transaction_isolation`), or a `SET TRANSACTION ISOLATION LEVEL` that
//! applies to the next transaction only; unproven (the server's default,
//! REPEATABLE READ unless configured otherwise) means no.

use fulcrum_sql::Decision;

use crate::txn::names_read_committed;

/// The isolation the client's session settings leave (`settings` in the
/// order it ran them, as replayed): `true` when the last one naming a
/// level names READ COMMITTED or READ UNCOMMITTED, at session scope. A
/// setting of the global level proves nothing for the session and counts
/// as an unproven one (conservative); none at all: `false`.
pub fn settings_read_committed<'a>(settings: impl IntoIterator<Item = &'a str>) -> bool {
    let mut proven = false;
    for s in settings {
        let lower = s.to_ascii_lowercase();
        if let Some(named) = names_read_committed(s) {
            proven = named && !lower.contains("global");
        }
    }
    proven
}

/// Whether `sql`, a statement opening a transaction, asks for what the
/// cache never serves: a consistent snapshot (the transaction's reads see
/// the moment it began) or a read-only transaction (may run on a replica).
fn opens_unservable(sql: &str, read_only: bool) -> bool {
    read_only || sql.to_ascii_lowercase().contains("snapshot")
}

/// Where a unit stands for the result cache, once its front end found it
/// may be answered from the cache at all (each protocol's `cache_scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheScope {
    /// A miss may fill: it runs on the primary, the one server sure to have
    /// every write the cache's table versions count.
    pub fill: bool,
    /// Inside a transaction: only `in_transactions` reads are served, and
    /// the answer says the transaction is still open.
    pub in_txn: bool,
}

/// The client's transaction, as the cache sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxnScope {
    /// The level a `SET TRANSACTION ISOLATION LEVEL` gave the next
    /// transaction only: `Some(true)` proven READ COMMITTED, `Some(false)`
    /// another, or one that may not reach the transaction's connection.
    next: Option<bool>,
    /// A statement that opens a transaction was sent: whether that
    /// transaction may be served, settled by its answer.
    opening: Option<bool>,
    /// The open transaction may be served.
    servable: bool,
}

impl TxnScope {
    /// The statement `sql`, classified `decision`, is sent to the server.
    /// `open`: a transaction is open on the client's connection (the last
    /// answer said so); `session_rc`: the session level is proven READ
    /// COMMITTED ([`settings_read_committed`]); `holds`: the client keeps
    /// its connection between transactions (pinned, session pooling), so a
    /// next-transaction level reaches the transaction it is meant for.
    pub fn sent(
        &mut self,
        decision: Decision,
        sql: &str,
        open: bool,
        session_rc: bool,
        holds: bool,
    ) {
        match decision {
            Decision::Begin { read_only } => {
                let level = self.next.take().unwrap_or(session_rc);
                self.opening = Some(level && !opens_unservable(sql, read_only));
            }
            // The next transaction's characteristics (outside one).
            Decision::Txn | Decision::TxnReadOnly if !open => match names_read_committed(sql) {
                Some(rc) => {
                    let read_only = decision == Decision::TxnReadOnly;
                    self.next = Some(rc && holds && !read_only);
                }
                None if decision == Decision::TxnReadOnly => self.next = Some(false),
                None => {}
            },
            // Reads and session settings write nothing.
            Decision::Read | Decision::Set => {}
            _ if open => self.servable = false,
            // A statement that is its own transaction: it may use up a
            // next-transaction level; an unproven one stays unproven.
            _ => {
                if self.next == Some(true) {
                    self.next = Some(false);
                }
            }
        }
    }

    /// The server answered: `open`, a transaction is open after it.
    pub fn answered(&mut self, open: bool) {
        match self.opening.take() {
            Some(servable) => self.servable = open && servable,
            None if !open => self.servable = false,
            None => {}
        }
    }

    /// The open transaction may be answered from (and fill) the cache.
    pub fn servable(&self) -> bool {
        self.servable
    }

    /// The session was reset (COM_RESET_CONNECTION, another user): the
    /// next-transaction level and the transaction are gone.
    pub fn reset(&mut self) {
        *self = TxnScope::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEGIN: Decision = Decision::Begin { read_only: false };

    #[test]
    fn session_settings_prove_read_committed_only_at_session_scope() {
        assert!(!settings_read_committed([]));
        assert!(!settings_read_committed(["SET NAMES utf8mb4"]));
        assert!(settings_read_committed([
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"
        ]));
        assert!(settings_read_committed([
            "SET tx_isolation = 'READ-COMMITTED'",
            "SET NAMES utf8mb4"
        ]));
        assert!(!settings_read_committed([
            "SET @@session.transaction_isolation = 'READ-COMMITTED'",
            "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ"
        ]));
        assert!(!settings_read_committed([
            "SET @@global.tx_isolation = 'READ-COMMITTED'"
        ]));
    }

    #[test]
    fn a_read_committed_transaction_is_served_until_it_writes() {
        let mut t = TxnScope::default();
        t.sent(BEGIN, "BEGIN", false, true, false);
        assert!(!t.servable(), "not before BEGIN's answer");
        t.answered(true);
        assert!(t.servable());
        t.sent(Decision::Read, "SELECT 1", true, true, false);
        t.answered(true);
        assert!(t.servable(), "a read writes nothing");
        t.sent(Decision::Write, "UPDATE t SET v = 1", true, true, false);
        t.answered(true);
        assert!(!t.servable(), "its own write would not be seen");
        t.sent(Decision::End, "COMMIT", true, true, false);
        t.answered(false);
        t.sent(BEGIN, "BEGIN", false, true, false);
        t.answered(true);
        assert!(t.servable(), "the next transaction starts clean");
    }

    #[test]
    fn unproven_snapshot_and_read_only_transactions_are_not_served() {
        let mut t = TxnScope::default();
        t.sent(BEGIN, "BEGIN", false, false, false);
        t.answered(true);
        assert!(!t.servable(), "REPEATABLE READ, the default");
        let snapshot = "START TRANSACTION WITH CONSISTENT SNAPSHOT";
        t.sent(BEGIN, snapshot, false, true, false);
        t.answered(true);
        assert!(!t.servable());
        let ro = Decision::Begin { read_only: true };
        t.sent(ro, "START TRANSACTION READ ONLY", false, true, false);
        t.answered(true);
        assert!(!t.servable());
        t.sent(BEGIN, "BEGIN", false, true, false);
        t.answered(false);
        assert!(!t.servable(), "a BEGIN that opened nothing (an error)");
    }

    #[test]
    fn the_next_transaction_level_applies_once_and_only_on_a_held_connection() {
        let set_rc = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED";
        let mut t = TxnScope::default();
        t.sent(Decision::Txn, set_rc, false, false, true);
        t.answered(false);
        t.sent(BEGIN, "BEGIN", false, false, true);
        t.answered(true);
        assert!(t.servable(), "the next transaction is READ COMMITTED");
        t.sent(Decision::End, "COMMIT", true, false, true);
        t.answered(false);
        t.sent(BEGIN, "BEGIN", false, false, true);
        t.answered(true);
        assert!(!t.servable(), "only the next one");

        let mut pooled = TxnScope::default();
        pooled.sent(Decision::Txn, set_rc, false, false, false);
        pooled.sent(BEGIN, "BEGIN", false, false, false);
        pooled.answered(true);
        assert!(!pooled.servable(), "its connection went back to the pool");

        let mut rr = TxnScope::default();
        let set_rr = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ";
        rr.sent(Decision::Txn, set_rr, false, true, true);
        rr.sent(BEGIN, "BEGIN", false, true, true);
        rr.answered(true);
        assert!(!rr.servable(), "the next level overrides the session's");

        let mut used = TxnScope::default();
        used.sent(Decision::Txn, set_rc, false, false, true);
        used.sent(
            Decision::Write,
            "INSERT INTO t VALUES (1)",
            false,
            false,
            true,
        );
        used.sent(BEGIN, "BEGIN", false, false, true);
        used.answered(true);
        assert!(!used.servable(), "an autocommitted write may have used it");
    }
}
