//! PostgreSQL's side of read consistency (`fulcrum_session::reads` does
//! the steps; docs/consistency.md): positions are WAL LSNs; a unit that may
//! have written asks the primary `pg_current_wal_*_lsn()` on its own
//! connection once its answer is on the way to the client; a replica is
//! asked `pg_last_wal_replay_lsn()`, polled while a read waits; and the
//! causal-token and `fulcrum.consistency` statements are answered in
//! PostgreSQL's words.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fulcrum_pool::Checkout;
use fulcrum_session::reads::{Check, Positions, ReplicaProbe, SettingAnswer, Shared};
use fulcrum_sql::consistency::{position_op, setting_op, PositionOp, SETTING};

use super::Session;
use crate::backend::ServerConn;
use crate::codec::backend_msg;
use crate::codec::frontend_msg::{put_query, query_text};
use crate::frontend::context::ClusterContext;
use crate::frontend::expect::Expect;

/// The position a read must reach to see what was committed: the WAL
/// flush position, which every commit acknowledged under
/// `synchronous_commit` other than `off` is below; with `off` a commit is
/// acknowledged before its WAL is flushed, so the insert position is taken
/// (the replica then also waits for the walwriter's next flush).
const POSITION_SQL: &str = "SELECT (CASE WHEN current_setting('synchronous_commit') = 'off' \
     THEN pg_current_wal_insert_lsn() ELSE pg_current_wal_flush_lsn() END)::text";

/// Polling interval while a read waits for a replica to replay.
const POLL: Duration = Duration::from_millis(1);

/// WAL positions, ordered as numbers.
#[derive(Debug, Clone)]
pub(crate) struct Lsn;

impl Positions for Lsn {
    type P = u64;
    fn newer(a: &u64, b: &u64) -> bool {
        a > b
    }
    fn parse(text: &str) -> Option<u64> {
        fulcrum_cluster::lag::parse_lsn(text)
    }
}

/// A replica's connection, asked for its replay position.
struct Replica<'a>(&'a mut Checkout<ServerConn>);

impl ReplicaProbe<u64> for Replica<'_> {
    async fn reached(&mut self, position: &u64, wait: Duration) -> Option<bool> {
        let started = Instant::now();
        loop {
            let replayed = single_lsn(self.0, "SELECT pg_last_wal_replay_lsn()::text").await?;
            if replayed >= *position {
                return Some(true);
            }
            if started.elapsed() + POLL > wait {
                return Some(false);
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// The cluster-wide parts of a session's reads.
pub(super) fn shared<'a>(
    ctx: &'a ClusterContext,
    user: &'a Arc<str>,
    database: &'a Arc<str>,
) -> Shared<'a, u64> {
    Shared {
        config: &ctx.config,
        router: &ctx.router,
        metrics: &ctx.metrics,
        user_positions: &ctx.user_positions,
        user,
        database,
    }
}

impl Session {
    /// A unit on the primary that may have written is over (ReadyForQuery
    /// 'I', nothing else owed): ask the primary's position on the same
    /// connection, behind the answer the client already has.
    pub(super) fn after_unit(&mut self) {
        if !self.engine.unit.wrote_on_primary || self.owed.ready > 0 || self.owed.unsynced {
            return;
        }
        self.engine.unit.wrote_on_primary = false;
        // With one backend every read is on the primary already: no
        // position to keep (a single-node cluster pays nothing).
        if !self.reads.tracks_writes()
            || self.engine.pinned().is_some()
            || self.server.is_none()
            || self.ctx.router.backend_count() < 2
        {
            return;
        }
        // The client's unit is over now: count it before the connection is
        // held for Fulcrum's own query.
        self.record_unit();
        self.reads
            .learning(&shared(&self.ctx, &self.id.user, &self.id.database));
        put_query(&mut self.to_server, POSITION_SQL);
        self.owed.expect.push(Expect::Position);
    }

    /// The answer to the position query arrived (`None`: it failed).
    pub(super) fn on_position(&mut self, lsn: Option<u64>) {
        let shared = shared(&self.ctx, &self.id.user, &self.id.database);
        self.reads.learnt(&shared, lsn);
    }

    /// May the replica `backend`, on connection `server`, serve the read
    /// being routed?
    pub(super) async fn causal_check(
        &mut self,
        backend: fulcrum_pool::BackendId,
        server: &mut Checkout<ServerConn>,
    ) -> Check {
        let shared = shared(&self.ctx, &self.id.user, &self.id.database);
        let ctx = &self.ctx;
        let (user, database) = (&self.id.user, &self.id.database);
        let strong = || {
            ctx.primary_position
                .get(primary_position(ctx, user, database))
        };
        self.reads
            .check(&shared, backend, &mut Replica(server), strong)
            .await
    }

    /// Answers the causal-token statements itself: `SHOW fulcrum.position`
    /// and `SET fulcrum.min_position = '...'`, once everything before them
    /// is answered (a position being learnt included).
    pub(super) async fn try_answer_position(&mut self, total: usize) -> PositionAnswer {
        let Some(op) =
            statement(&self.client.read_buf[..total], &[b"set", b"show"]).and_then(position_op)
        else {
            return PositionAnswer::No;
        };
        if self.owed.unsynced {
            // Inside an unsynced extended-protocol batch: left to the server.
            return PositionAnswer::No;
        }
        if self.owed.ready > 0 || !self.owed.expect.is_empty() {
            return PositionAnswer::Hold;
        }
        let mut out = bytes::BytesMut::new();
        let error = match op {
            PositionOp::Show => {
                let token = self
                    .reads
                    .token(&shared(&self.ctx, &self.id.user, &self.id.database));
                // Nothing tracked: the primary's position now, past every
                // commit acknowledged so far.
                let position = match token {
                    Some(p) => Some(p),
                    None => primary_position(&self.ctx, &self.id.user, &self.id.database).await,
                };
                match position {
                    Some(p) => {
                        let text = fulcrum_cluster::lag::format_lsn(p);
                        backend_msg::one_text_row(&mut out, "fulcrum.position", &text);
                        backend_msg::command_complete(&mut out, "SHOW");
                        None
                    }
                    None => Some((
                        "57P03",
                        "fulcrum: the position is not known now (no primary answered)".to_owned(),
                    )),
                }
            }
            PositionOp::SetMin(v) if self.reads.set_min_position(v) => {
                backend_msg::command_complete(&mut out, "SET");
                None
            }
            PositionOp::SetMin(v) => Some(("22023", format!(
                "invalid value for parameter \"fulcrum.min_position\": \"{v}\"; expected a WAL position such as 0/3062A10 (SHOW fulcrum.position)"
            ))),
        };
        self.answer_local(out, error, total);
        PositionAnswer::Answered
    }

    /// Answers `SET/RESET/SHOW fulcrum.consistency` itself, when nothing is
    /// in flight; true when the frame at the front of the buffer (length
    /// `total`) was one.
    pub(super) fn try_answer_setting(&mut self, total: usize) -> bool {
        if self.owed.ready > 0 || !self.owed.expect.is_empty() || self.owed.unsynced {
            return false;
        }
        let Some(op) = statement(&self.client.read_buf[..total], &[b"set", b"reset", b"show"])
            .and_then(setting_op)
        else {
            return false;
        };
        let mut out = bytes::BytesMut::new();
        let error = match self.reads.setting(op) {
            SettingAnswer::Set => {
                backend_msg::command_complete(&mut out, "SET");
                None
            }
            SettingAnswer::Reset => {
                backend_msg::command_complete(&mut out, "RESET");
                None
            }
            SettingAnswer::Show(name) => {
                backend_msg::one_text_row(&mut out, SETTING, name);
                backend_msg::command_complete(&mut out, "SHOW");
                None
            }
            SettingAnswer::Invalid { names, .. } => Some((
                "22023",
                format!("invalid value for parameter \"{SETTING}\"; available values: {names}"),
            )),
        };
        self.answer_local(out, error, total);
        true
    }

    /// Queues Fulcrum's own answer to the `total`-byte frame at the front
    /// of the client buffer (its rows in `out`, or an error), then
    /// ReadyForQuery, and consumes the frame.
    fn answer_local(&mut self, out: bytes::BytesMut, error: Option<(&str, String)>, total: usize) {
        let write = &mut self.client.write_buf;
        match error {
            None => write.extend_from_slice(&out),
            Some((code, msg)) => {
                backend_msg::error_response(write, "ERROR", code, &msg);
                if self.status == b'T' {
                    self.status = b'E';
                }
            }
        }
        backend_msg::ready_for_query(write, self.status);
        let _ = self.client.read_buf.split_to(total);
    }
}

/// What `try_answer_position` did with the frame at the front.
pub(super) enum PositionAnswer {
    /// Not a causal-token statement.
    No,
    /// Answered (the frame is consumed).
    Answered,
    /// Earlier work is still owed an answer: kept until it has one.
    Hold,
}

/// The text of a simple Query `frame` whose first word is one of `words`.
fn statement<'a>(frame: &'a [u8], words: &[&[u8]]) -> Option<&'a str> {
    let text = query_text(frame.get(5..)?)?;
    let first = fulcrum_sql::statements::first_word(text);
    if !words.iter().any(|w| first.eq_ignore_ascii_case(w)) {
        return None;
    }
    std::str::from_utf8(text).ok()
}

/// The primary's position as of now, on a connection from the client's own
/// pool to the primary, returned at once.
async fn primary_position(
    ctx: &ClusterContext,
    user: &Arc<str>,
    database: &Arc<str>,
) -> Option<u64> {
    let primary = ctx.router.primary()?;
    ctx.metrics.position_queries.inc();
    let pool = ctx.pool(primary, user, database);
    let mut conn = pool.get(|| ctx.open(primary, user, database)).await.ok()?;
    let lsn = single_lsn(&mut conn, POSITION_SQL).await;
    match lsn {
        Some(_) => conn.release(),
        None => conn.discard(),
    }
    lsn
}

/// Runs a query answering one LSN on `conn`.
async fn single_lsn(conn: &mut Checkout<ServerConn>, sql: &str) -> Option<u64> {
    let rows = conn.query_rows(sql).await.ok()?;
    let text = rows.first()?.first()?.as_deref()?;
    fulcrum_cluster::lag::parse_lsn(text)
}
