//! How long a client may stay idle between commands (`client_idle_timeout`,
//! `idle_transaction_timeout`, the client's own `wait_timeout`), and the
//! error that ends one idle too long.

use super::*;

impl Session {
    /// The idle timeout that applies while waiting for the next command:
    /// `idle_transaction_timeout` inside a transaction on a server
    /// connection, `client_idle_timeout` otherwise.
    /// The client's own `SET wait_timeout` wins when shorter: the server
    /// would close it after that long, in a transaction or not.
    pub(super) fn idle_timeout(&self) -> Option<(Duration, &'static str)> {
        let config = &self.ctx.config;
        let in_txn =
            self.server.is_some() && self.status.contains(StatusFlags::SERVER_STATUS_IN_TRANS);
        let ours = if in_txn {
            config
                .idle_transaction_timeout
                .map(|d| (d, "idle_transaction"))
        } else {
            config.client_idle_timeout.map(|d| (d, "client_idle"))
        };
        match (ours, self.wait_timeout) {
            (Some((d, _)), Some(w)) if w < d => Some((w, "wait_timeout")),
            (None, Some(w)) => Some((w, "wait_timeout")),
            (ours, _) => ours,
        }
    }

    /// Tells the client (ERR 4031, naming the key) and ends the session;
    /// its cleanup rolls an open transaction back.
    pub(super) async fn idle_too_long(&mut self, kind: &'static str) -> SessionError {
        self.ctx.metrics.timeout(kind);
        let (what, limit) = match kind {
            "idle_transaction" => (
                "idle in transaction longer than idle_transaction_timeout",
                self.ctx.config.idle_transaction_timeout,
            ),
            _ => (
                "idle longer than client_idle_timeout",
                self.ctx.config.client_idle_timeout,
            ),
        };
        let mut msg = format!("fulcrum: {what} ({:?})", limit.unwrap_or_default());
        if kind == "idle_transaction" {
            msg.push_str("; the transaction was rolled back");
        }
        // Sequence 1: a client reads it as the answer to the command it
        // sends next (as MySQL 8's own 4031 reaches clients).
        put_error(
            &mut self.client.write_buf,
            1,
            codes::CLIENT_INTERACTION_TIMEOUT,
            &msg,
        );
        let _ = self.client.flush().await;
        SessionError::Refused(msg)
    }
}
