//! The replies a server owes for what was sent to it, in order. Transaction
//! pooling renames, injects and answers some messages itself (prepared
//! statements shared across clients); this queue keeps the reply stream the
//! client sees exactly what a dedicated server would have sent: it eats the
//! replies to injected messages, emits synthetic replies in their place, and
//! drops both when an error makes the server skip to the next Sync.
//! See <https://www.postgresql.org/docs/15/protocol-flow.html#PROTOCOL-FLOW-EXT-QUERY>.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::codec::backend_msg;
use fulcrum_metrics::Stamp;
use fulcrum_session::CommitId;
use fulcrum_sql::Effect;

#[derive(Debug)]
pub enum Expect {
    /// ParseComplete for a client Parse (server name when it is a shared one).
    Parse(Option<Arc<str>>),
    /// ParseComplete for a Parse Fulcrum injected: not shown to the client
    /// (the shared server-side statement it prepares; `None`: the client's
    /// unnamed statement, prepared again).
    SwallowParse(Option<Arc<str>>),
    /// BindComplete (the shared server-side statement it binds, if mapped).
    Bind(Option<Arc<str>>),
    Close,
    /// CloseComplete for a Close Fulcrum injected (a least recently used
    /// shared statement evicted): not shown to the client.
    SwallowClose,
    /// ends at RowDescription or NoData (ParameterDescription first for
    /// statements); the shared server-side statement it describes, if
    /// mapped, and what it describes (`b'S'` statement, `b'P'` portal).
    Describe(Option<Arc<str>>, u8),
    /// ends at CommandComplete, EmptyQueryResponse or PortalSuspended; its
    /// digest stamp (statistics) when digests are on.
    Execute(Vec<Effect>, Option<Stamp>),
    /// ends at ReadyForQuery.
    Sync,
    /// A simple Query or FunctionCall; ends at ReadyForQuery.
    Query(Vec<Effect>, Option<Stamp>),
    /// A reply Fulcrum gives itself when this point of the stream is reached.
    Synthetic(Bytes),
    /// CommandComplete + ReadyForQuery Fulcrum gives itself for a whole Query
    /// it answered (DEALLOCATE of a mapped statement).
    SyntheticQuery(&'static str),
    /// A simple query Fulcrum sent for itself ahead of the client's work (a
    /// deferred BEGIN): its replies are not shown, except an error.
    SwallowQuery,
    /// `SELECT pg_current_xact_id_if_assigned()` Fulcrum sent behind a
    /// replayable transaction's first write (or ahead of its COMMIT):
    /// nothing of it is shown; its value lets a new primary say whether
    /// the COMMIT ran. `in_batch`: sent as Bind, Execute and Close of
    /// Fulcrum's own prepared statement before the client's Sync (its
    /// answer ends at CloseComplete, flushed with the client's); otherwise
    /// with a Sync of its own (ends at ReadyForQuery).
    CommitId {
        in_batch: bool,
    },
    /// `SELECT pg_current_wal_insert_lsn()` Fulcrum sent after a unit that
    /// wrote (consistency `session`): nothing of it is shown; its value is
    /// the client's read position.
    Position,
    /// The client ended a copy-in (CopyDone or CopyFail); owes no reply. Marks
    /// where Syncs start to count again (see `on_server` for 'G').
    CopyEnd,
}

/// What to do with one server message.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    Forward,
    /// Do not show it to the client.
    Drop,
}

/// Side effects the session must apply to its server-connection state.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// A statement prepared under this server-side name is now confirmed.
    pub prepared: Option<Arc<str>>,
    /// An error made the server skip to Sync: unconfirmed statements are gone.
    pub skipped_to_sync: bool,
    /// ReadyForQuery arrived (status byte).
    pub ready: Option<u8>,
    /// Syncs the server will ignore because they arrived during copy-in.
    pub ignored_syncs: usize,
    /// The answer to an `Expect::Position` ended: the LSN, or `None` when
    /// the server did not give one (an error).
    pub position: Option<Option<u64>>,
    /// An error answered the Bind or Describe of this shared server-side
    /// statement (the session decides from the SQLSTATE whether the
    /// statement went stale, e.g. after a type it uses was recreated).
    pub failed_statement: Option<Arc<str>>,
    /// A client's Query or Execute finished: its digest stamp, the rows its
    /// CommandComplete tags reported, and whether it failed.
    pub finished: Option<(Stamp, u64, bool)>,
    /// The answer to an `Expect::CommitId` ended: the transaction's id
    /// (`NothingWritten`: none assigned; `Unknown`: no answer).
    pub commit_id: Option<CommitId>,
}

#[derive(Debug, Default)]
pub struct Expectations {
    queue: VecDeque<Expect>,
    query_failed: bool,
    /// An extended-protocol copy-in is running and the client has not ended it:
    /// Syncs it sends now are ignored by the server.
    copy_in_open: bool,
    /// Session ops of statements that completed since the last ReadyForQuery.
    batch_ops: Vec<Effect>,
    /// The value read so far for an `Expect::Position`.
    position: Option<u64>,
    /// The value read so far for an `Expect::CommitId`.
    commit_id: CommitId,
    /// Rows the CommandCompletes of the Query at the front reported so far.
    query_rows: u64,
}

impl Expectations {
    pub fn push(&mut self, e: Expect) {
        self.queue.push_back(e);
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Only Fulcrum's own position query is owed: the client is owed nothing.
    pub fn only_position(&self) -> bool {
        !self.queue.is_empty() && self.queue.iter().all(|e| matches!(e, Expect::Position))
    }

    /// True while a Sync from the client owes no reply (extended copy-in running).
    pub fn sync_is_ignored(&self) -> bool {
        self.copy_in_open
    }

    /// The answer to a client's Query or Execute is what the server sends
    /// now: its rows (and a Query's RowDescription) carry nothing this
    /// queue acts on, so they may be forwarded without [`Self::on_server`]
    /// (it would answer `Forward` with no effects for them).
    #[inline]
    pub fn rows_are_plain(&self) -> bool {
        matches!(
            self.queue.front(),
            Some(Expect::Query(..) | Expect::Execute(..))
        )
    }

    /// The client sent CopyDone or CopyFail.
    pub fn client_copy_end(&mut self) {
        self.copy_in_open = false;
        self.queue.push_back(Expect::CopyEnd);
    }

    /// Ops that completed in the unit of work just ended by ReadyForQuery.
    pub fn take_batch_ops(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.batch_ops)
    }

    /// Emits synthetic replies that are now at the front. `status` is the
    /// transaction status to report in a synthetic ReadyForQuery. Called
    /// three or four times per unit, almost always with none there: that
    /// look is inlined, the emitting is not.
    #[inline]
    pub fn drain_synthetic(&mut self, out: &mut BytesMut, status: u8) -> Option<u8> {
        match self.queue.front() {
            Some(Expect::Synthetic(_) | Expect::CopyEnd | Expect::SyntheticQuery(_)) => {
                self.emit_synthetic(out, status)
            }
            _ => None,
        }
    }

    /// [`Self::drain_synthetic`] with a synthetic reply at the front.
    fn emit_synthetic(&mut self, out: &mut BytesMut, status: u8) -> Option<u8> {
        let mut ready = None;
        loop {
            match self.queue.front() {
                Some(Expect::Synthetic(bytes)) => out.extend_from_slice(bytes),
                Some(Expect::CopyEnd) => {}
                Some(Expect::SyntheticQuery(tag)) => {
                    if status == b'E' {
                        backend_msg::error_response(
                            out,
                            "ERROR",
                            backend_msg::sqlstate::IN_FAILED_TRANSACTION,
                            "current transaction is aborted, commands ignored until end of transaction block",
                        );
                    } else {
                        backend_msg::command_complete(out, tag);
                    }
                    backend_msg::ready_for_query(out, status);
                    ready = Some(status);
                }
                _ => return ready,
            }
            self.queue.pop_front();
        }
    }

    /// The server died with a lone COMMIT in flight, and a new primary
    /// says it committed: queues on `out` the replies the server owed for
    /// it, as it would have sent them, and empties the queue. False (and
    /// nothing queued) when what is owed is not one COMMIT's answer.
    /// Their digest stamps finish at `now`.
    pub fn answer_commit(&mut self, out: &mut BytesMut, now: std::time::Instant) -> bool {
        let mut answer = BytesMut::new();
        let mut statements = 0;
        for e in &self.queue {
            match e {
                Expect::Parse(_) => backend_msg::parse_complete(&mut answer),
                Expect::Bind(_) => backend_msg::bind_complete(&mut answer),
                Expect::Close => backend_msg::close_complete(&mut answer),
                Expect::Describe(_, b'S') => {
                    backend_msg::parameter_description_none(&mut answer);
                    backend_msg::no_data(&mut answer);
                }
                Expect::Describe(..) => backend_msg::no_data(&mut answer),
                Expect::Execute(..) => {
                    statements += 1;
                    backend_msg::command_complete(&mut answer, "COMMIT");
                }
                Expect::Sync => backend_msg::ready_for_query(&mut answer, b'I'),
                Expect::Query(..) => {
                    statements += 1;
                    backend_msg::command_complete(&mut answer, "COMMIT");
                    backend_msg::ready_for_query(&mut answer, b'I');
                }
                Expect::Synthetic(bytes) => answer.extend_from_slice(bytes),
                Expect::SwallowParse(_)
                | Expect::SwallowClose
                | Expect::SwallowQuery
                | Expect::CommitId { .. }
                | Expect::CopyEnd => {}
                Expect::SyntheticQuery(_) | Expect::Position => return false,
            }
        }
        if statements != 1 {
            return false;
        }
        for e in self.queue.drain(..) {
            if let Expect::Execute(_, Some(stamp)) | Expect::Query(_, Some(stamp)) = e {
                stamp.finish(0, false, now);
            }
        }
        out.extend_from_slice(&answer);
        true
    }

    /// Extended protocol after an error: the server discards everything up
    /// to the next Sync.
    fn skip_to_sync(&mut self) {
        while !matches!(
            self.queue.front(),
            Some(Expect::Sync | Expect::Query(..) | Expect::CommitId { in_batch: false }) | None
        ) {
            self.queue.pop_front();
        }
    }

    /// Accounts for one server message with tag `tag` (body for 'Z').
    pub fn on_server(&mut self, tag: u8, body: &[u8]) -> (Step, Effects) {
        let mut fx = Effects::default();
        let step = self.on_server_into(tag, body, &mut fx);
        (step, fx)
    }

    /// [`Self::on_server`], the effects written into `fx` (empty on entry):
    /// the session's frame loop keeps one there rather than have it
    /// returned and moved twice per frame.
    pub fn on_server_into(&mut self, tag: u8, body: &[u8], fx: &mut Effects) -> Step {
        match self.queue.front() {
            Some(Expect::Position) => return self.on_position(tag, body, fx),
            Some(&Expect::CommitId { in_batch }) => {
                if let Some(step) = self.on_commit_id(tag, body, in_batch, fx) {
                    return step;
                }
            }
            Some(Expect::SwallowQuery) => return self.on_swallowed_query(tag),
            _ => {}
        }
        match tag {
            b'1' => match self.queue.front() {
                Some(Expect::Parse(name)) => {
                    fx.prepared = name.clone();
                    self.queue.pop_front();
                    Step::Forward
                }
                Some(Expect::SwallowParse(name)) => {
                    fx.prepared = name.clone();
                    self.queue.pop_front();
                    Step::Drop
                }
                _ => Step::Forward,
            },
            b'3' if matches!(self.queue.front(), Some(Expect::SwallowClose)) => {
                self.queue.pop_front();
                Step::Drop
            }
            b'2' | b'3' => {
                if matches!(self.queue.front(), Some(Expect::Bind(_) | Expect::Close)) {
                    self.queue.pop_front();
                }
                Step::Forward
            }
            b'G' => {
                self.on_copy_in(fx);
                Step::Forward
            }
            b'T' | b'n' => {
                if matches!(self.queue.front(), Some(Expect::Describe(..))) {
                    self.queue.pop_front();
                }
                Step::Forward
            }
            b'C' | b'I' | b's' => {
                self.on_complete(tag, body, fx);
                Step::Forward
            }
            b'E' => {
                self.on_error(fx);
                Step::Forward
            }
            b'Z' => {
                self.on_ready(body, fx);
                Step::Forward
            }
            _ => Step::Forward,
        }
    }

    /// A frame of the answer to Fulcrum's own position query (dropped): its
    /// row holds the LSN, its ReadyForQuery ends it.
    fn on_position(&mut self, tag: u8, body: &[u8], fx: &mut Effects) -> Step {
        match tag {
            b'D' => {
                self.position = backend_msg::parse_data_row(body)
                    .and_then(|cols| cols.first().copied().flatten())
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .and_then(fulcrum_cluster::lag::parse_lsn);
            }
            b'Z' => {
                self.queue.pop_front();
                fx.position = Some(self.position.take());
            }
            _ => {}
        }
        Step::Drop
    }

    /// A frame of the answer to the transaction-id query asked ahead of a
    /// COMMIT; `None` when the frame is the client's (an error that
    /// failed its transaction in a batch), handled as usual.
    fn on_commit_id(
        &mut self,
        tag: u8,
        body: &[u8],
        in_batch: bool,
        fx: &mut Effects,
    ) -> Option<Step> {
        Some(match tag {
            b'D' => {
                let value =
                    backend_msg::parse_data_row(body).and_then(|cols| cols.first().copied());
                self.commit_id = match value {
                    Some(None) => CommitId::NothingWritten,
                    Some(Some(v)) => std::str::from_utf8(v)
                        .ok()
                        .and_then(|v| v.parse().ok())
                        .map_or(CommitId::Unknown, CommitId::Id),
                    None => CommitId::Unknown,
                };
                Step::Drop
            }
            b'Z' if !in_batch => {
                self.queue.pop_front();
                let id = std::mem::take(&mut self.commit_id);
                // Outside a transaction (or in a failed one) the answer
                // says nothing of the client's transaction.
                fx.commit_id = Some(if body.first() == Some(&b'T') {
                    id
                } else {
                    CommitId::Unknown
                });
                Step::Drop
            }
            // In a client's batch it ends at its portal's CloseComplete.
            b'3' if in_batch => {
                self.queue.pop_front();
                fx.commit_id = Some(std::mem::take(&mut self.commit_id));
                Step::Drop
            }
            b'E' if in_batch => {
                // The client's transaction failed with it: the client
                // is told (the usual error path skips to Sync).
                self.commit_id = CommitId::Unknown;
                return None;
            }
            b'E' => {
                self.commit_id = CommitId::Unknown;
                // Behind a statement that failed, the transaction was
                // already aborted: that error is not news. Any other
                // (a cancel) aborted the client's transaction: shown.
                let code = backend_msg::parse_error_fields(body).code;
                if code == backend_msg::sqlstate::IN_FAILED_TRANSACTION {
                    Step::Drop
                } else {
                    Step::Forward
                }
            }
            b'N' | b'S' | b'A' => Step::Forward,
            _ => Step::Drop,
        })
    }

    /// A frame of the answer to a Query Fulcrum sent (a deferred BEGIN):
    /// only what the client must see (errors, notices) goes on.
    fn on_swallowed_query(&mut self, tag: u8) -> Step {
        match tag {
            b'Z' => {
                self.queue.pop_front();
                Step::Drop
            }
            b'E' | b'N' | b'S' | b'A' => Step::Forward,
            _ => Step::Drop,
        }
    }

    /// CopyInResponse. Extended-protocol COPY FROM STDIN: the server
    /// ignores Sync (and Flush) until CopyDone/CopyFail, so Syncs the
    /// client pipelined after this Execute and before its copy end owe no
    /// reply.
    /// <https://www.postgresql.org/docs/15/protocol-flow.html#PROTOCOL-COPY>
    fn on_copy_in(&mut self, fx: &mut Effects) {
        if !matches!(self.queue.front(), Some(Expect::Execute(..))) {
            return;
        }
        let mut i = 1;
        let mut ended = false;
        while i < self.queue.len() {
            match self.queue[i] {
                Expect::Sync => {
                    self.queue.remove(i);
                    fx.ignored_syncs += 1;
                }
                Expect::CopyEnd => {
                    ended = true;
                    break;
                }
                _ => i += 1,
            }
        }
        self.copy_in_open = !ended;
    }

    /// CommandComplete, EmptyQueryResponse or PortalSuspended: an Execute
    /// is done (its stamp finished), or a Query's statement counted.
    fn on_complete(&mut self, tag: u8, body: &[u8], fx: &mut Effects) {
        match self.queue.front() {
            Some(Expect::Execute(..)) => {
                if let Some(Expect::Execute(ops, stamp)) = self.queue.pop_front() {
                    self.batch_ops.extend(ops);
                    fx.finished = stamp.map(|s| (s, tag_rows(tag, body), false));
                }
            }
            Some(Expect::Query(_, Some(_))) => self.query_rows += tag_rows(tag, body),
            _ => {}
        }
    }

    /// ErrorResponse: a Query fails at its ReadyForQuery; in the extended
    /// protocol the server discards everything up to Sync.
    fn on_error(&mut self, fx: &mut Effects) {
        if let Some(Expect::Bind(Some(name)) | Expect::Describe(Some(name), _)) = self.queue.front()
        {
            fx.failed_statement = Some(name.clone());
        }
        match self.queue.front() {
            Some(Expect::Query(..)) => self.query_failed = true,
            None => {}
            Some(Expect::Execute(_, Some(stamp))) => {
                fx.finished = Some((stamp.clone(), 0, true));
                self.skip_to_sync();
                fx.skipped_to_sync = true;
            }
            Some(_) => {
                self.skip_to_sync();
                fx.skipped_to_sync = true;
            }
        }
        self.batch_ops.clear();
    }

    /// ReadyForQuery: what was owed up to its Sync or Query is settled.
    fn on_ready(&mut self, body: &[u8], fx: &mut Effects) {
        while let Some(e) = self.queue.pop_front() {
            match e {
                Expect::Sync => break,
                Expect::Query(ops, stamp) => {
                    if !self.query_failed {
                        self.batch_ops.extend(ops);
                    }
                    let rows = std::mem::take(&mut self.query_rows);
                    fx.finished = stamp.map(|s| (s, rows, self.query_failed));
                    break;
                }
                _ => {}
            }
        }
        self.query_failed = false;
        fx.ready = body.first().copied();
    }
}

/// Rows a CommandComplete reports: the last number of its tag
/// (`SELECT 5`, `INSERT 0 1`, `UPDATE 3`); 0 for other messages and tags.
/// Read by hand, as `u64::from_str` would (an optional `+`, then digits;
/// anything else or an overflow is 0): the generic split, UTF-8 check and
/// parse cost about 150 instructions a statement for `SELECT 1`.
fn tag_rows(tag: u8, body: &[u8]) -> u64 {
    if tag != b'C' {
        return 0;
    }
    let end = body.iter().position(|&b| b == 0).unwrap_or(body.len());
    let text = &body[..end];
    let start = text.iter().rposition(|&b| b == b' ').map_or(0, |i| i + 1);
    let digits = match &text[start..] {
        [b'+', rest @ ..] => rest,
        n => n,
    };
    if digits.is_empty() {
        return 0;
    }
    let mut n: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return 0;
        }
        n = match n
            .checked_mul(10)
            .and_then(|n| n.checked_add((d - b'0') as u64))
        {
            Some(n) => n,
            None => return 0,
        };
    }
    n
}

#[cfg(test)]
#[path = "expect/tests.rs"]
mod tests;
