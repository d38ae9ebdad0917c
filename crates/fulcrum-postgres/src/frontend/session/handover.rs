//! A binary upgrade's hand-over of this client (`fulcrum_cluster::handover`),
//! PostgreSQL's part: at a transaction boundary, the session's snapshot
//! (who the client logs in as, its cancel key, its startup parameters and
//! settings, its prepared statements by name with their definitions, its
//! last unnamed Parse, its LISTEN channels, its read consistency and
//! causal position), and the session resumed from one in the new process.
//! The client sees nothing: no welcome, the same cancel key, the same
//! statements and settings; its next statement runs there. A TLS client
//! or a pinned one stays (it cannot move, or it holds server state).

use fulcrum_cluster::handover::wire::{Fields, Reader};
use fulcrum_cluster::handover::{self, ClientHead};
use fulcrum_config::Consistency;
use fulcrum_pool::Need;
use fulcrum_sql::listen::ListenStatement;

use super::*;

/// The snapshot's layout; a new process reading another is refused.
const VERSION: u64 = 1;

/// A client's session as a binary upgrade carries it (the snapshot read).
pub(crate) struct HandedOver {
    pub pool_user: String,
    pub cancel: (i32, i32),
    pub startup: SessionParams,
    desired: SessionParams,
    /// (client name, definition: query text and parameter types, how it
    /// routed there: [`route_code`]).
    statements: Vec<(Vec<u8>, Vec<u8>, u64)>,
    /// `pg_terminate_backend($1)` (true) / `pg_cancel_backend($1)` statements.
    signals: Vec<(Vec<u8>, bool)>,
    unnamed: Vec<u8>,
    unnamed_route: u64,
    channels: Vec<String>,
    consistency: String,
    need: Need<u64>,
}

fn put_map(f: &mut Fields, map: &SessionParams) {
    f.number(map.len() as u64);
    for (k, v) in map {
        f.text(k).text(v);
    }
}

fn read_map(r: &mut Reader<'_>) -> Option<SessionParams> {
    let n = r.number()?;
    let mut map = SessionParams::new();
    for _ in 0..n {
        map.insert(r.text()?.to_owned(), r.text()?.to_owned());
    }
    Some(map)
}

impl HandedOver {
    /// Reads a snapshot [`Session::snapshot`] wrote.
    pub(crate) fn read(snapshot: &[u8]) -> Option<HandedOver> {
        let mut r = Reader::new(snapshot);
        if r.number()? != VERSION {
            return None;
        }
        let pool_user = r.text()?.to_owned();
        let cancel = (r.number()? as u32 as i32, r.number()? as u32 as i32);
        let startup = read_map(&mut r)?;
        let desired = read_map(&mut r)?;
        let mut statements = Vec::new();
        for _ in 0..r.number()? {
            statements.push((r.bytes()?.to_vec(), r.bytes()?.to_vec(), r.number()?));
        }
        let mut signals = Vec::new();
        for _ in 0..r.number()? {
            signals.push((r.bytes()?.to_vec(), r.number()? != 0));
        }
        let unnamed = r.bytes()?.to_vec();
        let unnamed_route = r.number()?;
        let mut channels = Vec::new();
        for _ in 0..r.number()? {
            channels.push(r.text()?.to_owned());
        }
        let consistency = r.text()?.to_owned();
        let need = match r.number()? {
            0 => Need::Nothing,
            1 => Need::At(r.number()?),
            _ => Need::Unknown,
        };
        r.at_end().then_some(HandedOver {
            pool_user,
            cancel,
            startup,
            desired,
            statements,
            signals,
            unnamed,
            unnamed_route,
            channels,
            consistency,
            need,
        })
    }
}

impl Session {
    /// At a transaction boundary, an upgrade asked this client to move:
    /// true when it is the new process's now (the session ends here
    /// without a word to it); false when it stays (TLS, pinned, or the
    /// hand-over failed), recorded on its entry.
    pub(super) async fn try_hand_over(&mut self) -> Result<bool, SessionError> {
        let Some(sink) = handover::sink() else {
            return Ok(false);
        };
        let entry = self.id.entry.clone_entry();
        let pinned = self.engine.pinned().is_some() || !self.stmts.rewrite;
        if !sink.may_move(&entry, self.client.stream().movable_socket(), pinned) {
            return Ok(false);
        }
        // Between units the connection goes back (transaction pooling).
        self.detach();
        // What is queued for the client goes out first: answers and the
        // notifications that came meanwhile.
        if let Some(l) = self.listen.as_mut() {
            while let Some(n) = l.next_queued() {
                self.client.write_buf.extend_from_slice(&n);
            }
        }
        self.flush_client().await?;
        let head = ClientHead {
            protocol: "postgres".into(),
            cluster: self.ctx.config.name.clone(),
            user: self.id.user.to_string(),
            database: self.id.database.to_string(),
            peer: entry.peer.clone(),
            unix: self.client.stream().is_unix(),
            state: self.snapshot(),
        };
        let socket = self.client.stream().movable_socket().expect("checked");
        // Boxed: a rare path, kept out of every idle session's future.
        Ok(Box::pin(sink.hand_over(head, socket)).await)
    }

    /// The session as the new process takes it up (see [`HandedOver`]).
    fn snapshot(&self) -> Vec<u8> {
        let mut f = Fields::default();
        f.number(VERSION).text(&self.id.pool_user);
        f.number(self.id.cancel.process_id as u32 as u64);
        f.number(self.id.cancel.secret_key as u32 as u64);
        put_map(&mut f, &self.params.startup);
        put_map(&mut f, &self.params.desired);
        f.number(self.stmts.map.len() as u64);
        for (name, stmt) in &self.stmts.map {
            f.bytes(name)
                .bytes(stmt.definition())
                .number(route_code(stmt.decision));
        }
        f.number(self.stmts.signals.len() as u64);
        for (name, &terminate) in self.stmts.signals.iter() {
            f.bytes(name).number(terminate as u64);
        }
        f.bytes(&self.stmts.unnamed)
            .number(route_code(self.stmts.unnamed_decision));
        let channels = self
            .listen
            .as_ref()
            .map(|l| l.channels())
            .unwrap_or_default();
        f.number(channels.len() as u64);
        for c in &channels {
            f.text(c);
        }
        let (mode, need) = self.reads.carried();
        f.text(mode.name());
        match need {
            Need::Nothing => f.number(0),
            Need::At(p) => f.number(1).number(p),
            Need::Unknown => f.number(2),
        };
        f.into_bytes()
    }

    /// Takes up a handed-over client's session: settings, statements,
    /// LISTEN channels (listened to again before its first statement is
    /// read), read consistency.
    pub(crate) async fn resume_from(&mut self, carried: HandedOver) {
        // As at a login: the function catalog reads the database first (up
        // to `function_catalog_wait`), so the client's next statements are
        // not pinned for a call this process cannot prove yet.
        self.ctx
            .catalog_at_login(&self.id.pool_user, (0, 0), &self.id.database)
            .await;
        self.params.desired = Settings::new(carried.desired);
        for (name, definition, route) in carried.statements {
            let mut frame = BytesMut::new();
            crate::codec::frontend_msg::put_parse(&mut frame, &name, &definition);
            self.adopt_statement(&name, &frame, route);
        }
        self.stmts.signals.extend(carried.signals);
        if !carried.unnamed.is_empty() {
            let unit = parse_msg(&carried.unnamed[5..])
                .map_or(Classified::from(Decision::Write), |p| {
                    Arc::unwrap_or_clone(self.ctx.classify_bytes(p.query))
                });
            self.stmts.unnamed_decision = carried_route(carried.unnamed_route, &unit);
            self.stmts.unnamed_writes = unit.cache.writes.clone();
            self.stmts.unnamed = carried.unnamed;
            self.stmts.unnamed_sent = false;
        }
        for channel in carried.channels {
            let op = ListenStatement::Listen(channel.clone());
            if let Some((code, msg)) = self.apply_listen(&op).await {
                tracing::warn!(%channel, code, msg, "upgrade: a handed-over client's LISTEN could not be taken up");
            }
        }
        let mode = Consistency::from_name(&carried.consistency).unwrap_or(self.reads.session());
        self.reads.resume(mode, carried.need);
    }

    /// A named statement the client prepared on the old process: known
    /// here as it was there (its ops and digest noted as a Parse notes
    /// them, its route the old process's: this process's function catalog
    /// may not have read the database yet, and would pin a call the old one
    /// had proven), and prepared on a server connection at its first use,
    /// as after any Parse under transaction pooling.
    fn adopt_statement(&mut self, name: &[u8], frame: &[u8], route: u64) {
        let Some(p) = parse_msg(&frame[5..]) else {
            return;
        };
        let unit = Arc::unwrap_or_clone(self.ctx.classify_bytes(p.query));
        if !unit.effects.is_empty() || !self.stmts.ops.is_empty() {
            self.track_statement_ops(frame, &unit);
        }
        self.track_statement_digest(frame, &unit);
        let decision = carried_route(route, &unit);
        let stmt = self
            .ctx
            .statements
            .statement(p.definition, p.query, decision);
        self.stmts.bytes += name.len() + stmt.parse.len();
        self.stmts.map.insert(name.to_vec(), stmt);
    }
}

/// How a statement routed on the old process, where the function catalog
/// may have decided it: a read, a read on the primary, a write; anything
/// else is the classifier's alone (`ROUTE_AS_CLASSIFIED`).
fn route_code(decision: Decision) -> u64 {
    match decision {
        Decision::Read => 0,
        Decision::Primary => 1,
        Decision::Write => 2,
        _ => ROUTE_AS_CLASSIFIED,
    }
}

const ROUTE_AS_CLASSIFIED: u64 = 3;

/// [`route_code`] read back; the classifier's decision for the others.
fn carried_route(code: u64, unit: &Classified) -> Decision {
    match code {
        0 => Decision::Read,
        1 => Decision::Primary,
        2 => Decision::Write,
        _ => unit.decision,
    }
}
