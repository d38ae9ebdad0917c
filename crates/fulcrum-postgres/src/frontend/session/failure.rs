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

use fulcrum_session::{CommitId, Event, Loss, Outcome, Owed, Phase, Status};

use super::actions::Carried;
use super::lost::Lost;
use super::Session;
use crate::codec::backend_msg;
use crate::frontend::error::SessionError;
use crate::frontend::expect::Expectations;

impl Session {
    /// The server connection died under the client: the engine decides
    /// (retry, answer and keep the client, or close), this performs it.
    /// Boxed: rare, and its state (a replay, a COMMIT's resolution: over a
    /// kilobyte) would otherwise be part of every client's task, idle or
    /// not (docs/architecture.md, "Memory per idle client").
    pub(super) async fn server_lost(&mut self) -> Result<(), SessionError> {
        Box::pin(self.handle_server_lost()).await
    }

    async fn handle_server_lost(&mut self) -> Result<(), SessionError> {
        let backend = self.backend;
        if let Some(m) = self.mirror.as_mut() {
            m.abandon();
        }
        self.cache_server_lost();
        if let Some(s) = self.server.take() {
            tracing::warn!(server = %s.cancel.address, commit_in_flight = self.engine.unit().commit_in_flight, commit_id = ?self.engine.unit().commit_id, "server connection lost during a client's work");
            s.discard();
        }
        self.id.cancel.set_target(None);
        self.ctx.router.suspect(backend);
        if self.engine.status() == Status::Idle && self.owed() == Owed::OwnQuery {
            // The client's unit was answered in this same read.
            let ready = Event::Ready {
                status: Status::Idle,
                owed: Owed::OwnQuery,
            };
            let actions = self.engine.step(ready);
            self.carry_out_now(actions);
        }
        let was = self.engine.phase();
        let replayable = self.replayable();
        if self.engine.replay_on() && !replayable && self.engine.status() != Status::Idle {
            tracing::info!(log = self.engine.log_state(), status = ?self.engine.status(), "transaction not replayable");
        }
        if self.txn.run.is_some() && !replayable {
            // The replay's own server died past transaction_replay_timeout.
            self.replay_failed("its server was lost too, and its time is up".into());
            return Ok(());
        }
        let loss = Loss {
            retryable: self.engine.unit().retry.has_frames(),
            // A unit at status I on the primary autocommits, unless it is
            // the first of a transaction whose BEGIN went ahead of it.
            commit_in_flight: self.engine.unit().commit_in_flight
                || (self.engine.status() == Status::Idle
                    && self.engine.unit().wrote_on_primary
                    && !replayable),
            batch_open: self.owed.unsynced,
            // A large frame half forwarded cannot be followed by a clean
            // answer (a pinned client's state is lost too: the engine knows).
            mid_message: self.owed.stream_left > 0,
            replayable,
            commit_resolvable: self.engine.unit().commit_id != CommitId::Unknown,
        };
        let actions = self.engine.step(Event::ServerLost(loss));
        if self.txn.run.is_some() && self.engine.phase() != Phase::Replaying {
            // The replay's own server, with a replayed statement that may
            // commit in flight (`Fail(Unknown)`) or a message half sent
            // (`Fail(NotCommitted)`): the engine is `Lost`, and the run ends
            // with it, before that failure answers the client.
            self.replay_lost(if loss.commit_in_flight {
                "its server was lost too, with a statement that may commit in flight"
            } else {
                "its server was lost too, in the middle of a message"
            });
        }
        if was == Phase::Settling {
            // Only Fulcrum's own position query was in flight: the client
            // is owed nothing; its reads use the primary until it writes
            // again.
            self.owed.expect = Expectations::default();
            self.to_server.clear();
            // (A unit on the primary was never armed for a retry.)
            self.engine.connection_lost();
            self.on_position(None);
        } else if actions.is_empty() {
            // No server connection is attached in the phases whose loss
            // asks nothing (idle, deferred, lost, resolving): if one was,
            // what it held is gone with it.
            tracing::error!(phase = ?was, "server lost in a phase without a server connection");
            return Err(self.state_lost().await);
        }
        // Retry, Replay, Resolve, Fail, Close(StateLost), or a pending
        // drain's Close.
        let carried = self.carry_out(actions).await?;
        debug_assert_eq!(carried, Carried::Done, "ServerLost holds nothing");
        Ok(())
    }

    /// Forgets everything owed by the dead connection, and the engine
    /// forgets the connection.
    pub(super) fn forget_unit(&mut self) {
        self.forget_owed();
        self.engine.connection_lost();
    }

    /// Forgets everything owed by the dead connection.
    pub(super) fn forget_owed(&mut self) {
        self.owed.expect = Expectations::default();
        self.owed.ready = 0;
        self.owed.unsynced = false;
        self.owed.stream_left = 0;
        self.to_server.clear();
    }

    /// Sends the unit again, from the client's own frames, to whatever the
    /// router picks now (the dead replica is suspect, so not it).
    pub(super) async fn retry_unit(&mut self) -> Result<(), SessionError> {
        tracing::info!(replica = %self.ctx.backends[self.backend], "replica lost before it answered; the read goes to another backend");
        let (frames, client_mark) = self.engine.retry_elsewhere(self.backend);
        self.forget_unit();
        self.engine.forget_lost_because();
        self.client.write_buf.truncate(client_mark);
        let mut again = BytesMut::from(&frames[..]);
        again.extend_from_slice(&self.client.read_buf);
        self.client.read_buf = again;
        // (Boxed where `carry_out` awaits it, which breaks the recursion.)
        let r = self.on_client_input().await;
        self.engine.retry_sent();
        r
    }

    /// The start of every error telling the client its server was lost:
    /// which server, of which cluster, and why Fulcrum gave it up when it
    /// did (said once).
    pub(super) fn lost_server_words(&mut self) -> String {
        format!(
            "fulcrum: lost the connection to server {} of cluster \"{}\"{}",
            self.ctx.backends[self.backend],
            self.ctx.name(),
            self.engine
                .take_lost_because()
                .map_or(String::new(), |why| format!(" ({why})")),
        )
    }

    /// Errors the work in flight and keeps the client.
    pub(super) fn fail_unit(&mut self, outcome: Outcome) {
        let in_txn = self.engine.status() != Status::Idle;
        let code = outcome.sqlstate();
        let msg = format!("{}; {}", self.lost_server_words(), outcome.advice());
        let owed = self.owed.ready;
        let unsynced = self.owed.unsynced;
        self.engine.unit_lost();
        self.forget_owed();
        self.params.txn_forgotten();
        let status = if in_txn { b'E' } else { b'I' };
        for _ in 0..owed {
            backend_msg::error_response(&mut self.client.write_buf, "ERROR", code, &msg);
            backend_msg::ready_for_query(&mut self.client.write_buf, status);
        }
        if owed == 0 && unsynced {
            backend_msg::error_response(&mut self.client.write_buf, "ERROR", code, &msg);
        }
        self.set_status(status);
        if self.engine.is_lost() {
            // Entering Lost: how it is answered, from scratch.
            self.lost = Lost {
                in_txn,
                errored: unsynced,
                ending: false,
                untold: (owed == 0 && !unsynced).then(|| Box::new((code, msg))),
            };
        }
    }
}
