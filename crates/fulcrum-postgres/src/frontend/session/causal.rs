//! Read consistency for a PostgreSQL session (docs/consistency.md).
//!
//! - After a unit that may have written ends on the primary (its
//!   ReadyForQuery 'I' is already on its way to the client), Fulcrum sends
//!   `SELECT pg_current_wal_insert_lsn()` on the same server connection and
//!   keeps the answer as the client's read position. The client does not wait
//!   for it; a statement it sends meanwhile follows on the same connection.
//! - Before a read runs on a replica that has not been seen past that
//!   position, the replica is asked `pg_last_wal_replay_lsn()` on the
//!   connection the read will use. Behind: wait (poll) up to
//!   `causal_timeout` or read on the primary, as `causal_wait` says.
//! - `strong` takes the position from the primary when the read starts.
//! - `/* fulcrum:consistency=... */` in a statement and
//!   `SET fulcrum.consistency = '...'` choose the mode per read and per session.
//! - `user` also publishes each position to the cluster's per (user,
//!   database) table, and a read takes the newest of its own and the table's.
//! - The causal token: `SHOW fulcrum.position` answers the position the
//!   session's reads respect (the primary's current one when it tracks none);
//!   `SET fulcrum.min_position = '...'` and `/* fulcrum:after=... */` make
//!   this session's reads respect another's.

use std::time::{Duration, Instant};

use fulcrum_config::Consistency;
use fulcrum_metrics::CausalOutcome;
use fulcrum_pool::{when_behind_now, BackendId, Checkout, Need, UserNeed, WhenBehind};

use super::Session;
use crate::backend::ServerConn;
use crate::codec::backend_msg;
use crate::codec::frontend_msg::{put_query, query_text};
use crate::frontend::expect::Expect;
use fulcrum_sql::consistency::{
    hinted, hinted_after, position_op, setting_op, PositionOp, SettingOp, SETTING,
};

/// The position a read must reach to see what was committed: the WAL
/// flush position, which every commit acknowledged under
/// `synchronous_commit` other than `off` is below; with `off` a commit is
/// acknowledged before its WAL is flushed, so the insert position is taken
/// (the replica then also waits for the walwriter's next flush).
const POSITION_SQL: &str = "SELECT (CASE WHEN current_setting('synchronous_commit') = 'off' \
     THEN pg_current_wal_insert_lsn() ELSE pg_current_wal_flush_lsn() END)::text";

/// Polling interval while a read waits for a replica to replay.
const POLL: Duration = Duration::from_millis(1);

/// What a replica check found.
pub(super) enum Check {
    /// The replica may serve the read.
    Serve,
    /// It is behind: read on the primary.
    Primary,
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

/// LSNs order as numbers.
fn newer(a: &u64, b: &u64) -> bool {
    a > b
}

impl Session {
    /// The consistency the unit being routed reads with.
    pub(super) fn read_consistency(&self) -> Consistency {
        self.unit_consistency.unwrap_or(self.consistency)
    }

    /// Notes the hint of the unit at the front of the client buffer.
    pub(super) fn note_hint(&mut self) {
        self.unit_consistency = None;
        if self.client.read_buf.len() < 5 {
            return;
        }
        let body = &self.client.read_buf[5..];
        let text = match self.client.read_buf[0] {
            b'Q' => query_text(body),
            b'P' => crate::codec::frontend_msg::parse_msg(body).map(|p| p.query),
            _ => None,
        };
        if let Some(text) = text {
            self.unit_consistency = hinted(text).and_then(Consistency::from_name);
            if let Some(p) = hinted_after(text).and_then(fulcrum_cluster::lag::parse_lsn) {
                self.causal.at_least(p, newer);
            }
        }
    }

    /// A unit on the primary that may have written is over (ReadyForQuery
    /// 'I', nothing else owed): ask the primary's position on the same
    /// connection, behind the answer the client already has.
    pub(super) fn after_unit(&mut self) {
        if !self.write_unit || self.pending_ready > 0 || self.unsynced {
            return;
        }
        self.write_unit = false;
        // With one backend every read is on the primary already: no
        // position to keep (a single-node cluster pays nothing).
        if !self.consistency.tracks_writes()
            || self.engine.pinned().is_some()
            || self.server.is_none()
            || self.ctx.router.backend_count() < 2
        {
            return;
        }
        // The client's unit is over now: count it before the connection is
        // held for Fulcrum's own query.
        self.record_unit();
        if self.consistency == Consistency::User {
            // Before the answer reaches the client: another connection of
            // the user reads on the primary until the position is known.
            self.ctx.user_positions.begin(
                &self.user,
                &self.database,
                self.ctx.config.causal_timeout,
            );
        }
        put_query(&mut self.to_server, POSITION_SQL);
        self.expect.push(Expect::Position);
    }

    /// The answer to the position query arrived.
    pub(super) fn on_position(&mut self, lsn: Option<u64>) {
        match lsn {
            Some(p) => {
                self.causal.wrote(p);
                if self.consistency == Consistency::User {
                    self.ctx
                        .user_positions
                        .advance(&self.user, &self.database, p, newer);
                }
            }
            None => {
                self.causal.wrote_unknown();
                if self.consistency == Consistency::User {
                    self.ctx.user_positions.abandon(&self.user, &self.database);
                }
            }
        }
    }

    /// May the replica `backend`, on connection `server`, serve the read
    /// being routed? Checks its replay position, waiting if the policy says
    /// so; counts the outcome.
    pub(super) async fn causal_check(
        &mut self,
        backend: BackendId,
        server: &mut Checkout<ServerConn>,
    ) -> Check {
        self.causal.note_primary(self.ctx.router.primary());
        if self.read_consistency() == Consistency::User {
            // Any connection of the user may have written since.
            match self.ctx.user_positions.get(&self.user, &self.database) {
                UserNeed::At(p) => self.causal.at_least(p, newer),
                UserNeed::Pending => {
                    self.ctx.metrics.causal(CausalOutcome::Primary);
                    return Check::Primary;
                }
                UserNeed::Nothing => {}
            }
        }
        let position = match self.read_consistency() {
            Consistency::Eventual => return Check::Serve,
            Consistency::Session | Consistency::User => match self.causal.position_for(backend) {
                Some(p) => *p,
                None if self.causal.need() == &Need::Unknown => return Check::Primary,
                None => {
                    if matches!(self.causal.need(), Need::At(_)) {
                        self.ctx.metrics.causal(CausalOutcome::Replica);
                    }
                    return Check::Serve;
                }
            },
            Consistency::Strong => match self.primary_position().await {
                Some(p) => p,
                None => return Check::Primary,
            },
        };
        let started = Instant::now();
        let mut waited = false;
        loop {
            let Some(replayed) = replay_position(server).await else {
                return Check::Primary;
            };
            if replayed >= position {
                if self.read_consistency().tracks_writes() {
                    self.causal.verified(backend);
                }
                self.ctx.metrics.causal(if waited {
                    CausalOutcome::Waited
                } else {
                    CausalOutcome::Replica
                });
                return Check::Serve;
            }
            if !waited {
                let choice = when_behind_now(
                    self.ctx.config.causal_wait.forced(),
                    &self.ctx.router,
                    self.ctx.config.pool_size as usize,
                );
                if choice == WhenBehind::Primary {
                    break;
                }
                waited = true;
            }
            if started.elapsed() + POLL > self.ctx.config.causal_timeout {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        self.ctx.metrics.causal(CausalOutcome::Primary);
        Check::Primary
    }

    /// `strong`: the primary's WAL insert position as of now, fetched once
    /// for all the reads asking at the same time (a fetch that started
    /// before this read asked is never used: `Coalesced`).
    async fn primary_position(&self) -> Option<u64> {
        self.ctx
            .primary_position
            .get(self.fetch_primary_position())
            .await
    }

    /// One fetch of the primary's position, on a connection from the
    /// client's own pool to the primary, returned at once.
    async fn fetch_primary_position(&self) -> Option<u64> {
        let primary = self.ctx.router.primary()?;
        self.ctx.metrics.position_queries.inc();
        let pool = self.ctx.pool(primary, &self.user, &self.database);
        let ctx = self.ctx.clone();
        let (user, database) = (self.user.clone(), self.database.clone());
        let mut conn = pool
            .get(|| async move { ctx.open(primary, &user, &database).await })
            .await
            .ok()?;
        let lsn = single_lsn(&mut conn, POSITION_SQL).await;
        match lsn {
            Some(_) => conn.release(),
            None => conn.discard(),
        }
        lsn
    }

    /// Answers the causal-token statements itself: `SHOW fulcrum.position`
    /// and `SET fulcrum.min_position = '...'`, once everything before them
    /// is answered (a position being learnt included).
    pub(super) async fn try_answer_position(&mut self, total: usize) -> PositionAnswer {
        let Some(text) = query_text(&self.client.read_buf[5..total]) else {
            return PositionAnswer::No;
        };
        let first = fulcrum_sql::statements::first_word(text);
        if !(first.eq_ignore_ascii_case(b"set") || first.eq_ignore_ascii_case(b"show")) {
            return PositionAnswer::No;
        }
        let Some(op) = std::str::from_utf8(text).ok().and_then(position_op) else {
            return PositionAnswer::No;
        };
        let op = match op {
            PositionOp::Show => None,
            PositionOp::SetMin(v) => {
                Some(fulcrum_cluster::lag::parse_lsn(v).ok_or_else(|| v.to_owned()))
            }
        };
        if self.unsynced {
            // Inside an unsynced extended-protocol batch: left to the server.
            return PositionAnswer::No;
        }
        if self.pending_ready > 0 || !self.expect.is_empty() {
            return PositionAnswer::Hold;
        }
        let mut out = bytes::BytesMut::new();
        match op {
            None => {
                let own = match self.causal.need() {
                    Need::At(p) if self.consistency.tracks_writes() => Some(*p),
                    _ => None,
                };
                let shared = match self.ctx.user_positions.get(&self.user, &self.database) {
                    UserNeed::At(p) if self.consistency == Consistency::User => Some(p),
                    _ => None,
                };
                let position = match own.into_iter().chain(shared).max() {
                    Some(p) => Some(p),
                    // Nothing tracked (eventual, or no write yet, or its
                    // position unknown): the primary's own position now,
                    // past every commit acknowledged so far.
                    None => self.fetch_primary_position().await,
                };
                match position {
                    Some(p) => {
                        backend_msg::one_text_row(
                            &mut out,
                            "fulcrum.position",
                            &fulcrum_cluster::lag::format_lsn(p),
                        );
                        backend_msg::command_complete(&mut out, "SHOW");
                    }
                    None => {
                        backend_msg::error_response(
                            &mut out,
                            "ERROR",
                            "57P03",
                            "fulcrum: the position is not known now (no primary answered)",
                        );
                        if self.status == b'T' {
                            self.status = b'E';
                        }
                    }
                }
            }
            Some(Ok(p)) => {
                self.causal.at_least(p, newer);
                backend_msg::command_complete(&mut out, "SET");
            }
            Some(Err(v)) => {
                backend_msg::error_response(
                    &mut out,
                    "ERROR",
                    "22023",
                    &format!(
                        "invalid value for parameter \"fulcrum.min_position\": \"{v}\"; expected a WAL position such as 0/3062A10 (SHOW fulcrum.position)"
                    ),
                );
                if self.status == b'T' {
                    self.status = b'E';
                }
            }
        }
        backend_msg::ready_for_query(&mut out, self.status);
        self.client.write_buf.extend_from_slice(&out);
        let _ = self.client.read_buf.split_to(total);
        PositionAnswer::Answered
    }

    /// Answers `SET/RESET/SHOW fulcrum.consistency` itself, when nothing is
    /// in flight; true when the frame at the front of the buffer (length
    /// `total`) was one.
    pub(super) fn try_answer_setting(&mut self, total: usize) -> bool {
        if self.pending_ready > 0 || !self.expect.is_empty() || self.unsynced {
            return false;
        }
        let Some(text) = query_text(&self.client.read_buf[5..total]) else {
            return false;
        };
        let first = fulcrum_sql::statements::first_word(text);
        if !(first.eq_ignore_ascii_case(b"set")
            || first.eq_ignore_ascii_case(b"reset")
            || first.eq_ignore_ascii_case(b"show"))
        {
            return false;
        }
        let Some(op) = std::str::from_utf8(text).ok().and_then(setting_op) else {
            return false;
        };
        let out = &mut self.client.write_buf;
        match op {
            SettingOp::Set(name) if Consistency::from_name(name).is_some() => {
                self.consistency = Consistency::from_name(name).unwrap_or(self.consistency);
                backend_msg::command_complete(out, "SET");
            }
            SettingOp::Set(_) => {
                let names: Vec<&str> = Consistency::NAMES.iter().map(|(n, _)| *n).collect();
                backend_msg::error_response(
                    out,
                    "ERROR",
                    "22023",
                    &format!(
                        "invalid value for parameter \"{SETTING}\"; available values: {}",
                        names.join(", ")
                    ),
                );
                if self.status == b'T' {
                    self.status = b'E';
                }
            }
            SettingOp::Reset => {
                self.consistency = self.ctx.config.consistency;
                backend_msg::command_complete(out, "RESET");
            }
            SettingOp::Show => {
                backend_msg::one_text_row(out, SETTING, self.consistency.name());
                backend_msg::command_complete(out, "SHOW");
            }
        }
        backend_msg::ready_for_query(out, self.status);
        let _ = self.client.read_buf.split_to(total);
        true
    }
}

/// `pg_last_wal_replay_lsn()` of the replica on `server`.
async fn replay_position(server: &mut Checkout<ServerConn>) -> Option<u64> {
    single_lsn(server, "SELECT pg_last_wal_replay_lsn()::text").await
}

/// Runs a query answering one LSN on `conn`.
async fn single_lsn(conn: &mut Checkout<ServerConn>, sql: &str) -> Option<u64> {
    let rows = conn.query_rows(sql).await.ok()?;
    let text = rows.first()?.first()?.as_deref()?;
    fulcrum_cluster::lag::parse_lsn(text)
}
