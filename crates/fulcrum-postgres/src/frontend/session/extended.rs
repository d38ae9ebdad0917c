//! The extended protocol under transaction pooling: client statement names
//! mapped to shared server-side statements (prepared where missing,
//! renewed when stale), and the session ops of prepared SETs.

use super::*;

/// Portals whose digest a session remembers before it starts afresh.
const PORTAL_DIGESTS_MAX: usize = 64;

impl Session {
    pub(super) fn on_parse(&mut self, mut frame: BytesMut) {
        self.owed.unsynced = true;
        let mut rewritten = false;
        if self.stmts.rewrite {
            // `SELECT pg_backend_pid()`: the pid the client was given;
            // `pg_terminate_backend($1)`: answerable for Fulcrum's clients.
            if let Some(own) = signal::backend_pid_parse(&frame, self.id.cancel.process_id) {
                frame = own;
                rewritten = true;
            }
            let name = parse_msg(&frame[5..]).map(|p| p.name.to_vec());
            match (signal::signal_parse(&frame), name) {
                (Some((signal, terminate)), Some(name)) => {
                    frame = signal;
                    rewritten = true;
                    self.stmts.signals.insert(name, terminate);
                }
                (None, Some(name)) if !self.stmts.signals.is_empty() => {
                    self.stmts.signals.remove(&name);
                }
                _ => {}
            }
        }
        if parse_msg(&frame[5..]).is_some_and(|p| may_commit(p.query)) {
            self.engine.commit_sent();
        }
        // The result cache classified the Parse at the front (of the text
        // the client sent: not one rewritten above).
        let looked_up = self.parse_unit.take().filter(|_| !rewritten);
        let unit = match looked_up {
            Some(unit) => unit,
            None => parse_msg(&frame[5..]).map_or_else(
                || Arc::new(Classified::from(Decision::Write)),
                |p| self.ctx.classify_bytes(p.query),
            ),
        };
        if self.virtual_parse(&frame, unit.decision) {
            return;
        }
        let decision = self.note_parse(&frame, &unit);
        let parsed = if self.stmts.rewrite {
            parse_msg(&frame[5..])
        } else {
            None
        };
        if parsed.as_ref().is_none_or(|p| p.name.is_empty()) {
            self.stmts.unnamed_decision = decision;
        }
        let Some(p) = parsed.filter(|p| !p.name.is_empty()) else {
            if self.stmts.rewrite && parse_msg(&frame[5..]).is_some() {
                // Kept to be prepared again where a later Bind of it goes
                // without a Parse (`ensure_unnamed`).
                self.stmts.unnamed.clear();
                self.stmts.unnamed.extend_from_slice(&frame);
                self.stmts.unnamed_sent = true;
                self.stmts.unnamed_writes = unit.cache.writes.clone();
            }
            self.to_server.extend_from_slice(&frame);
            self.owed.expect.push(Expect::Parse(None));
            return;
        };
        let stmt = self
            .ctx
            .statements
            .statement(p.definition, p.query, decision);
        let name = p.name.to_vec();
        let server = self.server.as_mut().expect("attached");
        if server.prepared.use_if_present(&stmt.server_name) {
            let mut reply = BytesMut::with_capacity(5);
            backend_msg::parse_complete(&mut reply);
            self.owed.expect.push(Expect::Synthetic(reply.freeze()));
        } else {
            self.make_room_for_a_statement();
            let server = self.server.as_mut().expect("attached");
            server.prepared.insert_pending(stmt.server_name.clone());
            self.to_server.extend_from_slice(&stmt.parse);
            self.owed
                .expect
                .push(Expect::Parse(Some(stmt.server_name.clone())));
        }
        self.stmts.map.insert(name, stmt);
    }

    /// What the statement a Parse (`frame`, classified `unit`) names is:
    /// its routing decision (the function catalog's answer as of now; a
    /// function not known yet: the primary), its pin, session ops and
    /// digest. A Parse forwarded and one the result cache answered alike.
    pub(super) fn note_parse(&mut self, frame: &[u8], unit: &Classified) -> Decision {
        let decision = self
            .ctx
            .catalog_decision(unit, &self.id.user, &self.id.database);
        if let Decision::Pin(reason) = decision {
            self.pin(reason);
        }
        if !unit.effects.is_empty() || !self.stmts.ops.is_empty() {
            self.track_statement_ops(frame, unit);
        }
        self.track_statement_digest(frame, unit);
        decision
    }

    /// A unit opening with the unnamed statement's Parse (its first
    /// `parse_len` bytes, classified `unit`) is answered from the result
    /// cache: the statement is the client's unnamed one now, on no server,
    /// prepared where a later Bind of it without a Parse goes.
    pub(super) fn unnamed_answered(&mut self, parse_len: usize, unit: &Classified) {
        let mut frame = std::mem::take(&mut self.stmts.unnamed);
        frame.clear();
        frame.extend_from_slice(&self.client.read_buf[..parse_len]);
        self.stmts.unnamed_decision = self.note_parse(&frame, unit);
        self.stmts.unnamed = frame;
        self.stmts.unnamed_writes = unit.cache.writes.clone();
        self.stmts.unnamed_sent = false;
    }

    /// A Bind or Describe of the unnamed statement with no Parse of it sent
    /// on this connection since the last Sync: the client's unnamed
    /// statement is prepared first, its ParseComplete not shown. The
    /// connection may not be the one it was parsed on (transaction
    /// pooling), or the result cache answered its Parse on none.
    fn ensure_unnamed(&mut self) {
        if self.stmts.unnamed_sent || self.stmts.unnamed.is_empty() {
            return;
        }
        self.to_server.extend_from_slice(&self.stmts.unnamed);
        self.owed.expect.push(Expect::SwallowParse(None));
        self.stmts.unnamed_sent = true;
    }

    /// Digest statistics: the digest of the statement a Parse names (by
    /// the classifier's fingerprint, `unit`'s, when it has one: the text is
    /// not read again).
    pub(super) fn track_statement_digest(&mut self, frame: &[u8], unit: &Classified) {
        let max = self.ctx.config.digests.max_entries;
        if max == 0 {
            return;
        }
        let Some(p) = parse_msg(&frame[5..]) else {
            return;
        };
        let now = self.engine.now();
        let memo = &mut self.stmts.last_digest;
        let digest = self.ctx.digest_entry_of(unit.key, p.query, now, memo);
        match (digest, self.stmts.digests.get_mut(p.name)) {
            (Some(d), Some(slot)) => *slot = d,
            (Some(d), None) => {
                self.stmts.digests.insert(p.name.to_vec(), d);
            }
            (None, _) => {
                self.stmts.digests.remove(p.name);
            }
        }
    }

    /// Digest statistics: a stamp for an Execute of the portal `body` names.
    pub(super) fn execute_stamp(&mut self, body: &[u8]) -> Option<fulcrum_metrics::Stamp> {
        if self.stmts.portal_digests.is_empty() {
            return None;
        }
        let portal = body.split(|&b| b == 0).next().unwrap_or_default();
        let digest = self.stmts.portal_digests.get(portal)?.clone();
        let primary = self.ctx.router.is_primary(self.backend);
        Some(fulcrum_metrics::Stamp::new(
            digest,
            self.engine.now(),
            primary,
        ))
    }

    /// Remembers the session ops of a prepared statement (or forgets a
    /// name reused): whatever its decision, a statement with a session
    /// effect (a SET, a `set_config`, a pin) is tracked, never dropped.
    pub(super) fn track_statement_ops(&mut self, frame: &[u8], unit: &Classified) {
        let Some(p) = parse_msg(&frame[5..]) else {
            return;
        };
        let mut ops = Vec::new();
        for effect in unit.effects.iter() {
            match effect {
                Effect::Pin(reason) => self.pin(reason),
                Effect::Set { .. }
                | Effect::SetParam { .. }
                | Effect::ResetBeforeReuse(_)
                | Effect::Notifies
                | Effect::Reset { .. }
                | Effect::ResetAll
                | Effect::DiscardAll
                | Effect::Unlisten(_) => ops.push(effect.clone()),
                Effect::Deallocate(_) | Effect::Begin | Effect::Commit | Effect::Rollback => {}
            }
        }
        if ops.is_empty() {
            self.stmts.ops.remove(p.name);
        } else {
            self.stmts.ops.insert(p.name.to_vec(), ops);
        }
    }

    /// The ops an Execute of `portal` will apply when it completes.
    pub(super) fn execute_ops(&self, body: &[u8]) -> Vec<Effect> {
        if self.stmts.portal_ops.is_empty() {
            return Vec::new();
        }
        let portal = body.split(|&b| b == 0).next().unwrap_or_default();
        self.stmts
            .portal_ops
            .get(portal)
            .cloned()
            .unwrap_or_default()
    }

    /// The shared statement `server_name` went stale on the servers: the
    /// client's statements using it move to a fresh server-side name, so
    /// their next use prepares them again (on this and every connection).
    pub(super) fn renew_statement(&mut self, server_name: &str) {
        for stmt in self.stmts.map.values_mut() {
            if &*stmt.server_name == server_name {
                *stmt = self.ctx.statements.renew(stmt);
            }
        }
    }

    /// Makes sure the attached server has the client's statement `name`,
    /// injecting its Parse when not; returns the server-side name.
    pub(super) fn ensure_prepared(&mut self, name: &[u8]) -> Option<Arc<str>> {
        let mut stmt = self.stmts.map.get(name)?.clone();
        if stmt.generation != self.ctx.statements.generation() {
            // DDL ran since it was named: prepare it afresh under a new name.
            stmt = self.ctx.statements.current(&stmt);
            self.stmts.map.insert(name.to_vec(), stmt.clone());
        }
        self.prepare_on_server(&stmt);
        Some(stmt.server_name.clone())
    }

    /// Makes sure the attached server has the shared statement `stmt`,
    /// injecting its Parse (room made first) when not.
    pub(super) fn prepare_on_server(&mut self, stmt: &ClientStatement) {
        let server = self.server.as_mut().expect("attached");
        if !server.prepared.use_if_present(&stmt.server_name) {
            self.make_room_for_a_statement();
            let server = self.server.as_mut().expect("attached");
            server.prepared.insert_pending(stmt.server_name.clone());
            self.to_server.extend_from_slice(&stmt.parse);
            self.owed
                .expect
                .push(Expect::SwallowParse(Some(stmt.server_name.clone())));
        }
    }

    /// At `max_prepared_statements` on the attached connection, closes the
    /// least recently used shared statements no part of this unit uses; a
    /// client that uses one later has it prepared again.
    fn make_room_for_a_statement(&mut self) {
        let max = self.ctx.config.max_prepared_statements as usize;
        let server = self.server.as_mut().expect("attached");
        for name in server.prepared.evict_for_one(max) {
            put_target(&mut self.to_server, b'C', b'S', name.as_bytes());
            self.owed.expect.push(Expect::SwallowClose);
        }
    }

    pub(super) fn on_bind(&mut self, mut frame: BytesMut) {
        self.owed.unsynced = true;
        if !self.stmts.signals.is_empty() {
            frame = self.bind_signal(frame);
        }
        if self.listen.is_some() && self.virtual_bind(&frame) {
            return;
        }
        // A statement prepared earlier (pgbench -M prepared, JDBC, ...)
        // is only bound and executed: a COMMIT among them must be known
        // to be in flight, or a lost server would replay a transaction
        // that may have committed, and apply it twice.
        if let Some(b) = bind_msg(&frame[5..]) {
            let commits = if b.statement.is_empty() {
                false // the unnamed statement: its Parse said so
            } else {
                self.stmts
                    .map
                    .get(b.statement)
                    .is_some_and(|s| s.may_commit)
            };
            if commits {
                self.engine.commit_sent();
            }
            let decision = if b.statement.is_empty() {
                self.stmts.unnamed_decision
            } else {
                self.stmts
                    .map
                    .get(b.statement)
                    .map_or(Decision::Unknown, |s| s.decision)
            };
            self.txn.unit_writes |= may_write(decision);
            if self.ctx.cache.is_some() && may_write(decision) {
                self.cache_bind_writes(&frame);
            }
        }
        if !self.stmts.digests.is_empty() {
            if let Some(b) = bind_msg(&frame[5..]) {
                match self.stmts.digests.get(b.statement) {
                    Some(d) => {
                        if self.stmts.portal_digests.len() >= PORTAL_DIGESTS_MAX {
                            // Named portals end with their transaction;
                            // the map only has to stay bounded.
                            self.stmts.portal_digests.clear();
                        }
                        let d = d.clone();
                        match self.stmts.portal_digests.get_mut(b.portal) {
                            Some(slot) => *slot = d,
                            None => {
                                self.stmts.portal_digests.insert(b.portal.to_vec(), d);
                            }
                        }
                    }
                    None => {
                        self.stmts.portal_digests.remove(b.portal);
                    }
                }
            }
        }
        if !self.stmts.ops.is_empty() || !self.stmts.portal_ops.is_empty() {
            if let Some(b) = bind_msg(&frame[5..]) {
                match self.stmts.ops.get(b.statement) {
                    Some(ops) => {
                        let ops = match bound_ops(ops, b.rest) {
                            Some(ops) => ops,
                            None => {
                                // A bound value Fulcrum cannot read as text.
                                self.pin("set_config");
                                Vec::new()
                            }
                        };
                        self.stmts.portal_ops.insert(b.portal.to_vec(), ops);
                    }
                    None => {
                        self.stmts.portal_ops.remove(b.portal);
                    }
                }
            }
        }
        if self.stmts.rewrite {
            if let Some(b) = bind_msg(&frame[5..]).filter(|b| !b.statement.is_empty()) {
                if let Some(server_name) = self.ensure_prepared(b.statement) {
                    put_bind(
                        &mut self.to_server,
                        b.portal,
                        server_name.as_bytes(),
                        b.rest,
                    );
                    self.owed.expect.push(Expect::Bind(Some(server_name)));
                    return;
                }
            }
        }
        if self.stmts.rewrite && bind_msg(&frame[5..]).is_some_and(|b| b.statement.is_empty()) {
            self.ensure_unnamed();
        }
        self.to_server.extend_from_slice(&frame);
        self.owed.expect.push(Expect::Bind(None));
    }

    pub(super) fn on_describe_or_close(&mut self, tag: u8, frame: BytesMut) {
        self.owed.unsynced = true;
        if self.listen.is_some() && self.virtual_target(tag, &frame) {
            return;
        }
        let target = if self.stmts.rewrite {
            target_msg(&frame[5..])
        } else {
            None
        };
        match target {
            Some((b'S', name)) if !name.is_empty() && self.stmts.map.contains_key(name) => {
                let name = name.to_vec();
                if tag == b'C' {
                    // The shared server-side statement stays; the client's name goes.
                    self.stmts.map.remove(&name);
                    self.stmts.digests.remove(&name);
                    let mut reply = BytesMut::with_capacity(5);
                    backend_msg::close_complete(&mut reply);
                    self.owed.expect.push(Expect::Synthetic(reply.freeze()));
                } else if let Some(server_name) = self.ensure_prepared(&name) {
                    put_target(&mut self.to_server, b'D', b'S', server_name.as_bytes());
                    self.owed
                        .expect
                        .push(Expect::Describe(Some(server_name), b'S'));
                }
            }
            other => {
                if tag == b'D' && other == Some((b'S', &b""[..])) {
                    self.ensure_unnamed();
                }
                let kind = frame.get(5).copied().unwrap_or(b'P');
                self.to_server.extend_from_slice(&frame);
                self.owed.expect.push(if tag == b'D' {
                    Expect::Describe(None, kind)
                } else {
                    Expect::Close
                });
            }
        }
    }
}

/// `ops` with each bound `set_config` made the `SET` (or, for a NULL
/// value, the `RESET`) its Bind's parameter says; `rest` is the Bind after
/// the statement name. `None` when a value cannot be read as text.
fn bound_ops(ops: &[Effect], rest: &[u8]) -> Option<Vec<Effect>> {
    if !ops.iter().any(|e| matches!(e, Effect::SetParam { .. })) {
        return Some(ops.to_vec());
    }
    ops.iter()
        .map(|op| match op {
            Effect::SetParam { name, param } => {
                match crate::codec::frontend_msg::bind_param(rest, *param)? {
                    None => {
                        let (key, _) = fulcrum_sql::set_config_statement(name, "")?;
                        Some(Effect::Reset { key })
                    }
                    Some(value) => {
                        let value = std::str::from_utf8(value).ok()?;
                        let (key, stmt) = fulcrum_sql::set_config_statement(name, value)?;
                        Some(Effect::Set { key, stmt })
                    }
                }
            }
            other => Some(other.clone()),
        })
        .collect()
}
