//! PostgreSQL's side of a transaction replay (`transaction_replay`; the
//! run itself, its primary wait, comparison and outcome are
//! `fulcrum_cluster::replay`'s, the log `txn_log.rs`'s): the logged frames
//! go again through the usual path (statement mapping, deferred BEGIN),
//! the replayed answers are compared as they are queued, what the client
//! sent after the loss waits in the run, and a failed replay gives the
//! client the error it would have got without it (08006, transaction
//! lost), from where it stood.

use fulcrum_cluster::replay::{attach_primary, Progress, ReplayRun};

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
    /// The open transaction can be replayed if its server dies now.
    pub(super) fn replayable(&self) -> bool {
        match &self.txn.run {
            Some(run) => run.live(),
            None => {
                self.engine.txn_log.replayable()
                    && self.engine.status() != Status::Failed
                    && self.engine.pinned().is_none()
                    && self.owed.stream_left == 0
            }
        }
    }

    /// The engine said Replay: the first time, the log becomes a replay;
    /// after the replay's own server died, it starts over.
    pub(super) async fn replay_transaction(&mut self) -> Result<(), SessionError> {
        self.id.cancel.set_target(None);
        match self.txn.run.as_mut() {
            None => {
                let held = Held {
                    rest: std::mem::take(&mut self.client.read_buf),
                    owed: self.owed.ready,
                    unsynced: self.owed.unsynced,
                };
                let run = Run::start(&self.ctx, &mut self.engine, &self.client, held);
                self.txn.run = Some(Box::new(run));
            }
            Some(run) => run.restart(&mut self.engine, &mut self.client, false),
        }
        // The transaction gets a new id where it is replayed.
        self.engine.unit_lost();
        self.forget_owed();
        self.set_status(b'I');
        self.params.txn_ops.clear();
        self.params.txn_committed = None;
        self.lost_because = None;
        let deadline = self.txn.run.as_ref().expect("replaying").deadline();
        let ctx = self.ctx.clone();
        let Some((primary, server)) = attach_primary(&ctx, deadline, self).await else {
            self.replay_failed("no primary took it within transaction_replay_timeout".into());
            return Ok(());
        };
        // After a wait for the primary: the clock is read again.
        self.engine.replay_attached();
        self.install(primary, server);
        let run = self.txn.run.as_ref().expect("replaying");
        if let Some(sql) = &run.replay.begin {
            put_query(&mut self.to_server, sql);
            self.owed.expect.push(Expect::SwallowQuery);
        }
        self.client.read_buf = BytesMut::from(&run.replay.frames[..]);
        Box::pin(self.on_client_input()).await
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
        let done = self.server.is_some()
            && self.owed() == Owed::Nothing
            && self.to_server.is_empty()
            && self.client.read_buf.is_empty();
        let Some(run) = self.txn.run.as_mut() else {
            return false;
        };
        match run.progress(&mut self.client.write_buf) {
            Progress::Held if done && run.replay.is_short() => {
                self.replay_failed("the replayed transaction answered less than before".into());
                false
            }
            Progress::Held => true,
            Progress::Matched => {
                let run = *self.txn.run.take().expect("replaying");
                self.client.read_buf = run.matched(&self.ctx, &mut self.engine, self.backend).rest;
                let actions = self.engine.step(Event::Replayed);
                self.carry_out_now(actions);
                false
            }
            Progress::Differs => {
                let n = run
                    .replay
                    .completed_before_difference(|k| matches!(k, b'C' | b'E' | b'I' | b's'));
                let why = format!(
                    "the replayed transaction answered differently than before (a row changed, or now() or random() in it): {}; in {}",
                    run.replay.difference(),
                    nth_statement(&run.replay.frames, n)
                );
                self.replay_failed(why);
                false
            }
        }
    }

    /// The replay cannot finish: the client gets what it would have got
    /// without it (08006, the transaction lost), from where it stood.
    pub(super) fn replay_failed(&mut self, why: String) {
        let Some(run) = self.txn.run.take().map(|r| *r) else {
            return;
        };
        let held = run.failed(&self.ctx, &mut self.engine, &mut self.client, &why);
        if let Some(server) = self.server.take() {
            // Closing it rolls the replayed statements back.
            server.discard();
        }
        self.id.cancel.set_target(None);
        self.forget_unit();
        self.owed.ready = held.owed;
        self.owed.unsynced = held.unsynced;
        self.set_status(b'T');
        self.client.read_buf = held.rest;
        self.lost_because = Some(format!("transaction replay failed: {why}"));
        // Fail(NotCommitted): 08006, the transaction lost.
        let actions = self.engine.step(Event::ReplayFailed);
        self.carry_out_now(actions);
    }
}

/// The `n`th statement (0-based) of logged client frames, for a log line:
/// a simple query's text, or the prepared statement an Execute ran (its
/// portal's Bind names it; the text if the Parse is in the log too).
fn nth_statement(frames: &[u8], n: usize) -> String {
    use crate::codec::frontend_msg::{bind_msg, parse_msg, query_text};
    let mut texts: std::collections::HashMap<Vec<u8>, String> = std::collections::HashMap::new();
    let mut bound = String::new();
    let mut seen = 0;
    let mut at = 0;
    while at + 5 <= frames.len() {
        let len = u32::from_be_bytes([
            frames[at + 1],
            frames[at + 2],
            frames[at + 3],
            frames[at + 4],
        ]);
        let end = (at + 1 + len as usize).min(frames.len());
        let body = &frames[at + 5..end];
        let short = |t: &[u8]| {
            let t = String::from_utf8_lossy(t);
            t.chars().take(200).collect::<String>()
        };
        match frames[at] {
            b'Q' => {
                if seen == n {
                    return format!(
                        "the query {:?}",
                        short(query_text(body).unwrap_or_default())
                    );
                }
                seen += 1;
            }
            b'P' => {
                if let Some(p) = parse_msg(body) {
                    texts.insert(p.name.to_vec(), short(p.query));
                }
            }
            b'B' => {
                if let Some(b) = bind_msg(body) {
                    bound = texts.get(b.statement).cloned().unwrap_or_else(|| {
                        format!(
                            "prepared statement {:?}",
                            String::from_utf8_lossy(b.statement)
                        )
                    });
                }
            }
            b'E' => {
                if seen == n {
                    return format!("the execute of {bound:?}");
                }
                seen += 1;
            }
            _ => {}
        }
        at = end;
    }
    format!("statement {} (past the log)", n + 1)
}
