//! Idle clients: `client_idle_timeout` closes a client quiet outside a
//! transaction; `idle_transaction_timeout` closes one quiet inside a
//! transaction that holds a server connection (the cleanup then rolls it
//! back and returns the connection). Each is told why, in PostgreSQL's
//! words (57P05, 25P03), and counted in `fulcrum_client_timeouts_total`.

use super::*;

/// Which idle timeout applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IdleKind {
    Client,
    Transaction,
}

impl Session {
    /// The timeout that applies while the session waits now, if any: the
    /// client owes nothing, the server owes nothing, nothing is queued.
    pub(super) fn idle_timeout(&self) -> Option<(Duration, IdleKind)> {
        let config = &self.ctx.config;
        if config.client_idle_timeout.is_none() && config.idle_transaction_timeout.is_none() {
            return None;
        }
        let quiet = self.owed.ready == 0
            && self.owed.expect.is_empty()
            && !self.owed.unsynced
            && self.owed.stream_left == 0
            && self.to_server.is_empty()
            && self.client.read_buf.is_empty()
            && !self.client.has_output();
        if !quiet {
            return None;
        }
        if self.server.is_some() && self.engine.status() != Status::Idle {
            config
                .idle_transaction_timeout
                .map(|d| (d, IdleKind::Transaction))
        } else {
            config.client_idle_timeout.map(|d| (d, IdleKind::Client))
        }
    }

    /// Tells the client and ends the session (its cleanup rolls back).
    pub(super) async fn idle_too_long(&mut self, kind: IdleKind) -> SessionError {
        let config = &self.ctx.config;
        let (code, key, limit, what) = match kind {
            IdleKind::Client => (
                "57P05",
                "client_idle",
                config.client_idle_timeout,
                "idle longer than client_idle_timeout",
            ),
            IdleKind::Transaction => (
                "25P03",
                "idle_transaction",
                config.idle_transaction_timeout,
                "idle in transaction longer than idle_transaction_timeout",
            ),
        };
        self.ctx.metrics.timeout(key);
        let mut msg = format!("fulcrum: {what} ({:?})", limit.unwrap_or_default());
        if kind == IdleKind::Transaction {
            msg.push_str("; the transaction was rolled back");
        }
        tracing::info!(user = ?self.id.user, cluster = %self.ctx.name(), "{msg}");
        self.fatal_client(code, &msg).await
    }
}
