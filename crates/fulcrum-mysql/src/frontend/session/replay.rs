//! MySQL's side of a transaction replay (`transaction_replay`; the run
//! itself, its primary wait, comparison and outcome are
//! `fulcrum_cluster::replay`'s, the log `txn_log.rs`'s): the new primary is
//! given the client's schema and settings, every logged command is sent
//! again through the usual path (prepared statements are prepared on the
//! new connection as they are used), the held-back answers are compared
//! before any write to the client, and a failed replay is answered with
//! ERR 1927 (the session ends, as it does without replay).

use fulcrum_cluster::replay::{self, attach_replay, Progress, ReplayRun};

use super::*;
use crate::codec::packet::Messages;

/// A replay under way (`fulcrum_cluster::replay` drives it); it carries
/// the sequence id of the answer to the command in flight at the loss.
pub(super) type Run = ReplayRun<u8>;

impl Session {
    /// The open transaction can be replayed if its server dies now.
    pub(super) fn replayable(&self) -> bool {
        replay::replayable(self.txn.run.as_deref(), &self.engine, true)
    }

    /// Before a write to the client: while replaying, compares the output
    /// queued since the replay started and drops it. `true`: write.
    pub(super) async fn replay_gate(&mut self) -> Result<bool, SessionError> {
        let Some(run) = self.txn.run.as_mut() else {
            self.absorb_output();
            return Ok(true);
        };
        match run.progress(&mut self.client.write_buf) {
            Progress::Held => Ok(false),
            Progress::Matched => {
                let run = *self.txn.run.take().expect("replaying");
                let (_, actions) = run.matched(&self.ctx, &mut self.engine, self.backend);
                let carried = self.carry_out_now(actions);
                debug_assert_eq!(carried, Carried::Done, "Replayed answers nothing");
                self.absorb_output();
                Ok(true)
            }
            Progress::Differs => {
                let why = run.differs("NOW() or RAND()");
                Err(self.replay_failed(&why).await)
            }
        }
    }

    /// The engine said Replay (`lost` returned `SessionError::Replay`):
    /// sends the logged commands again on a primary until they match, the
    /// new server is lost too (then again, until the deadline), or they
    /// cannot match.
    pub(super) async fn replay_transaction(&mut self) -> Result<(), SessionError> {
        'attempt: loop {
            let lost_seq = self.txn.lost_seq;
            let deadline = Run::attempt(
                &mut self.txn.run,
                &self.ctx,
                &mut self.engine,
                &mut self.client,
                true,
                |_| lost_seq,
            );
            self.set_status(StatusFlags::SERVER_STATUS_AUTOCOMMIT);
            self.engine.drop_keep();
            let ctx = self.ctx.clone();
            let Some((primary, server)) = attach_replay(&ctx, deadline, self).await else {
                return Err(self.replay_failed(replay::NO_PRIMARY).await);
            };
            self.install(primary, server);
            match self.prepare_server(lost_seq).await {
                Ok(()) => {}
                Err(Ok(())) => {
                    let why = "the new primary refused the session's schema or settings";
                    return Err(self.replay_failed(why).await);
                }
                Err(Err(SessionError::Replay)) => continue 'attempt,
                Err(Err(e)) => return Err(e),
            }
            let frames =
                BytesMut::from(&self.txn.run.as_ref().expect("replaying").replay.frames[..]);
            let max = self.ctx.config.max_message_size.min(usize::MAX as u64) as usize;
            for (msg, span) in Messages::new(frames, max.max(MAX_PAYLOAD)) {
                match self.dispatch(msg, span).await {
                    Ok(_) => self.flush().await?,
                    // The replay's own server died: the comparison starts over.
                    Err(SessionError::Replay) => continue 'attempt,
                    // Its server was lost with a replayed statement that
                    // may commit in flight: the run ended, the client was
                    // answered (08007) and keeps its session.
                    Err(SessionError::Recoverable) if self.txn.run.is_none() => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
            if self.txn.run.is_some() {
                return Err(self.replay_failed(replay::ANSWERED_LESS).await);
            }
            return Ok(());
        }
    }

    /// The replay cannot finish: the client gets what it gets without
    /// replay (ERR 1927 for the command in flight; the session ends, its
    /// transaction gone).
    pub(super) async fn replay_failed(&mut self, why: &str) -> SessionError {
        let Some(run) = self.txn.run.take().map(|r| *r) else {
            return SessionError::Refused(why.to_owned());
        };
        // Fail(NotCommitted): answered below, and the session ends (a
        // MySQL client cannot be told its transaction is gone otherwise).
        let (seq, actions) = run.failed(
            &self.ctx,
            &mut self.engine,
            &mut self.client,
            self.server.take(),
            why,
        );
        self.set_running(None);
        let carried = self.carry_out_now(actions);
        debug_assert!(matches!(carried, Carried::Failed(_) | Carried::Done));
        let msg = format!(
            "fulcrum: lost the connection to the primary of cluster \"{}\" (transaction replay failed: {why}); the transaction or session state was lost: reconnect",
            self.ctx.name(),
        );
        put_err(&mut self.client.write_buf, seq, 1927, *b"70100", &msg);
        let _ = self.client.flush().await;
        self.set_status(StatusFlags::SERVER_STATUS_AUTOCOMMIT);
        SessionError::Refused(msg)
    }
}
