//! Where a PostgreSQL client stands for the result cache (`cache_scope`):
//! whether the unit at its front may be answered from the cache at all,
//! whether a miss may fill it (it runs on the primary), and whether it is
//! inside a transaction, where only a rule's `in_transactions` reads are
//! served, at READ COMMITTED only (docs/routing.md, "Cache").
//!
//! Three places qualify: an idle client of transaction pooling (a miss is
//! routed to the primary); a transaction whose BEGIN Fulcrum answered and
//! that is on no server yet (deferred), proven READ COMMITTED; and an idle
//! session-pooled client that left no state Fulcrum cannot replay (a miss
//! runs on its own connection and fills only if that is the primary's).

use fulcrum_session::txn::names_read_committed;

use super::*;

/// Where the unit at hand stands, for the cache (protocol-neutral).
pub(in crate::frontend::session) use fulcrum_session::cache_txn::CacheScope as Scope;

impl Session {
    /// Whether the unit at the front may be answered from (or fill) the
    /// cache, and how; `None` when it may not: a mirror, a fill or replay
    /// under way, a lost connection, `SET fulcrum.cache = off`, a pin,
    /// something owed, or a transaction the cache may not serve.
    pub(in crate::frontend::session) fn cache_scope(&self) -> Option<Scope> {
        if self.ctx.cache.is_none()
            || self.mirror.is_some()
            || self.cache_fill.is_some()
            || self.engine.is_lost()
            || self.txn.run.is_some()
            || self.cache_off()
        {
            return None;
        }
        if self.server.is_some() {
            return self.session_pooled_scope();
        }
        if self.engine.pinned().is_some() {
            return None;
        }
        match (self.engine.status(), self.engine.deferred_begin()) {
            (Status::Idle, None) => Some(Scope {
                fill: true,
                in_txn: false,
            }),
            // Nothing of the transaction is on a server yet: no write of
            // its own to see, and its isolation is all in its BEGIN.
            (Status::InTransaction, Some(begin)) if self.read_committed(begin) => Some(Scope {
                fill: true,
                in_txn: true,
            }),
            _ => None,
        }
    }

    /// A session-pooled client holding its connection between
    /// transactions with nothing owed, that left no state on it beyond its
    /// settings (a temporary table may hide a table a cached read names).
    fn session_pooled_scope(&self) -> Option<Scope> {
        let quiet = self.engine.status() == Status::Idle
            && self.owed.ready == 0
            && !self.owed.unsynced
            && self.to_server.is_empty();
        if self.pool_mode != PoolMode::Session || self.engine.state_left().is_some() || !quiet {
            return None;
        }
        Some(Scope {
            fill: self.ctx.router.is_primary(self.backend),
            in_txn: false,
        })
    }

    /// Whether a transaction that opened with `begin` runs READ COMMITTED:
    /// the level it names; else the client's `default_transaction_isolation`;
    /// else the database's default for every user, as the relation catalog
    /// read it (not known yet: no).
    fn read_committed(&self, begin: &str) -> bool {
        if let Some(named) = names_read_committed(begin) {
            return named;
        }
        match self.params.desired.get("default_transaction_isolation") {
            Some(stmt) => names_read_committed(stmt) == Some(true),
            None => {
                let id = &self.id;
                self.ctx
                    .relations
                    .read_committed(&id.pool_user, (0, 0), &id.database)
            }
        }
    }
}
