//! Where a MySQL client stands for the result cache (`cache_scope`): whether
//! the command at hand may be answered from the cache at all, whether a miss
//! may fill it (it runs on the primary), and whether it is inside a
//! transaction, where only a rule's `in_transactions` reads are served
//! (docs/routing.md, "MySQL and MariaDB").
//!
//! Three places qualify: an idle client of transaction pooling (a miss is
//! routed to the primary); a transaction open on the client's connection
//! that `fulcrum_session::cache_txn::TxnScope` says may be served (proven
//! READ COMMITTED, nothing but reads and settings sent in it); and an idle
//! session-pooled client that left no state on its connection (a miss runs
//! there and fills only if that is the primary's). This module feeds the
//! `TxnScope` what the client sends and what the server answers.

use fulcrum_session::cache_txn::settings_read_committed;

use super::*;

/// Where the unit at hand stands, for the cache (protocol-neutral).
pub(in crate::frontend::session) use fulcrum_session::cache_txn::CacheScope as Scope;

impl Session {
    /// Whether the command at hand may be answered from (or fill) the cache,
    /// and how; `None` when it may not: `SET fulcrum.cache = off`, a
    /// connection kept for the next command, a lost connection, a replay,
    /// a mirror, a fill under way, a pin, or a transaction the cache may
    /// not serve.
    pub(in crate::frontend::session) fn cache_scope(&self) -> Option<Scope> {
        if self.ctx.cache.is_none()
            || self.cache.off
            || self.engine.kept_for_next()
            || self.engine.is_lost()
            || self.txn.run.is_some()
            || self.digests.mirror.is_some()
            || self.cache.fill.is_some()
        {
            return None;
        }
        if self.in_transaction() {
            return self.transaction_scope();
        }
        let idle = self.status.contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT)
            && !self.status.contains(StatusFlags::SERVER_STATUS_IN_TRANS);
        if !idle {
            return None;
        }
        if self.server.is_some() {
            return self.session_pooled_scope();
        }
        if self.engine.pinned().is_some() {
            return None;
        }
        Some(Scope {
            fill: true,
            in_txn: false,
        })
    }

    /// A transaction open on the client's connection, autocommit on (a
    /// client that turned it off is pinned, state it left), that the
    /// `TxnScope` says may be served. Its miss runs on its connection and
    /// fills only when that is the primary's.
    fn transaction_scope(&self) -> Option<Scope> {
        let open = self.status.contains(StatusFlags::SERVER_STATUS_IN_TRANS)
            && self.status.contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT);
        if !open
            || self.server.is_none()
            || self.engine.state_left().is_some()
            || !self.cache.txn.servable()
        {
            return None;
        }
        Some(Scope {
            fill: self.ctx.router.is_primary(self.backend),
            in_txn: true,
        })
    }

    /// A session-pooled client holding its connection between
    /// transactions that left no state on it beyond its settings (a user
    /// variable, a temporary table that may hide a cached table, a lock).
    fn session_pooled_scope(&self) -> Option<Scope> {
        let session = self.engine.pinned() == Some(fulcrum_session::SESSION_POOL);
        if !session || self.engine.state_left().is_some() {
            return None;
        }
        Some(Scope {
            fill: self.ctx.router.is_primary(self.backend),
            in_txn: false,
        })
    }

    /// The statement `sql`, classified `decision`, goes to the server: the
    /// `TxnScope` learns whether it opens a transaction, sets the next
    /// one's level, or writes in the open one.
    pub(in crate::frontend::session) fn cache_txn_sent(&mut self, decision: Decision, sql: &str) {
        if self.ctx.cache.is_none() {
            return;
        }
        let open = self.status.contains(StatusFlags::SERVER_STATUS_IN_TRANS);
        let session_rc = settings_read_committed(self.desired.iter().map(String::as_str));
        let holds = self.engine.pinned().is_some();
        self.cache.txn.sent(decision, sql, open, session_rc, holds);
    }

    /// The server answered with the session's status (`set_status`).
    pub(in crate::frontend::session) fn cache_txn_answered(&mut self) {
        let open = self.status.contains(StatusFlags::SERVER_STATUS_IN_TRANS);
        self.cache.txn.answered(open);
    }
}
