//! PostgreSQL's side of a transaction replay (`transaction_replay`; the
//! run itself, its primary wait, comparison and outcome are
//! `fulcrum_cluster::replay`'s, the log `txn_log.rs`'s): the logged frames
//! go again through the usual path (statement mapping, deferred BEGIN),
//! the replayed answers are compared as they are queued, what the client
//! sent after the loss waits in the run, and a failed replay gives the
//! client the error it would have got without it (08006, transaction
//! lost), from where it stood.

use fulcrum_cluster::replay::{self, attach_replay, Progress, ReplayRun};

use super::*;

/// A replay under way (`fulcrum_cluster::replay` drives it).
pub(super) type Run = ReplayRun<Held>;

/// What PostgreSQL restores when a replay ends.
pub(super) struct Held {
    /// What the client sent after the loss, taken up once the replay ends.
    rest: BytesMut,
    /// What the client was owed at the loss (for the error if it fails).
    owed: usize,
    unsynced: bool,
}

impl Session {
    /// The engine said Replay: the first time, the log becomes a replay;
    /// after the replay's own server died, it starts over.
    pub(super) async fn replay_transaction(&mut self) -> Result<(), SessionError> {
        self.id.cancel.set_target(None);
        let deadline = Run::attempt(
            &mut self.txn.run,
            &self.ctx,
            &mut self.engine,
            &mut self.client,
            false,
            |client| Held {
                rest: std::mem::take(&mut client.read_buf),
                owed: self.owed.ready,
                unsynced: self.owed.unsynced,
            },
        );
        self.forget_owed();
        self.set_status(b'I');
        self.params.txn_forgotten();
        self.engine.forget_lost_because();
        let ctx = self.ctx.clone();
        let Some((primary, server)) = attach_replay(&ctx, deadline, self).await else {
            self.replay_failed(replay::NO_PRIMARY.into());
            return Ok(());
        };
        self.install(primary, server);
        let run = self.txn.run.as_ref().expect("replaying");
        if let Some(sql) = &run.replay.begin {
            put_query(&mut self.to_server, sql);
            self.owed.expect.push(Expect::SwallowQuery);
        }
        self.client.read_buf = BytesMut::from(&run.replay.frames[..]);
        // (Boxed where `carry_out` awaits it, which breaks the recursion.)
        self.on_client_input().await
    }

    /// Compares the replayed output queued since the replay started with
    /// what the client received, dropping it as it matches. Returns true
    /// while the replay goes on (the client must not be written to).
    pub(super) fn replay_progress(&mut self) -> bool {
        // Called on every flush to the client: nothing else is looked at
        // when no replay is under way.
        if self.txn.run.is_none() {
            return false;
        }
        // The replayed frames are all sent and answered: the new primary
        // owes nothing more.
        let done = self.server.is_some()
            && self.owed() == Owed::Nothing
            && self.to_server.is_empty()
            && self.client.read_buf.is_empty();
        let run = self.txn.run.as_mut().expect("replaying");
        match run.progress(&mut self.client.write_buf) {
            Progress::Held if done && run.replay.is_short() => {
                self.replay_failed(replay::ANSWERED_LESS.into());
                false
            }
            Progress::Held => true,
            Progress::Matched => {
                let run = *self.txn.run.take().expect("replaying");
                let (held, actions) = run.matched(&self.ctx, &mut self.engine, self.backend);
                self.client.read_buf = held.rest;
                self.carry_out_now(actions);
                false
            }
            Progress::Differs => {
                let n = run
                    .replay
                    .completed_before_difference(|k| matches!(k, b'C' | b'E' | b'I' | b's'));
                let statement = crate::codec::frontend_msg::nth_statement(&run.replay.frames, n);
                let why = format!("{}; in {statement}", run.differs("now() or random()"));
                self.replay_failed(why);
                false
            }
        }
    }

    /// The replay's own server was lost and the engine left `Replaying`
    /// with it (a replayed statement that may commit in flight: `Lost`,
    /// `Fail(Unknown)`). The run ends with it, and the client's side is put
    /// back where it stood at the first loss (what it was owed, what it
    /// sent meanwhile), so that failure answers what the client is owed
    /// (08007) instead of the replay's own statements, and the next flush
    /// compares nothing.
    pub(super) fn replay_lost(&mut self, why: &str) {
        if let Some(run) = self.txn.run.take() {
            let held = run.lost_server(&self.ctx, &mut self.engine, &mut self.client, why);
            // What the replay's own statements were owed went with its server.
            self.restore(held, why);
        }
    }

    /// The replay cannot finish: the client gets what it would have got
    /// without it (08006, the transaction lost), from where it stood.
    pub(super) fn replay_failed(&mut self, why: String) {
        if let Some(run) = self.txn.run.take() {
            // Fail(NotCommitted): 08006, the transaction lost.
            let (ctx, server) = (&self.ctx, self.server.take());
            let (held, actions) = run.failed(ctx, &mut self.engine, &mut self.client, server, &why);
            self.id.cancel.set_target(None);
            self.engine.connection_lost();
            self.restore(held, &why);
            self.carry_out_now(actions);
        }
    }

    /// The client's side where it stood at the first loss (what the
    /// replay's own statements were owed forgotten): what it was owed, what
    /// it sent meanwhile, in a transaction; and why.
    fn restore(&mut self, held: Held, why: &str) {
        self.forget_owed();
        self.owed.ready = held.owed;
        self.owed.unsynced = held.unsynced;
        self.set_status(b'T');
        self.client.read_buf = held.rest;
        self.engine
            .server_lost_because(format!("transaction replay failed: {why}"));
    }
}
