//! Read consistency for a MariaDB session (docs/consistency.md).
//!
//! - The client's position is the GTID the primary reports in the OK of a
//!   committed write (`last_gtid` session tracking, which Fulcrum turns on
//!   for its server connections). A client whose connector does not take
//!   session-state information gets its reads on the primary after a write.
//! - Before a read runs on a replica not yet seen past that GTID, Fulcrum
//!   runs `SELECT MASTER_GTID_WAIT(gtid, 0)` on the connection the read will
//!   use; behind, it waits (`MASTER_GTID_WAIT(gtid, causal_timeout)`) or
//!   reads on the primary, as `causal_wait` says.
//! - `strong` takes `@@gtid_binlog_pos` from the primary when the read starts.
//! - The hint and `SET/RESET/SHOW fulcrum.consistency` work as on PostgreSQL.
//! - `user` publishes each GTID to the cluster's per (user, schema) table; a
//!   read takes the newest of its own and the table's.
//! - The causal token: `SELECT @@fulcrum_position` answers the GTID the
//!   session's reads respect (the primary's `@@gtid_binlog_pos` when it
//!   tracks none); `SET @@fulcrum_min_position = '...'` and
//!   `/* fulcrum:after=... */` make this session's reads respect another's.

use fulcrum_config::Consistency;
use fulcrum_metrics::CausalOutcome;
use fulcrum_pool::{when_behind_now, BackendId, Checkout, Need, Route, UserNeed, WhenBehind};
use fulcrum_sql::consistency::{
    hinted, hinted_after, position_op, setting_op, PositionOp, SettingOp, SETTING,
};
use mysql_common::constants::CapabilityFlags as C;

use super::Session;
use crate::backend::ServerConn;
use crate::codec::packet::write_packet;
use crate::codec::response::build_eof;
use crate::codec::wire::{write_lenenc_int, write_lenenc_str};
use crate::frontend::wire::{put_err, put_ok};

/// ER_WRONG_VALUE_FOR_VAR.
const WRONG_VALUE_FOR_VAR: u16 = 1231;

/// A GTID list `domain-server-seq[,...]` as MariaDB writes it.
fn is_gtid_list(s: &str) -> bool {
    !s.is_empty()
        && s.split(',').all(|g| {
            let parts: Vec<&str> = g.trim().split('-').collect();
            parts.len() == 3
                && parts
                    .iter()
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// Whether GTID `a` is past `b`: a higher sequence number in the same
/// domain; another domain (or a list) replaces it (the newest report wins).
fn newer(a: &String, b: &String) -> bool {
    let split = |g: &str| -> Option<(u64, u64)> {
        let mut p = g.split('-');
        let domain = p.next()?.parse().ok()?;
        let _server = p.next()?;
        let seq = p.next()?.parse().ok()?;
        p.next().is_none().then_some((domain, seq))
    };
    match (split(a), split(b)) {
        (Some((da, sa)), Some((db, sb))) if da == db => sa > sb,
        _ => a != b,
    }
}

impl Session {
    /// The consistency the read being routed uses.
    pub(super) fn read_consistency(&self) -> Consistency {
        self.unit_consistency.unwrap_or(self.consistency)
    }

    /// Notes the hint of the COM_QUERY about to be routed.
    pub(super) fn note_hint(&mut self, text: &str) {
        self.unit_consistency = hinted(text.as_bytes()).and_then(Consistency::from_name);
        if let Some(g) = hinted_after(text.as_bytes()).filter(|g| is_gtid_list(g)) {
            self.causal.at_least(g.to_owned(), newer);
        }
    }

    /// The client's write committed at `gtid`: its own position, and under
    /// `user` its user's.
    fn wrote(&mut self, gtid: String) {
        if self.consistency == Consistency::User {
            self.ctx
                .user_positions
                .advance(&self.user, &self.schema_key(), gtid.clone(), newer);
        }
        self.causal.wrote(gtid);
    }

    /// The schema the user positions are kept under.
    fn schema_key(&self) -> std::sync::Arc<str> {
        self.schema.as_deref().unwrap_or("").into()
    }

    /// After an answer from the primary: the GTID of a write it committed.
    /// A connection that cannot report it in the OK (the client's connector
    /// takes no session-state information) is asked `@@last_gtid` once the
    /// client has its answer; if that fails, the client's reads go to the
    /// primary until its next write.
    pub(super) async fn after_primary_answer(
        &mut self,
        last_gtid: Option<String>,
        route: Route,
    ) -> Result<(), crate::frontend::error::SessionError> {
        if !self.ctx.router.is_primary(self.backend) {
            return Ok(());
        }
        if let Some(g) = last_gtid {
            self.wrote(g);
            return Ok(());
        }
        let Some(server) = self.server.as_ref() else {
            return Ok(());
        };
        let in_txn = self
            .status
            .contains(mysql_common::constants::StatusFlags::SERVER_STATUS_IN_TRANS);
        // With one backend every read is on the primary already: no GTID
        // to fetch (a single-node cluster pays nothing).
        if server.track_gtid
            || self.ctx.router.backend_count() < 2
            || route != Route::Primary
            || in_txn
            || !self.consistency.tracks_writes()
        {
            return Ok(());
        }
        let user_mode = self.consistency == Consistency::User;
        if user_mode {
            // The answer goes out before its GTID is known: another
            // connection of the user reads on the primary meanwhile.
            self.ctx.user_positions.begin(
                &self.user,
                &self.schema_key(),
                self.ctx.config.causal_timeout,
            );
        }
        self.flush().await?;
        let server = self.server.as_mut().expect("attached");
        match server.query_value("SELECT @@last_gtid").await {
            Ok(Some(g)) if !g.is_empty() => {
                if self.causal.need() != &Need::At(g.clone()) {
                    self.wrote(g);
                } else if user_mode {
                    self.ctx
                        .user_positions
                        .abandon(&self.user, &self.schema_key());
                }
            }
            Ok(_) => {
                if user_mode {
                    self.ctx
                        .user_positions
                        .abandon(&self.user, &self.schema_key());
                }
            }
            Err(_) => {
                self.causal.wrote_unknown();
                if user_mode {
                    self.ctx
                        .user_positions
                        .abandon(&self.user, &self.schema_key());
                }
            }
        }
        Ok(())
    }

    /// May the replica `backend`, on `server`, serve the read being routed?
    pub(super) async fn causal_ok(
        &mut self,
        backend: BackendId,
        server: &mut Checkout<ServerConn>,
    ) -> bool {
        self.causal.note_primary(self.ctx.router.primary());
        if self.read_consistency() == Consistency::User {
            // Any connection of the user may have written since.
            match self.ctx.user_positions.get(&self.user, &self.schema_key()) {
                UserNeed::At(g) => self.causal.at_least(g, newer),
                UserNeed::Pending => {
                    self.ctx.metrics.causal(CausalOutcome::Primary);
                    return false;
                }
                UserNeed::Nothing => {}
            }
        }
        let gtid = match self.read_consistency() {
            Consistency::Eventual => return true,
            Consistency::Session | Consistency::User => match self.causal.position_for(backend) {
                Some(g) => g.clone(),
                None if self.causal.need() == &Need::Unknown => return false,
                None => {
                    if matches!(self.causal.need(), Need::At(_)) {
                        self.ctx.metrics.causal(CausalOutcome::Replica);
                    }
                    return true;
                }
            },
            Consistency::Strong => match self.primary_position().await {
                Some(g) if g.is_empty() => return true,
                Some(g) => g,
                None => return false,
            },
        };
        if gtid_wait(server, &gtid, 0.0).await {
            self.reached(backend, CausalOutcome::Replica);
            return true;
        }
        let choice = when_behind_now(
            self.ctx.config.causal_wait.forced(),
            &self.ctx.router,
            self.ctx.config.pool_size as usize,
        );
        if choice == WhenBehind::Wait {
            let secs = self.ctx.config.causal_timeout.as_secs_f64();
            if gtid_wait(server, &gtid, secs).await {
                self.reached(backend, CausalOutcome::Waited);
                return true;
            }
        }
        self.ctx.metrics.causal(CausalOutcome::Primary);
        false
    }

    fn reached(&mut self, backend: BackendId, outcome: CausalOutcome) {
        if self.read_consistency().tracks_writes() {
            self.causal.verified(backend);
        }
        self.ctx.metrics.causal(outcome);
    }

    /// `strong`: the primary's `@@gtid_binlog_pos` as of now, fetched once
    /// for all the reads asking at the same time (a fetch that started
    /// before this read asked is never used: `Coalesced`).
    async fn primary_position(&self) -> Option<String> {
        self.ctx
            .primary_position
            .get(self.fetch_primary_position())
            .await
    }

    /// One fetch of `@@gtid_binlog_pos` on a connection to the primary.
    async fn fetch_primary_position(&self) -> Option<String> {
        let primary = self.ctx.router.primary()?;
        self.ctx.metrics.position_queries.inc();
        let mut conn = self.checkout(primary).await.ok()?;
        match conn.query_value("SELECT @@gtid_binlog_pos").await {
            Ok(v) => {
                conn.release();
                Some(v.unwrap_or_default())
            }
            Err(_) => {
                conn.discard();
                None
            }
        }
    }

    /// Answers `SET/RESET/SHOW fulcrum.consistency`; true when `text` was one.
    /// Answers the causal-token statements itself: `SELECT @@fulcrum_position`
    /// and `SET @@fulcrum_min_position = '...'`; true when `text` was one.
    pub(super) async fn try_answer_position(&mut self, text: &str, seq: u8) -> bool {
        let first = text.split_whitespace().next().unwrap_or("");
        if !(first.eq_ignore_ascii_case("select") || first.eq_ignore_ascii_case("set")) {
            return false;
        }
        let Some(op) = position_op(text) else {
            return false;
        };
        match op {
            PositionOp::Show => {
                let own = match self.causal.need() {
                    Need::At(g) if self.consistency.tracks_writes() => Some(g.clone()),
                    _ => None,
                };
                let shared = match self.ctx.user_positions.get(&self.user, &self.schema_key()) {
                    UserNeed::At(g) if self.consistency == Consistency::User => Some(g),
                    _ => None,
                };
                let position = match (own, shared) {
                    (Some(a), Some(b)) => Some(if newer(&b, &a) { b } else { a }),
                    (a, b) => a.or(b),
                };
                // Nothing tracked: the primary's position now, past every
                // commit acknowledged so far.
                let position = match position {
                    Some(p) => Some(p),
                    None => self.fetch_primary_position().await,
                };
                match position {
                    Some(p) => put_one_row(
                        &mut self.client.write_buf,
                        seq,
                        self.caps,
                        self.status,
                        "@@fulcrum_position",
                        &p,
                    ),
                    None => put_err(
                        &mut self.client.write_buf,
                        seq,
                        crate::codec::err::codes::SERVER_SHUTDOWN.code,
                        *b"08S01",
                        "fulcrum: the position is not known now (no primary answered)",
                    ),
                }
            }
            PositionOp::SetMin(v) if is_gtid_list(v) => {
                self.causal.at_least(v.to_owned(), newer);
                put_ok(&mut self.client.write_buf, seq, self.caps, self.status);
            }
            PositionOp::SetMin(v) => {
                let msg = format!(
                    "Variable 'fulcrum_min_position' can't be set to the value of '{v}' (fulcrum: a GTID list such as 0-1-42, from SELECT @@fulcrum_position)"
                );
                put_err(
                    &mut self.client.write_buf,
                    seq,
                    WRONG_VALUE_FOR_VAR,
                    *b"42000",
                    &msg,
                );
            }
        }
        true
    }

    pub(super) fn try_answer_setting(&mut self, text: &str, seq: u8) -> bool {
        let first = text.split_whitespace().next().unwrap_or("");
        if !["set", "reset", "show"]
            .iter()
            .any(|w| first.eq_ignore_ascii_case(w))
        {
            return false;
        }
        let Some(op) = setting_op(text) else {
            return false;
        };
        match op {
            SettingOp::Set(name) => match Consistency::from_name(name) {
                Some(c) => {
                    self.consistency = c;
                    put_ok(&mut self.client.write_buf, seq, self.caps, self.status);
                }
                None => {
                    let names: Vec<&str> = Consistency::NAMES.iter().map(|(n, _)| *n).collect();
                    let msg = format!(
                        "Variable '{SETTING}' can't be set to the value of '{name}' (fulcrum: one of {})",
                        names.join(", ")
                    );
                    put_err(
                        &mut self.client.write_buf,
                        seq,
                        WRONG_VALUE_FOR_VAR,
                        *b"42000",
                        &msg,
                    );
                }
            },
            SettingOp::Reset => {
                self.consistency = self.ctx.config.consistency;
                put_ok(&mut self.client.write_buf, seq, self.caps, self.status);
            }
            SettingOp::Show => {
                put_one_row(
                    &mut self.client.write_buf,
                    seq,
                    self.caps,
                    self.status,
                    SETTING,
                    self.consistency.name(),
                );
            }
        }
        true
    }
}

/// `MASTER_GTID_WAIT(gtid, secs)` on `server`: true when the replica reached it.
async fn gtid_wait(server: &mut Checkout<ServerConn>, gtid: &str, secs: f64) -> bool {
    let sql = format!(
        "SELECT MASTER_GTID_WAIT('{}', {secs})",
        gtid.replace(['\'', '\\'], "")
    );
    matches!(server.query_value(&sql).await, Ok(Some(v)) if v == "0")
}

/// A text result set of one column `name` and one row `value`.
fn put_one_row(
    out: &mut bytes::BytesMut,
    seq: u8,
    caps: C,
    status: mysql_common::constants::StatusFlags,
    name: &str,
    value: &str,
) {
    let mut seq = seq;
    let mut next = || {
        let s = seq;
        seq = seq.wrapping_add(1);
        s
    };
    write_packet(out, next(), &[1]);
    let mut def = Vec::new();
    for part in ["def", "", "", "", name, name] {
        write_lenenc_str(&mut def, part.as_bytes());
    }
    write_lenenc_int(&mut def, 0x0c);
    def.extend_from_slice(&33u16.to_le_bytes()); // utf8_general_ci
    def.extend_from_slice(&1024u32.to_le_bytes());
    def.push(0xfd); // VAR_STRING
    def.extend_from_slice(&0u16.to_le_bytes());
    def.push(0);
    def.extend_from_slice(&[0, 0]);
    write_packet(out, next(), &def);
    let deprecate_eof = caps.contains(C::CLIENT_DEPRECATE_EOF);
    if !deprecate_eof {
        write_packet(out, next(), &build_eof(0, status));
    }
    let mut row = Vec::new();
    write_lenenc_str(&mut row, value.as_bytes());
    write_packet(out, next(), &row);
    if deprecate_eof {
        let ok = crate::codec::response::build_ok_as_eof(
            &crate::codec::response::OkPacket {
                status,
                ..Default::default()
            },
            caps,
        );
        write_packet(out, next(), &ok);
    } else {
        write_packet(out, next(), &build_eof(0, status));
    }
}
