//! MySQL's side of a transaction replay (`transaction_replay`; the run
//! itself, its primary wait, comparison and outcome are
//! `fulcrum_cluster::replay`'s, the log `txn_log.rs`'s): the new primary is
//! given the client's schema and settings, every logged command is sent
//! again through the usual path (prepared statements are prepared on the
//! new connection as they are used), the held-back answers are compared
//! before any write to the client, and a failed replay is answered with
//! ERR 1927 (the session ends, as it does without replay).

use fulcrum_cluster::replay::{attach_primary, Progress, ReplayRun};

use super::*;

/// A replay under way (`fulcrum_cluster::replay` drives it); it carries
/// the sequence id of the answer to the command in flight at the loss.
pub(super) type Run = ReplayRun<u8>;

impl Session {
    /// The open transaction can be replayed if its server dies now.
    pub(super) fn replayable(&self) -> bool {
        match &self.txn.run {
            Some(run) => run.live(),
            None => self.engine.txn_log.replayable() && self.engine.pinned().is_none(),
        }
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
                run.matched(&self.ctx, &mut self.engine, self.backend);
                let actions = self.engine.step(Event::Replayed);
                let carried = self.carry_out_now(actions);
                debug_assert_eq!(carried, Carried::Done, "Replayed answers nothing");
                self.absorb_output();
                Ok(true)
            }
            Progress::Differs => {
                let why = format!(
                    "the replayed transaction answered differently than before (a row changed, or NOW() or RAND() in it): {}",
                    run.replay.difference()
                );
                Err(self.replay_failed(&why).await)
            }
        }
    }

    /// The engine said Replay (`lost` returned `SessionError::Replay`):
    /// sends the logged commands again on a primary until they match, the
    /// new server is lost too (then again, until the deadline), or they
    /// cannot match.
    pub(super) async fn replay_transaction(&mut self) -> Result<(), SessionError> {
        if self.txn.run.is_none() {
            let run = Run::start(&self.ctx, &mut self.engine, &self.client, self.txn.lost_seq);
            self.txn.run = Some(Box::new(run));
        }
        loop {
            self.set_status(StatusFlags::SERVER_STATUS_AUTOCOMMIT);
            self.engine.drop_keep();
            self.engine.unit_lost();
            let deadline = self.txn.run.as_ref().expect("replaying").deadline();
            let ctx = self.ctx.clone();
            let Some((primary, server)) = attach_primary(&ctx, deadline, self).await else {
                return Err(self
                    .replay_failed("no primary took it within transaction_replay_timeout")
                    .await);
            };
            // After a wait for the primary: the clock is read again.
            self.engine.replay_attached();
            self.install(primary, server);
            match self.prepare_server(self.txn.lost_seq).await {
                Ok(()) => {}
                Err(Ok(())) => {
                    return Err(self
                        .replay_failed("the new primary refused the session's schema or settings")
                        .await)
                }
                Err(Err(SessionError::Replay)) => {
                    self.restart_replay();
                    continue;
                }
                Err(Err(e)) => return Err(e),
            }
            let frames = self
                .txn
                .run
                .as_ref()
                .expect("replaying")
                .replay
                .frames
                .clone();
            let mut rest = &frames[..];
            let max = self.ctx.config.max_message_size.min(usize::MAX as u64) as usize;
            let mut lost_again = false;
            while !rest.is_empty() {
                let span = match scan_message(rest, max.max(MAX_PAYLOAD)) {
                    Ok(Some(span)) => span,
                    _ => break,
                };
                let msg = BytesMut::from(&rest[..span.total]);
                rest = &rest[span.total..];
                match self.dispatch(msg, span).await {
                    Ok(_) => {}
                    Err(SessionError::Replay) => {
                        lost_again = true;
                        break;
                    }
                    Err(e) => return Err(e),
                }
                self.flush().await?;
            }
            if lost_again {
                self.restart_replay();
                continue;
            }
            if self.txn.run.is_some() {
                return Err(self
                    .replay_failed("the replayed transaction answered less than before")
                    .await);
            }
            return Ok(());
        }
    }

    /// The replay's own server died: start the comparison over.
    fn restart_replay(&mut self) {
        let run = self.txn.run.as_mut().expect("replaying");
        run.restart(&mut self.engine, &mut self.client, true);
    }

    /// The replay cannot finish: the client gets what it gets without
    /// replay (ERR 1927 for the command in flight; the session ends, its
    /// transaction gone).
    pub(super) async fn replay_failed(&mut self, why: &str) -> SessionError {
        let Some(run) = self.txn.run.take().map(|r| *r) else {
            return SessionError::Refused(why.to_owned());
        };
        let seq = run.failed(&self.ctx, &mut self.engine, &mut self.client, why);
        if let Some(server) = self.server.take() {
            // Closing it rolls the replayed statements back.
            server.discard();
        }
        self.set_running(None);
        // Fail(NotCommitted): answered below, and the session ends (a
        // MySQL client cannot be told its transaction is gone otherwise).
        let actions = self.engine.step(Event::ReplayFailed);
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
