//! Transaction replay (`transaction_replay`): the session side of the
//! engine's `Replaying` phase. While a transaction runs, its client frames
//! and the checksum of the client's output are kept (`TxnLog`); when its
//! server dies before COMMIT was sent, the session waits for a primary
//! (failover, SWITCHOVER, a restart), sends the frames again through the
//! usual path (statement mapping, deferred BEGIN), and holds the replayed
//! answers back until they add up to what the client already received.
//! Identical: the client goes on and sees only the answers it was still
//! owed. Different, short, or no primary in time: the client gets the
//! error it would have got without replay (08006, transaction lost).

use fulcrum_session::{Compare, Replay, TxnLog};

use super::*;

/// A replay under way.
pub(super) struct ReplayRun {
    pub(super) replay: Replay,
    /// `client.write_buf` length when it started: what is before was owed
    /// to the client already; what follows is replayed output, compared
    /// and dropped until it matches.
    mark: usize,
    /// What the client sent after the loss, taken up once the replay ends.
    rest: BytesMut,
    /// What the client was owed at the loss (for the error if it fails).
    owed: usize,
    unsynced: bool,
    deadline: tokio::time::Instant,
}

/// A server frame on the logged transaction: its first command must be
/// the transaction's start; COPY spoils it.
pub(super) fn log_server_frame(log: &mut TxnLog, tag: u8, body: &[u8]) {
    match tag {
        b'C' => {
            let t = command_tag(body);
            log.command_done(t == b"BEGIN" || t == b"START TRANSACTION");
        }
        b'E' => log.command_done(false),
        b'G' | b'H' | b'W' => log.spoil(),
        _ => {}
    }
}

impl Session {
    /// The open transaction can be replayed if its server dies now.
    pub(super) fn replayable(&self) -> bool {
        match &self.txn.run {
            Some(run) => tokio::time::Instant::now() < run.deadline,
            None => {
                self.engine.txn_log.replayable()
                    && self.engine.status() != Status::Failed
                    && self.engine.pinned().is_none()
                    && self.owed.stream_left == 0
            }
        }
    }

    /// Feeds what was queued for the client since the last call to the
    /// transaction's checksum (before it can be written).
    pub(super) fn absorb_output(&mut self) {
        if self.txn.run.is_none() && self.engine.txn_log.is_open() {
            let position = self.client.output_position();
            self.engine.txn_log.absorb(&self.client.write_buf, position);
        }
    }

    /// Before a client frame goes to the server: a unit that starts with
    /// `BEGIN` with nothing in flight opens the log; every frame of the
    /// transaction is kept.
    pub(super) fn log_client_frame(&mut self, tag: u8, frame: &[u8]) {
        if !self.engine.txn_log.enabled() {
            return;
        }
        if !self.engine.txn_log.is_open() {
            // Only a unit that starts with BEGIN can be replayed: any other
            // (an autocommit statement) is not copied at all.
            if self.engine.status() != Status::Idle
                || self.owed.ready > 0
                || self.owed.unsynced
                || !self.stmts.rewrite
                || self.engine.pinned().is_some()
                || !self.begins_transaction(tag, frame)
            {
                return;
            }
            self.engine
                .txn_log
                .open(self.client.output_position(), None);
            self.engine.txn_log.opens_with_begin();
        }
        match tag {
            // COPY and function calls (large objects) are never replayed.
            b'd' | b'c' | b'f' | b'F' => self.engine.txn_log.spoil(),
            _ => self.engine.txn_log.record(frame),
        }
    }

    /// ReadyForQuery: the log ends with the transaction. One that ends with
    /// more work pipelined behind it cannot be told apart from the next.
    pub(super) fn log_ready(&mut self, status: u8) {
        if status == b'I' && self.engine.txn_log.is_open() && self.txn.run.is_none() {
            if self.owed.ready == 0 {
                self.engine.txn_log.close();
            } else {
                self.engine.txn_log.spoil();
            }
        }
    }

    /// The frame runs (or prepares) a statement that starts a transaction.
    fn begins_transaction(&self, tag: u8, frame: &[u8]) -> bool {
        let body = &frame[5..];
        let text: Option<&[u8]> = match tag {
            b'Q' => query_text(body),
            b'P' => parse_msg(body).map(|p| p.query),
            b'B' => bind_msg(body)
                .filter(|b| !b.statement.is_empty())
                .and_then(|b| self.stmts.map.get(b.statement))
                .map(|s| &s.query[..]),
            _ => None,
        };
        text.is_some_and(|t| {
            let w = first_word(t);
            w.eq_ignore_ascii_case(b"BEGIN") || w.eq_ignore_ascii_case(b"START")
        })
    }

    /// The engine said Replay: the first time, the log becomes a replay;
    /// after the replay's own server died, it starts over.
    pub(super) async fn replay_transaction(&mut self) -> Result<(), SessionError> {
        let dead = self.backend;
        self.id.cancel.set_target(None);
        match self.txn.run.as_mut() {
            None => {
                self.absorb_output();
                let position = self.client.output_position();
                let replay = self.engine.txn_log.start_replay(position);
                tracing::info!(
                    server = %self.ctx.backends[dead],
                    cluster = %self.ctx.name(),
                    bytes = replay.frames.len(),
                    "server lost in a transaction; replaying it on the primary (transaction_replay)"
                );
                let limits = self.ctx.config.transaction_replay.expect("replay is on");
                self.txn.run = Some(ReplayRun {
                    replay,
                    mark: self.client.write_buf.len(),
                    rest: std::mem::take(&mut self.client.read_buf),
                    owed: self.owed.ready,
                    unsynced: self.owed.unsynced,
                    deadline: tokio::time::Instant::now() + limits.timeout,
                });
            }
            Some(run) => {
                tracing::info!(server = %self.ctx.backends[dead], "the replay's server was lost too; replaying again");
                run.replay.restart();
                self.client.write_buf.truncate(run.mark);
                let position = self.client.output_position();
                self.engine.txn_log.restart(position, &run.replay, false);
            }
        }
        self.forget_unit();
        self.set_status(b'I');
        self.engine.unit.commit_in_flight = false;
        self.params.txn_ops.clear();
        self.params.txn_committed = None;
        self.lost_because = None;
        let deadline = self.txn.run.as_ref().expect("replaying").deadline;
        if !self.attach_for_replay(deadline).await? {
            self.replay_failed("no primary took it within transaction_replay_timeout".into());
            return Ok(());
        }
        self.engine.unit.wrote_on_primary = true;
        let run = self.txn.run.as_ref().expect("replaying");
        if let Some(sql) = &run.replay.begin {
            put_query(&mut self.to_server, sql);
            self.owed.expect.push(Expect::SwallowQuery);
        }
        self.client.read_buf = BytesMut::from(&run.replay.frames[..]);
        Box::pin(self.on_client_input()).await
    }

    /// Attaches to whatever primary there is before `deadline` (the dead
    /// one is suspect, so the health loop looks at it at once). `false`:
    /// none in time.
    async fn attach_for_replay(
        &mut self,
        deadline: tokio::time::Instant,
    ) -> Result<bool, SessionError> {
        let ctx = self.ctx.clone();
        let mut primaries = fulcrum_pool::PrimaryWait::new(&ctx.router, deadline, true);
        while let Some((primary, _admission)) = primaries.next().await {
            let pool = ctx.pool(primary, &self.id.user, &self.id.database);
            let (user, database) = (&self.id.user, &self.id.database);
            match pool.get(|| ctx.open(primary, user, database)).await {
                Ok(mut server) => {
                    let synced = server.applied == self.params.desired
                        || sync_params(&mut server, &self.params.desired).await.is_ok();
                    if synced {
                        self.install(primary, server);
                        return Ok(true);
                    }
                    // Not the primary's fault: tried again a moment later.
                    server.discard();
                }
                // Down, starting, refusing: the next try may find it back,
                // or the health loop a new primary.
                Err(e) => {
                    tracing::debug!(error = %e, "replay: the primary cannot take it yet");
                    primaries.down(primary, e.to_string());
                }
            }
        }
        Ok(false)
    }

    /// Compares the replayed output queued since the replay started with
    /// what the client received, dropping it as it matches. Returns true
    /// while the replay goes on (the client must not be written to).
    pub(super) fn replay_progress(&mut self) -> bool {
        let done = self.server.is_some()
            && self.owed() == Owed::Nothing
            && self.to_server.is_empty()
            && self.client.read_buf.is_empty();
        let Some(run) = self.txn.run.as_mut() else {
            return false;
        };
        let out = self.client.write_buf.split_off(run.mark);
        match run.replay.compare(&out) {
            Compare::More => {
                if done && run.replay.is_short() {
                    self.replay_failed("the replayed transaction answered less than before".into());
                    return false;
                }
                true
            }
            Compare::Matched { taken } => {
                self.client.write_buf.extend_from_slice(&out[taken..]);
                let run = self.txn.run.take().expect("replaying");
                self.engine.txn_log.replayed(&run.replay);
                self.client.read_buf = run.rest;
                self.engine.step(Event::Replayed).close_now();
                self.ctx.metrics.transaction_replay("replayed");
                tracing::info!(server = %self.ctx.backends[self.backend], "transaction replayed; its answers matched what the client had received");
                false
            }
            Compare::Differs => {
                self.replay_failed(
                    "the replayed transaction answered differently than before (a row changed, or now() or random() in it)".into(),
                );
                false
            }
        }
    }

    /// The replay cannot finish: the client gets what it would have got
    /// without it (08006, the transaction lost), from where it stood.
    pub(super) fn replay_failed(&mut self, why: String) {
        let Some(run) = self.txn.run.take() else {
            return;
        };
        tracing::warn!(cluster = %self.ctx.name(), %why, "transaction replay failed");
        self.ctx.metrics.transaction_replay("failed");
        self.client.write_buf.truncate(run.mark);
        if let Some(server) = self.server.take() {
            // Closing it rolls the replayed statements back.
            server.discard();
        }
        self.id.cancel.set_target(None);
        self.engine.txn_log.close();
        self.forget_unit();
        self.owed.ready = run.owed;
        self.owed.unsynced = run.unsynced;
        self.set_status(b'T');
        self.client.read_buf = run.rest;
        self.lost_because = Some(format!("transaction replay failed: {why}"));
        if let Some(Action::Fail(outcome)) = self.engine.step(Event::ReplayFailed).iter().next() {
            self.fail_unit(outcome);
        }
    }
}
