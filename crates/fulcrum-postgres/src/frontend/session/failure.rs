//! What a session does when its server connection dies under it (transaction
//! pooling): a read on a replica that had not answered yet is sent again to
//! another backend, once; otherwise the client gets an ERROR with SQLSTATE
//! 08006 for the work in flight and, if it was in a transaction, answers as
//! a failed transaction until it rolls back (`lost.rs`). Either way the
//! backend is reported suspect, so the health loop looks at it at once, and
//! the client's next transaction goes wherever the router says then.
//! Session pooling, pinned clients and half-forwarded rows still end the
//! session with FATAL: their state cannot be rebuilt elsewhere.

use bytes::BytesMut;

use super::lost::Lost;
use super::Session;
use crate::codec::backend_msg::{self, sqlstate};
use crate::frontend::error::SessionError;
use crate::frontend::expect::Expectations;
use crate::frontend::login::fatal;

/// Units larger than this are not kept for a retry.
pub(super) const RETRY_MAX: usize = 1024 * 1024;

impl Session {
    /// The server connection died under the client.
    pub(super) async fn server_lost(&mut self) -> Result<(), SessionError> {
        let backend = self.backend;
        if let Some(s) = self.server.take() {
            tracing::warn!(server = %s.cancel.address, "server connection lost during a client's work");
            s.discard();
        }
        self.cancel.set_target(None);
        self.ctx.router.suspect(backend);
        if self.expect.only_position() && self.pending_ready == 0 {
            // Only Fulcrum's own position query was in flight: the client
            // is owed nothing; its reads use the primary until it writes again.
            self.expect = Expectations::default();
            self.to_server.clear();
            self.attached_at = None;
            self.causal.wrote_unknown();
            return Ok(());
        }
        let recoverable =
            self.rewrite_statements && self.pinned.is_none() && self.server_stream_left == 0;
        if recoverable && self.retry_armed && !self.retry_buf.is_empty() {
            return self.retry_unit().await;
        }
        if recoverable {
            self.fail_unit();
            return Ok(());
        }
        let msg = format!(
            "fulcrum: lost the connection to server {} of cluster \"{}\"; the transaction in progress, if any, was not committed by Fulcrum's knowledge",
            self.ctx.backends[backend],
            self.ctx.name()
        );
        Err(fatal(&mut self.client, sqlstate::CONNECTION_FAILURE, &msg).await)
    }

    /// Forgets everything owed by the dead connection.
    fn forget_unit(&mut self) {
        self.expect = Expectations::default();
        self.pending_ready = 0;
        self.unsynced = false;
        self.server_stream_left = 0;
        self.to_server.clear();
        self.deferred = None;
        self.attached_at = None;
        self.retry_armed = false;
    }

    /// Sends the unit again, from the client's own frames, to whatever the
    /// router picks now (the dead replica is suspect, so not it).
    async fn retry_unit(&mut self) -> Result<(), SessionError> {
        tracing::info!(replica = %self.ctx.backends[self.backend], "replica lost before it answered; the read goes to another backend");
        self.forget_unit();
        self.to_client.truncate(self.retry_client_mark);
        let mut again = std::mem::take(&mut self.retry_buf);
        again.extend_from_slice(&self.cbuf);
        self.cbuf = again;
        self.retry_buf = BytesMut::new();
        self.retrying = true;
        self.retry_avoid = Some(self.backend);
        let r = Box::pin(self.on_client_input()).await;
        self.retrying = false;
        self.retry_avoid = None;
        r
    }

    /// Errors the work in flight and keeps the client.
    fn fail_unit(&mut self) {
        let in_txn = self.status != b'I';
        // A COMMIT, or a write outside a transaction, may have committed
        // before the connection died: only the server knows (08007).
        let unknown = self.commit_in_flight || (!in_txn && self.write_unit);
        let (code, outcome) = if unknown {
            (
                sqlstate::TRANSACTION_RESOLUTION_UNKNOWN,
                "the transaction may or may not have committed: check before retrying it",
            )
        } else if in_txn {
            (
                sqlstate::CONNECTION_FAILURE,
                "the transaction was not committed: roll back and retry it",
            )
        } else {
            (
                sqlstate::CONNECTION_FAILURE,
                "the read was not answered: retry it",
            )
        };
        let msg = format!(
            "fulcrum: lost the connection to server {} of cluster \"{}\"; {outcome}",
            self.ctx.backends[self.backend],
            self.ctx.name(),
        );
        self.commit_in_flight = false;
        let owed = self.pending_ready;
        let unsynced = self.unsynced;
        self.forget_unit();
        self.txn_ops.clear();
        self.txn_committed = None;
        let status = if in_txn { b'E' } else { b'I' };
        for _ in 0..owed {
            backend_msg::error_response(&mut self.to_client, "ERROR", code, &msg);
            backend_msg::ready_for_query(&mut self.to_client, status);
        }
        if owed == 0 && unsynced {
            backend_msg::error_response(&mut self.to_client, "ERROR", code, &msg);
        }
        self.status = status;
        if in_txn || unsynced {
            self.lost = Some(Lost {
                in_txn,
                errored: unsynced,
                ending: false,
                untold: (owed == 0 && !unsynced).then_some(msg),
            });
        }
    }
}
