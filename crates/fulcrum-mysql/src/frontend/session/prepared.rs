//! Prepared statements across server connections (transaction pooling). A
//! client's COM_STMT_PREPARE gets a Fulcrum statement id; the statement is
//! prepared on whichever server connection runs it, once per connection
//! (the server's answer is kept and replayed to the next client preparing
//! the same text there); COM_STMT_EXECUTE has its id rewritten, and the
//! parameter types the client bound are sent again where that connection
//! has not seen them. COM_STMT_CLOSE only forgets the client's id.

use std::sync::Arc;

use super::super::reply::{Reply, Shape};
use super::super::statements::{execute_flags, execute_types, with_types, ClientStmt};
use super::super::wire::{put_error, put_ok};
use super::{Effects, Session};
use crate::backend::conn::ServerStmt;
use crate::codec::command::{
    build_command, parse_prepare_ok, prepare_text, set_prepare_ok_statement_id, set_statement_id,
    statement_id, Command, LAST_PREPARED,
};
use crate::codec::err::codes;
use crate::codec::packet::{write_packet, HEADER_LEN, MAX_PAYLOAD};
use crate::frontend::error::SessionError;

/// What preparing on the attached server gave.
enum Prepared {
    Ready {
        id: u32,
    },
    /// The server refused; its ERR payload.
    Refused(Vec<u8>),
}

/// The COM_STMT_FETCH command byte.
const FETCH: u8 = 0x1C;

impl Session {
    /// COM_STMT_PREPARE.
    pub(super) async fn stmt_prepare(
        &mut self,
        payload: &[u8],
        seq: u8,
    ) -> Result<(), SessionError> {
        let max = self.ctx.config.max_client_prepared_statements;
        if self.prepared.map.len() >= max as usize {
            // The server's own answer to a session over max_prepared_stmt_count.
            let msg = format!(
                "Can't create more than max_prepared_stmt_count statements (current value: {max}); fulcrum: max_client_prepared_statements reached, close statements with COM_STMT_CLOSE"
            );
            put_error(
                &mut self.client.write_buf,
                seq,
                codes::MAX_PREPARED_STMT_COUNT,
                &msg,
            );
            return Ok(());
        }
        let sql: Arc<str> = match prepare_text(payload).and_then(|t| std::str::from_utf8(t).ok()) {
            Some(t) => t.into(),
            None => {
                put_error(
                    &mut self.client.write_buf,
                    seq,
                    codes::UNKNOWN,
                    "fulcrum: statement text is not UTF-8",
                );
                return Ok(());
            }
        };
        let decision = self.ctx.classify_for(
            &sql,
            &self.user,
            (self.hello.wire_format.bits(), self.hello.charset),
            self.schema.as_deref().unwrap_or(""),
        );
        let routing = self.route_unit(decision);
        if !self.ensure_attached(routing, seq).await? {
            return Ok(());
        }
        match self.ensure_prepared(&sql, seq).await? {
            Prepared::Refused(err) => {
                write_packet(&mut self.client.write_buf, seq, &err);
            }
            Prepared::Ready { .. } => {
                let server = self.server.as_ref().expect("attached");
                let mut answer = server.prepared[&sql].answer.clone();
                let num_params =
                    parse_prepare_ok(&answer[HEADER_LEN..]).map_or(0, |p| p.num_params);
                let id = self.prepared.next;
                self.prepared.next = self.prepared.next.wrapping_add(1).max(1);
                let _ = set_prepare_ok_statement_id(&mut answer[HEADER_LEN..], id);
                self.client.write_buf.extend_from_slice(&answer);
                let stmt = self.new_client_stmt(sql, num_params, decision, None);
                self.prepared.map.insert(id, stmt);
                self.prepared.last = Some(id);
            }
        }
        self.maybe_detach();
        Ok(())
    }

    /// A client statement as a prepare makes it (or a binary upgrade's
    /// hand-over remakes it): its digest, and whether it may commit, read
    /// from its text once.
    pub(super) fn new_client_stmt(
        &self,
        sql: Arc<str>,
        num_params: u16,
        decision: fulcrum_sql::Decision,
        types: Option<Arc<[u8]>>,
    ) -> ClientStmt {
        ClientStmt {
            digest: self.ctx.digests.entry(
                self.ctx.config.digests.max_entries,
                &sql,
                fulcrum_sql::Dialect::MySql,
            ),
            may_commit: fulcrum_session::txn::may_commit(sql.as_bytes()),
            sql,
            num_params,
            decision,
            types,
        }
    }

    /// At `max_prepared_statements` on the attached connection, closes the
    /// least recently used statements there (a tenth of the bound at once;
    /// COM_STMT_CLOSE has no answer); a client that uses one later has it
    /// prepared again. Not for a pinned client: a cursor may be open on one.
    async fn close_least_used_statements(&mut self) -> std::io::Result<()> {
        let max = self.ctx.config.max_prepared_statements as usize;
        let server = self.server.as_mut().expect("attached");
        if max == 0 || server.prepared.len() < max {
            return Ok(());
        }
        let want = server.prepared.len() + 1 - max + max / 10;
        let mut by_use: Vec<(u64, Arc<str>)> = server
            .prepared
            .iter()
            .map(|(sql, s)| (s.used, sql.clone()))
            .collect();
        by_use.sort_unstable_by_key(|(used, _)| *used);
        let mut out = bytes::BytesMut::new();
        for (_, sql) in by_use.into_iter().take(want) {
            if let Some(s) = server.prepared.remove(&sql) {
                write_packet(
                    &mut out,
                    0,
                    &build_command(Command::StmtClose, &s.id.to_le_bytes()),
                );
            }
        }
        server.io.send(&out).await
    }

    /// Prepares `sql` on the attached server unless it has it already.
    async fn ensure_prepared(&mut self, sql: &Arc<str>, seq: u8) -> Result<Prepared, SessionError> {
        let server = self.server.as_mut().expect("attached");
        server.stmt_clock += 1;
        let clock = server.stmt_clock;
        if let Some(s) = server.prepared.get_mut(sql) {
            s.used = clock;
            return Ok(Prepared::Ready { id: s.id });
        }
        if self.engine.pinned().is_none() && self.close_least_used_statements().await.is_err() {
            return Err(self.lost(seq, "writing to the server failed").await);
        }
        let mut msg = bytes::BytesMut::new();
        write_packet(
            &mut msg,
            0,
            &build_command(Command::StmtPrepare, sql.as_bytes()),
        );
        let server = self.server.as_mut().expect("attached");
        let caps = server.caps;
        if server.io.send(&msg).await.is_err() {
            return Err(self.lost(seq, "writing to the server failed").await);
        }
        let mut reply = Reply::new(Shape::Prepare, caps);
        let mut answer = Vec::new();
        let max = self.ctx.config.max_message_size as usize;
        while !reply.is_done() {
            let frame = self.next_server_message(seq, max).await?;
            let first =
                &frame[HEADER_LEN..HEADER_LEN + (frame.len() - HEADER_LEN).min(MAX_PAYLOAD)];
            if let Err(e) = reply.on_message(first) {
                return Err(self.lost(seq, &e.0).await);
            }
            answer.extend_from_slice(&frame);
        }
        if reply.error {
            return Ok(Prepared::Refused(answer[HEADER_LEN..].to_vec()));
        }
        let ok = match parse_prepare_ok(&answer[HEADER_LEN..]) {
            Ok(ok) => ok,
            Err(e) => return Err(self.lost(seq, &e.to_string()).await),
        };
        let server = self.server.as_mut().expect("attached");
        server.prepared.insert(
            sql.clone(),
            ServerStmt {
                id: ok.statement_id,
                answer,
                types: None,
                used: clock,
            },
        );
        Ok(Prepared::Ready {
            id: ok.statement_id,
        })
    }

    /// The client's statement for a statement command, by its id.
    fn client_stmt(&self, payload: &[u8]) -> Option<(u32, ClientStmt)> {
        let id = statement_id(payload).ok().flatten()?;
        let id = if id == LAST_PREPARED {
            self.prepared.last?
        } else {
            id
        };
        self.prepared.map.get(&id).map(|s| (id, s.clone()))
    }

    /// Before a COM_STMT_EXECUTE, FETCH or BULK_EXECUTE (`cmd`, its
    /// `payload`) runs: the engine is told whether it may commit (a
    /// prepared COMMIT in flight may have committed: 08007, never
    /// replayed). No future of its own: the execute is awaited by the
    /// caller.
    pub(super) fn note_execute_commit(&mut self, cmd: Command, payload: &[u8]) {
        let may_commit = cmd != Command::StmtFetch
            && payload
                .get(1..5)
                .map(|id| u32::from_le_bytes([id[0], id[1], id[2], id[3]]))
                .and_then(|id| self.prepared.map.get(&id))
                .is_some_and(|s| s.may_commit);
        self.engine.sending(may_commit);
    }

    /// COM_STMT_EXECUTE (and MariaDB's BULK_EXECUTE, FETCH): on the
    /// connection the client has, or one the statement's route picks.
    pub(super) async fn stmt_execute(
        &mut self,
        payload: &[u8],
        seq: u8,
    ) -> Result<(), SessionError> {
        let Some((id, mut stmt)) = self.client_stmt(payload) else {
            put_error(
                &mut self.client.write_buf,
                seq,
                codes::UNKNOWN_STMT_HANDLER,
                "fulcrum: unknown prepared statement handler",
            );
            return Ok(());
        };
        let types = self.bound_types(id, payload, stmt.num_params, stmt.types.take());
        let cursor = payload.first() == Some(&0x17) && execute_flags(payload).unwrap_or(0) != 0;
        if cursor {
            self.pin("cursor");
        }
        let fetch = payload.first() == Some(&FETCH);
        if payload.first() == Some(&0x17) && !cursor {
            // The result cache: a hit is the answer; a miss it may keep
            // goes to the primary and is captured as it passes.
            let step = self.cache_front_execute(
                (&stmt.sql, stmt.decision),
                types.as_deref(),
                payload,
                seq,
            );
            if let super::cache::CacheStep::Answered = step.await {
                return Ok(());
            }
        }
        // `[[cluster.mirror]]`: the execute by its text, with its types
        // (the target prepares it under its own id); not a cursor's.
        let mirrored = self.digests.mirror.is_some().then(|| {
            (payload.first() != Some(&FETCH) && !cursor).then(|| {
                types
                    .as_ref()
                    .and_then(|t| with_types(payload, stmt.num_params, t))
                    .unwrap_or_else(|| payload.to_vec())
            })
        });
        let routing = self.route_unit(stmt.decision);
        if !fetch {
            // The result cache: what it may change goes now, and again at
            // its answer.
            self.cache_execute_writes(&stmt.sql, stmt.decision);
            self.cache_txn_sent(stmt.decision, &stmt.sql);
        }
        if !self.ensure_attached(routing, seq).await? {
            return Ok(());
        }
        let server_id = match self.ensure_prepared(&stmt.sql, seq).await? {
            Prepared::Ready { id } => id,
            Prepared::Refused(err) => {
                write_packet(&mut self.client.write_buf, seq, &err);
                self.maybe_detach();
                return Ok(());
            }
        };
        let msg = self.execute_message(&stmt, types, payload, server_id, fetch);
        let shape = if fetch { Shape::Fetch } else { Shape::Results };
        self.digests.pending = if fetch { None } else { stmt.digest.clone() };
        if let Some(m) = self.digests.mirror.as_mut() {
            match mirrored.flatten() {
                Some(body) => m.execute(&stmt.sql, &body),
                None => m.ignore_next(),
            }
        }
        self.forward_bytes(&msg, seq, shape, &mut Effects::default())
            .await
    }

    /// The parameter types an execute of the client's statement `id` goes
    /// with: those in `payload` when it sends them (kept for the next
    /// execute; the ones kept, `old`, when they are the same: no
    /// allocation per execute), else `old`.
    fn bound_types(
        &mut self,
        id: u32,
        payload: &[u8],
        num_params: u16,
        old: Option<Arc<[u8]>>,
    ) -> Option<Arc<[u8]>> {
        match (execute_types(payload, num_params), old) {
            (Some(new), Some(old)) if *old == *new => Some(old),
            (Some(new), _) => {
                let new: Arc<[u8]> = new.into();
                if let Some(s) = self.prepared.map.get_mut(&id) {
                    s.types = Some(new.clone());
                }
                Some(new)
            }
            (None, old) => old,
        }
    }

    /// The execute (or FETCH) `payload` as the attached server gets it: its
    /// statement id `server_id`, and the bound `types` added when the
    /// client left them out but that connection has not seen them (they
    /// are its now).
    fn execute_message(
        &mut self,
        stmt: &ClientStmt,
        types: Option<Arc<[u8]>>,
        payload: &[u8],
        server_id: u32,
        fetch: bool,
    ) -> bytes::BytesMut {
        let server = self.server.as_mut().expect("attached");
        let entry = server.prepared.get_mut(&stmt.sql).expect("just prepared");
        // COM_STMT_FETCH (a cursor's next rows) carries no parameters and
        // is answered with binary rows only.
        let typed = match (&types, execute_types(payload, stmt.num_params)) {
            _ if fetch => None,
            (Some(t), None) if entry.types.as_ref() != Some(t) => {
                with_types(payload, stmt.num_params, t)
            }
            _ => None,
        };
        if !fetch {
            entry.types = types;
        }
        // Framed as it is copied; the statement id rewritten in place.
        let body = typed.as_deref().unwrap_or(payload);
        let mut msg = bytes::BytesMut::with_capacity(body.len() + 8);
        write_packet(&mut msg, 0, body);
        let _ = set_statement_id(&mut msg[HEADER_LEN..], server_id);
        msg
    }

    /// COM_STMT_CLOSE: the client's id goes; the server keeps the statement
    /// for the next client that prepares the same text. No answer.
    pub(super) fn stmt_close(&mut self, payload: &[u8]) {
        if let Some((id, _)) = self.client_stmt(payload) {
            self.prepared.map.remove(&id);
        }
    }

    /// COM_STMT_RESET: on the attached connection if it has the statement,
    /// else nothing to reset.
    pub(super) async fn stmt_reset(&mut self, payload: &[u8], seq: u8) -> Result<(), SessionError> {
        let Some((_, stmt)) = self.client_stmt(payload) else {
            put_error(
                &mut self.client.write_buf,
                seq,
                codes::UNKNOWN_STMT_HANDLER,
                "fulcrum: unknown prepared statement handler",
            );
            return Ok(());
        };
        let server_id = self
            .server
            .as_ref()
            .and_then(|s| s.prepared.get(&stmt.sql))
            .map(|s| s.id);
        match server_id {
            Some(id) => {
                let mut body = payload.to_vec();
                let _ = set_statement_id(&mut body, id);
                let mut msg = bytes::BytesMut::new();
                write_packet(&mut msg, 0, &body);
                if let Some(m) = self.digests.mirror.as_mut() {
                    m.ignore_next(); // The target's statement has no state to reset.
                }
                self.forward_bytes(&msg, seq, Shape::Results, &mut Effects::default())
                    .await
            }
            None => {
                put_ok(
                    &mut self.client.write_buf,
                    seq,
                    self.hello.caps,
                    self.status,
                );
                Ok(())
            }
        }
    }

    /// COM_STMT_SEND_LONG_DATA: the data lives on one connection until the
    /// execute, so the client stays there. No answer.
    pub(super) async fn stmt_long_data(
        &mut self,
        payload: &[u8],
        seq: u8,
    ) -> Result<(), SessionError> {
        let Some((_, stmt)) = self.client_stmt(payload) else {
            return Ok(());
        };
        self.pin("long data");
        let routing = self.route_unit(stmt.decision);
        if !self.ensure_attached(routing, seq).await? {
            return Ok(());
        }
        let Prepared::Ready { id } = self.ensure_prepared(&stmt.sql, seq).await? else {
            return Ok(());
        };
        let mut body = payload.to_vec();
        let _ = set_statement_id(&mut body, id);
        let mut msg = bytes::BytesMut::new();
        write_packet(&mut msg, 0, &body);
        let server = self.server.as_mut().expect("attached");
        if server.io.send(&msg).await.is_err() {
            return Err(self.lost(seq, "writing to the server failed").await);
        }
        Ok(())
    }
}
