//! Transaction replay (`transaction_replay`) for MySQL clients: the
//! session side of the engine's `Replaying` phase. A transaction opened by
//! `BEGIN` / `START TRANSACTION` is logged command by command, with the
//! checksum of what its client received; when its server dies before
//! COMMIT was sent, the session waits for a primary, gives it the client's
//! schema and settings, and sends every logged command again through the
//! usual path (prepared statements are prepared on the new connection as
//! they are used). The answers are held back and compared with what the
//! client already received; identical, the client goes on and only sees
//! the answer it was still owed. Different, short, or no primary in time:
//! the error it gets without replay (ERR 1927, the session ends).

use fulcrum_session::{Compare, Replay};

use super::route::contains_ignore_case;
use super::*;
use crate::codec::command::Command;

/// A replay under way.
pub(super) struct ReplayRun {
    replay: Replay,
    /// `client.write_buf` length when it started: before it, what the
    /// client is owed already; after it, replayed output being compared.
    mark: usize,
    deadline: tokio::time::Instant,
    /// The sequence id of the answer to the command in flight at the loss.
    seq: u8,
}

/// Where the comparison stands after a flush.
enum Progress {
    /// Not replaying (or the replay just matched): write to the client.
    Write,
    /// Replaying: the output was compared and dropped.
    Held,
    /// The answers differ.
    Differs,
}

impl Session {
    /// The open transaction can be replayed if its server dies now.
    pub(super) fn replayable(&self) -> bool {
        match &self.txn.run {
            Some(run) => tokio::time::Instant::now() < run.deadline,
            None => self.engine.txn_log.replayable() && self.engine.pinned().is_none(),
        }
    }

    /// A command about to be handled: `BEGIN` / `START TRANSACTION` outside
    /// a transaction opens the log; in it, every command is kept, and the
    /// ones whose replay would not give the same answer spoil it.
    pub(super) fn log_command(&mut self, cmd: Command, first: &[u8], msg: &[u8]) {
        if !self.engine.txn_log.enabled() || cmd == Command::Quit {
            return;
        }
        if !self.engine.txn_log.is_open() {
            if self.in_transaction() || self.engine.pinned().is_some() {
                return;
            }
            // BEGIN as a query, or as a prepared statement (sysbench's
            // --db-ps-mode=auto prepares it).
            let text: Option<&[u8]> = match cmd {
                Command::Query => query_text(first),
                Command::StmtExecute => first
                    .get(1..5)
                    .map(|id| u32::from_le_bytes([id[0], id[1], id[2], id[3]]))
                    .and_then(|id| self.prepared.map.get(&id))
                    .map(|s| s.sql.as_bytes()),
                _ => None,
            };
            let starts = text.is_some_and(|t| {
                let w = fulcrum_sql::statements::first_word(t);
                w.eq_ignore_ascii_case(b"BEGIN") || w.eq_ignore_ascii_case(b"START")
            });
            if !starts {
                return;
            }
            self.absorb_output();
            self.engine
                .txn_log
                .open(self.client.output_position(), None);
            self.engine.txn_log.opens_with_begin();
        }
        match cmd {
            // New statement ids, files, another user: not the same again.
            Command::StmtPrepare
            | Command::StmtClose
            | Command::StmtSendLongData
            | Command::ChangeUser
            | Command::ResetConnection => self.engine.txn_log.spoil(),
            Command::Query
                if query_text(first).is_some_and(|t| {
                    contains_ignore_case(&String::from_utf8_lossy(t), "local infile")
                }) =>
            {
                self.engine.txn_log.spoil()
            }
            _ => self.engine.txn_log.record(msg),
        }
    }

    /// The server of a client idle in a replayable transaction went away:
    /// its connection is given up now (a SWITCHOVER waits for it), and the
    /// client's next command replays the transaction.
    pub(super) fn let_server_go(&mut self) {
        if let Some(s) = self.server.take() {
            tracing::info!(server = %self.ctx.address(self.backend), "server connection closed under a client idle in its transaction; it is replayed at the client's next command");
            s.discard();
        }
        self.ctx.set_running(self.hello.connection_id, None);
        self.ctx.router.suspect(self.backend);
        self.server_gone = true;
    }

    /// The client's next command after `let_server_go`: the loss is handled
    /// as if that command had found the server gone (a replay, or the
    /// error without one).
    pub(super) async fn server_gone_before(&mut self, seq: u8) -> Result<(), SessionError> {
        if std::mem::take(&mut self.server_gone) {
            return Err(self
                .lost(
                    seq,
                    "the server closed the connection while the client was idle in its transaction",
                )
                .await);
        }
        Ok(())
    }

    /// After a command's answer: the log ends with the transaction.
    pub(super) fn log_answered(&mut self) {
        if self.txn.run.is_none() && self.engine.txn_log.is_open() {
            if self.in_transaction() {
                self.engine.txn_log.command_done(true);
            } else {
                self.engine.txn_log.close();
            }
        }
    }

    /// Feeds what was queued for the client to the transaction's checksum
    /// (before it is written).
    pub(super) fn absorb_output(&mut self) {
        if self.txn.run.is_none() && self.engine.txn_log.is_open() {
            let position = self.client.output_position();
            self.engine.txn_log.absorb(&self.client.write_buf, position);
        }
    }

    /// Before a write to the client: while replaying, compares the output
    /// queued since the replay started and drops it.
    pub(super) async fn replay_gate(&mut self) -> Result<bool, SessionError> {
        match self.replay_progress() {
            Progress::Write => {
                self.absorb_output();
                Ok(true)
            }
            Progress::Held => Ok(false),
            Progress::Differs => Err(self
                .replay_failed(
                    "the replayed transaction answered differently than before (a row changed, or NOW() or RAND() in it)",
                )
                .await),
        }
    }

    fn replay_progress(&mut self) -> Progress {
        let Some(run) = self.txn.run.as_mut() else {
            return Progress::Write;
        };
        let out = self.client.write_buf.split_off(run.mark);
        match run.replay.compare(&out) {
            Compare::More => Progress::Held,
            Compare::Matched { taken } => {
                self.client.write_buf.extend_from_slice(&out[taken..]);
                let run = self.txn.run.take().expect("replaying");
                self.engine.txn_log.replayed(&run.replay);
                self.engine.step(Event::Replayed).close_now();
                self.ctx.metrics.transaction_replay("replayed");
                tracing::info!(server = %self.ctx.address(self.backend), "transaction replayed; its answers matched what the client had received");
                Progress::Write
            }
            Compare::Differs => Progress::Differs,
        }
    }

    /// The engine said Replay (`lost` returned `SessionError::Replay`):
    /// sends the logged commands again on a primary until they match, the
    /// new server is lost too (then again, until the deadline), or they
    /// cannot match.
    pub(super) async fn replay_transaction(&mut self) -> Result<(), SessionError> {
        if self.txn.run.is_none() {
            self.absorb_output();
            let position = self.client.output_position();
            let replay = self.engine.txn_log.start_replay(position);
            let limits = self.ctx.config.transaction_replay.expect("replay is on");
            tracing::info!(cluster = %self.ctx.name(), bytes = replay.frames.len(), "replaying the transaction on the primary (transaction_replay)");
            self.txn.run = Some(ReplayRun {
                replay,
                mark: self.client.write_buf.len(),
                deadline: tokio::time::Instant::now() + limits.timeout,
                seq: self.txn.lost_seq,
            });
        }
        loop {
            self.status = StatusFlags::SERVER_STATUS_AUTOCOMMIT;
            self.keep_for_next = false;
            self.engine.unit.commit_in_flight = false;
            let deadline = self.txn.run.as_ref().expect("replaying").deadline;
            if !self.attach_for_replay(deadline).await {
                return Err(self
                    .replay_failed("no primary took it within transaction_replay_timeout")
                    .await);
            }
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
        run.replay.restart();
        self.client.write_buf.truncate(run.mark);
        let position = self.client.output_position();
        self.engine.txn_log.restart(position, &run.replay, true);
    }

    /// Attaches to whatever primary there is before `deadline`; false: none.
    async fn attach_for_replay(&mut self, deadline: tokio::time::Instant) -> bool {
        let ctx = self.ctx.clone();
        let mut primaries = fulcrum_pool::PrimaryWait::new(&ctx.router, deadline, true);
        while let Some((primary, _admission)) = primaries.next().await {
            match self.connection(primary).await {
                Ok(server) => {
                    self.install(primary, server);
                    return true;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "replay: the primary cannot take it yet");
                    primaries.down(primary, e.to_string());
                }
            }
        }
        false
    }

    /// The replay cannot finish: the client gets what it gets without
    /// replay (ERR 1927 for the command in flight; the session ends, its
    /// transaction gone).
    pub(super) async fn replay_failed(&mut self, why: &str) -> SessionError {
        let Some(run) = self.txn.run.take() else {
            return SessionError::Refused(why.to_owned());
        };
        tracing::warn!(cluster = %self.ctx.name(), %why, "transaction replay failed");
        self.ctx.metrics.transaction_replay("failed");
        self.client.write_buf.truncate(run.mark);
        if let Some(server) = self.server.take() {
            // Closing it rolls the replayed statements back.
            server.discard();
        }
        self.ctx.set_running(self.hello.connection_id, None);
        self.engine.txn_log.close();
        // Fail(NotCommitted): answered below, and the session ends (a
        // MySQL client cannot be told its transaction is gone otherwise).
        let failed = self.engine.step(Event::ReplayFailed);
        debug_assert!(failed.iter().all(|a| matches!(a, Action::Fail(_))));
        let msg = format!(
            "fulcrum: lost the connection to the primary of cluster \"{}\" (transaction replay failed: {why}); the transaction or session state was lost: reconnect",
            self.ctx.name(),
        );
        put_err(&mut self.client.write_buf, run.seq, 1927, *b"70100", &msg);
        let _ = self.client.flush().await;
        self.status = StatusFlags::SERVER_STATUS_AUTOCOMMIT;
        SessionError::Refused(msg)
    }
}
