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

use fulcrum_session::{Action, CommitId, Event, Loss, Outcome, Owed, Phase, Status};

use super::lost::Lost;
use super::Session;
use crate::codec::backend_msg::{self, sqlstate};
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
        if let Some(s) = self.server.take() {
            tracing::warn!(server = %s.cancel.address, commit_in_flight = self.engine.unit.commit_in_flight, commit_id = ?self.engine.unit.commit_id, "server connection lost during a client's work");
            s.discard();
        }
        self.id.cancel.set_target(None);
        self.ctx.router.suspect(backend);
        if self.engine.status() == Status::Idle && self.owed() == Owed::OwnQuery {
            // The client's unit was answered in this same read.
            self.engine
                .step(Event::Ready {
                    status: Status::Idle,
                    owed: Owed::OwnQuery,
                })
                .close_now();
        }
        let was = self.engine.phase();
        let replayable = self.replayable();
        if self.engine.txn_log.enabled() && !replayable && self.engine.status() != Status::Idle {
            tracing::info!(log = self.engine.txn_log.describe(), status = ?self.engine.status(), "transaction not replayable");
        }
        if self.txn.run.is_some() && !replayable {
            // The replay's own server died past transaction_replay_timeout.
            self.replay_failed("its server was lost too, and its time is up".into());
            return Ok(());
        }
        let loss = Loss {
            retryable: self.engine.unit.retry.has_frames(),
            // A unit at status I on the primary autocommits, unless it is
            // the first of a transaction whose BEGIN went ahead of it.
            commit_in_flight: self.engine.unit.commit_in_flight
                || (self.engine.status() == Status::Idle
                    && self.engine.unit.wrote_on_primary
                    && !replayable),
            batch_open: self.owed.unsynced,
            // A large frame half forwarded cannot be followed by a clean
            // answer (a pinned client's state is lost too: the engine knows).
            mid_message: self.owed.stream_left > 0,
            replayable,
            commit_resolvable: self.engine.unit.commit_id != CommitId::Unknown,
        };
        let action = self.engine.step(Event::ServerLost(loss)).iter().next();
        match action {
            None if was == Phase::Settling => {
                // Only Fulcrum's own position query was in flight: the
                // client is owed nothing; its reads use the primary until
                // it writes again.
                self.owed.expect = Expectations::default();
                self.to_server.clear();
                self.engine.unit.attached_at = None;
                self.on_position(None);
                Ok(())
            }
            Some(Action::Retry) => self.retry_unit().await,
            Some(Action::Replay) => self.replay_transaction().await,
            Some(Action::Resolve) => self.resolve_commit().await,
            Some(Action::Fail(outcome)) => {
                self.fail_unit(outcome);
                Ok(())
            }
            _ => {
                let msg = format!(
                    "fulcrum: lost the connection to server {} of cluster \"{}\"{}; the session's state (transaction, prepared statements, settings) was on it: reconnect",
                    self.ctx.backends[backend],
                    self.ctx.name(),
                    self.lost_because
                        .take()
                        .map_or(String::new(), |why| format!(" ({why})")),
                );
                Err(self.fatal_client(sqlstate::CONNECTION_FAILURE, &msg).await)
            }
        }
    }

    /// Forgets everything owed by the dead connection.
    pub(super) fn forget_unit(&mut self) {
        self.owed.expect = Expectations::default();
        self.owed.ready = 0;
        self.owed.unsynced = false;
        self.owed.stream_left = 0;
        self.to_server.clear();
        self.engine.unit.attached_at = None;
        self.engine.unit.retry.disarm();
    }

    /// Sends the unit again, from the client's own frames, to whatever the
    /// router picks now (the dead replica is suspect, so not it).
    async fn retry_unit(&mut self) -> Result<(), SessionError> {
        tracing::info!(replica = %self.ctx.backends[self.backend], "replica lost before it answered; the read goes to another backend");
        let (frames, client_mark) = self.engine.unit.retry.take(self.backend);
        self.forget_unit();
        self.lost_because = None;
        self.client.write_buf.truncate(client_mark);
        let mut again = BytesMut::from(&frames[..]);
        again.extend_from_slice(&self.client.read_buf);
        self.client.read_buf = again;
        let r = Box::pin(self.on_client_input()).await;
        self.engine.unit.retry.done();
        r
    }

    /// Errors the work in flight and keeps the client.
    pub(super) fn fail_unit(&mut self, outcome: Outcome) {
        let in_txn = self.engine.status() != Status::Idle;
        let code = outcome.sqlstate();
        let msg = format!(
            "fulcrum: lost the connection to server {} of cluster \"{}\"{}; {}",
            self.ctx.backends[self.backend],
            self.ctx.name(),
            self.lost_because
                .take()
                .map_or(String::new(), |why| format!(" ({why})")),
            outcome.advice()
        );
        self.engine.unit.commit_in_flight = false;
        self.engine.unit.commit_id = CommitId::Unknown;
        let owed = self.owed.ready;
        let unsynced = self.owed.unsynced;
        self.forget_unit();
        self.params.txn_ops.clear();
        self.params.txn_committed = None;
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
            self.lost = Some(Lost {
                in_txn,
                errored: unsynced,
                ending: false,
                untold: (owed == 0 && !unsynced).then_some(msg),
            });
        }
    }
}
