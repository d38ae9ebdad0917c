//! When the server connection fails the client: what a lost connection
//! means for the command in flight (the engine decides: retry, replay,
//! answer and keep the client, or end the session), a server lost under a
//! client idle in a replayable transaction, and what the connection needs
//! when the client leaves (the engine's `Clean`).

use super::actions::Carried;
use super::*;
use fulcrum_session::{Outcome, Phase};
use std::borrow::Cow;

/// Why a replay ends when its own server is lost with a replayed statement
/// that may commit in flight (logged, and told to the client).
const REPLAY_LOST: &str = "its server was lost too, with a statement that may commit in flight";

impl Session {
    /// The server connection died under the client: ERR for the command in
    /// flight; a client that was in a transaction or pinned is disconnected
    /// (its state is gone, and it must not go on as if it were not).
    ///
    /// The work is a boxed future: every read and write of a unit can end
    /// here, and an unboxed one would be carried (1.1 kB) by every idle
    /// client's task.
    pub(super) async fn lost(&mut self, seq: u8, why: &str) -> SessionError {
        Box::pin(self.lose_server(seq, why)).await
    }

    async fn lose_server(&mut self, seq: u8, why: &str) -> SessionError {
        let backend = self.backend;
        if let Some(m) = self.digests.mirror.as_mut() {
            m.abandon();
        }
        if let Some(s) = self.server.take() {
            s.discard();
        }
        self.cache_server_lost();
        self.set_running(None);
        self.ctx.router.suspect(backend);
        let in_txn = self.in_transaction();
        let replayable = self.replayable();
        if self.txn.run.is_some() && !replayable {
            // The replay's own server died past transaction_replay_timeout.
            return self
                .replay_failed("its server was lost too, and its time is up")
                .await;
        }
        if self.engine.replay_on() && !replayable && in_txn {
            tracing::info!(
                log = self.engine.log_state(),
                "server lost in a transaction that cannot be replayed"
            );
        }
        // A COMMIT, or a write outside a transaction, may have committed
        // before the connection died: only the server knows (08007). The
        // BEGIN that opens a replayable transaction commits nothing.
        let commit = self.engine.commit_lost();
        let unknown = commit
            || (!in_txn
                && !replayable
                && self.engine.unit().may_write
                && self.ctx.router.is_primary(backend));
        // MySQL can end any answer with an ERR: no "half a message" case.
        let loss = Loss {
            retryable: self.engine.unit().retry.armed(),
            commit_in_flight: unknown,
            batch_open: false,
            mid_message: false,
            replayable,
            // MariaDB has no way to ask a new primary whether a given
            // transaction committed (docs/failover.md).
            commit_resolvable: false,
        };
        let actions = self.engine.step(Event::ServerLost(loss));
        // The replay's own server, lost with a replayed statement that may
        // commit in flight: the client's own command is answered instead.
        let (seq, commit, why) = self.replay_lost(seq, commit, why);
        // Retry and Replay hand the command back to the caller; Fail and
        // Close(StateLost) leave it to be answered here.
        let outcome = match self.carry_out(actions, seq).await {
            Ok(Carried::Failed(outcome)) => Some(outcome),
            Ok(Carried::StateLost | Carried::Done) => None,
            Err(SessionError::Replay) => {
                tracing::warn!(server = %self.ctx.address(backend), %why, "server connection lost in a transaction; replaying it");
                return SessionError::Replay;
            }
            Err(e) => return e,
        };
        // A COMMIT whose outcome is unknown ended the transaction either
        // way: the client knows it is out of it, and keeps its session
        // (as after an autocommit write). Any other transaction lost
        // mid-way ends the session, so that nothing the client sends next
        // runs outside the transaction it believes it is in (the engine is
        // Lost, or said Close); a lone statement does not.
        if commit && outcome == Some(Outcome::Unknown) && self.engine.is_lost() {
            let actions = self.engine.step(Event::LostEnded);
            let carried = self.carry_out_now(actions);
            debug_assert_eq!(carried, Carried::Done, "LostEnded answers nothing");
        }
        let ends = outcome.is_none() || self.engine.is_lost();
        let (state, advice) = match outcome {
            Some(Outcome::Unknown) => (*b"08007", Outcome::Unknown.advice()),
            _ if ends => (
                *b"70100",
                "the transaction or session state was lost: reconnect",
            ),
            Some(outcome) => (*b"70100", outcome.advice()),
            None => (*b"70100", Outcome::NotAnswered.advice()),
        };
        let msg = format!(
            "fulcrum: lost the connection to server {} of cluster \"{}\" ({why}); {advice}",
            self.ctx.address(backend),
            self.ctx.name(),
        );
        tracing::warn!(server = %self.ctx.address(backend), sqlstate = %String::from_utf8_lossy(&state), "server connection lost during a client's work");
        // ER_CONNECTION_KILLED (MariaDB's 1927; 2013 is client-side), with
        // SQLSTATE 08007 when the outcome is unknown (docs/failover.md).
        put_err(&mut self.client.write_buf, seq, 1927, state, &msg);
        let _ = self.flush().await;
        self.set_status(StatusFlags::SERVER_STATUS_AUTOCOMMIT);
        self.engine.drop_keep();
        if ends {
            SessionError::Refused(msg)
        } else {
            SessionError::Recoverable
        }
    }

    /// The replay's own server was lost and the engine left `Replaying`
    /// with it (`Lost`, `Fail(Unknown)`: a replayed statement that may
    /// commit was in flight): the run ends (its output dropped, the log
    /// closed, no `ReplayFailed` step), so that failure answers the
    /// client's own command waiting on the replay, once, instead of a
    /// replayed one. Returns that command's sequence id, whether it may
    /// commit itself (a client whose COMMIT was waiting knows its
    /// transaction is over, and keeps its session), and the error's words;
    /// with no run ended so, `seq`, `commit` and `why` as they are.
    fn replay_lost<'a>(&mut self, seq: u8, commit: bool, why: &'a str) -> (u8, bool, Cow<'a, str>) {
        if self.txn.run.is_none() || self.engine.phase() == Phase::Replaying {
            return (seq, commit, Cow::Borrowed(why));
        }
        let run = *self.txn.run.take().expect("replaying");
        let commit = self.last_may_commit(&run.replay.frames);
        let seq = run.lost_server(&self.ctx, &mut self.engine, &mut self.client, REPLAY_LOST);
        let why = format!("transaction replay failed: {REPLAY_LOST}; {why}");
        (seq, commit, Cow::Owned(why))
    }

    /// The client is gone: a connection in a transaction or pinned is closed
    /// (the server rolls back and forgets); otherwise it goes back.
    pub(super) async fn cleanup(&mut self) {
        // The engine says what the connection needs first (`Clean`): a
        // rollback (in a transaction) or a reset (pinned state); either
        // closes it here. Nothing asked: it goes back as it is.
        let actions = self.engine.step(Event::ClientGone);
        if let Err(e) = self.carry_out(actions, 0).await {
            tracing::debug!(error = %e, "cleaning the server connection");
        }
        self.give_back(false);
    }

    /// The server of a client idle in a replayable transaction went away:
    /// its connection is given up now (a SWITCHOVER waits for it), and the
    /// client's next command replays the transaction.
    pub(super) fn let_server_go(&mut self) {
        if let Some(s) = self.server.take() {
            tracing::info!(server = %self.ctx.address(self.backend), "server connection closed under a client idle in its transaction; it is replayed at the client's next command");
            s.discard();
        }
        self.set_running(None);
        self.ctx.router.suspect(self.backend);
        self.engine.server_let_go();
    }

    /// The client's next command after `let_server_go`: the loss is handled
    /// as if that command had found the server gone (a replay, or the
    /// error without one).
    pub(super) async fn server_gone_before(&mut self, seq: u8) -> Result<(), SessionError> {
        if self.engine.take_let_go() {
            return Err(self
                .lost(
                    seq,
                    "the server closed the connection while the client was idle in its transaction",
                )
                .await);
        }
        Ok(())
    }
}
