//! Server to client: forwarding the server's frames through the reply
//! queue, settling session state at ReadyForQuery, and the two flushes.

use std::ops::ControlFlow;

use super::super::expect::Effects as ServerEffects;
use super::*;
use crate::codec::frame::FrameHeader;

impl Session {
    /// Writes what is queued for the server as far as it takes it now (the
    /// loop writes the rest when it can).
    pub(super) async fn flush_server(&mut self) -> Result<(), SessionError> {
        if self.to_server.is_empty() {
            return Ok(());
        }
        let Some(server) = self.server.as_mut() else {
            self.to_server.clear();
            return Ok(());
        };
        if server.io.write_now_from(&mut self.to_server).is_err() {
            self.to_server.clear();
            return self.server_lost().await;
        }
        if self.to_server.is_empty() {
            // Synthetic replies queued ahead of anything the server owes go out now.
            self.owed.expect.drain_synthetic(
                &mut self.client.write_buf,
                status_byte(self.engine.status()),
            );
        }
        Ok(())
    }

    /// Writes what is queued for the client as far as it takes it now.
    pub(super) async fn flush_client(&mut self) -> Result<(), SessionError> {
        if self.replay_progress() {
            // A replay is under way: its answers are compared, not sent.
            return Ok(());
        }
        self.absorb_output();
        if self.client.has_output() {
            // The answer has started: a lost replica can no longer be hidden.
            self.engine.answered();
            self.client.write_now()?;
        }
        Ok(())
    }

    /// Handles what the server sent: each complete frame in turn, rows and
    /// copy data streamed through, then the writes and a possible detach.
    pub(super) async fn on_server_input(&mut self) -> Result<(), SessionError> {
        loop {
            self.forward_plain_run();
            let header = match self.next_server_frame() {
                NextFrame::Whole(header) => header,
                NextFrame::Wait => break,
                NextFrame::Lost => return self.server_lost().await,
            };
            let error_code = match header.tag {
                b'E' | b'N' => match self.look_at_error(header) {
                    ControlFlow::Continue(code) => code,
                    ControlFlow::Break(()) => return self.server_lost().await,
                },
                _ => None,
            };
            // Filled in place: the effects are not moved from frame step
            // to frame step (about 120 bytes, twice per frame before).
            let mut fx = ServerEffects::default();
            let (step, noted) = self.take_server_frame(header, &mut fx);
            if fx.ready.is_some_and(|s| s != b'I') && self.pool_mode == PoolMode::Statement {
                return Err(self.refuse_transaction_block().await);
            }
            self.note_server_frame(noted, &mut fx, error_code);
            // The frame is copied from where it lies in the server buffer
            // (no split, no reference count), then passed over.
            let server = self.server.as_mut().expect("attached");
            let frame = &server.io.read_buf[..header.total];
            let mut filled = None;
            if step == Step::Forward {
                self.client.write_buf.extend_from_slice(frame);
                if let Some(c) = self.cache_fill.as_mut() {
                    if c.frame(header.tag, frame) {
                        filled = Some(frame[5]);
                    }
                }
                if let Some(m) = self.mirror.as_mut().filter(|_| self.txn.run.is_none()) {
                    m.server_frame(header.tag, &frame[5..]);
                }
            }
            bytes::Buf::advance(&mut server.io.read_buf, header.total);
            if let Some(status) = filled {
                self.cache_filled(status);
            }
            self.after_server_frame(&fx);
        }
        self.owed.expect.drain_synthetic(
            &mut self.client.write_buf,
            status_byte(self.engine.status()),
        );
        if let Some(m) = self.mirror.as_mut().filter(|m| m.waiting()) {
            // `mirror_mode = "sync"`: the answer waits for the mirror's.
            m.wait().await;
        }
        self.flush_client().await?;
        self.flush_server().await?;
        self.maybe_detach();
        Ok(())
    }

    /// Copies the run of whole frames at the front of the server buffer
    /// that need nothing but forwarding (rows, and a RowDescription no
    /// Describe waits for) to the client at once: no per-row split, reply
    /// queue step or bookkeeping. Only while the answer to a client's Query
    /// or Execute is coming and nothing else reads the rows (no mirror,
    /// nothing being streamed); anything else is left to the frame loop,
    /// which also reports a malformed or oversized frame.
    #[inline]
    fn forward_plain_run(&mut self) {
        if self.owed.stream_left > 0 || self.mirror.is_some() || !self.owed.expect.rows_are_plain()
        {
            return;
        }
        let max = self.ctx.config.max_message_size;
        let buf = &mut self.server.as_mut().expect("attached").io.read_buf;
        let mut end = 0;
        while let Some(&[tag, a, b, c, d]) = buf.get(end..end + 5) {
            let len = u32::from_be_bytes([a, b, c, d]) as u64;
            let plain = tag == b'D' || (tag == b'T' && len <= max.saturating_add(4));
            // A length under 4 or over i32 is malformed: the loop says so.
            if !plain || !(4..=i32::MAX as u64).contains(&len) {
                break;
            }
            let total = 1 + len as usize;
            if buf.len() - end < total {
                break;
            }
            end += total;
        }
        if end > 0 {
            self.client.write_buf.extend_from_slice(&buf[..end]);
            if let Some(c) = self.cache_fill.as_mut() {
                c.take(&buf[..end]);
            }
            bytes::Buf::advance(buf, end);
        }
    }

    /// Finds the next whole frame in the server buffer, streaming rows and
    /// copy data through to the client (the rest of one being streamed, or
    /// the start of a large one); a frame that is malformed or over
    /// `max_message_size` gives the connection up (`Engine::server_lost_because`).
    #[inline]
    fn next_server_frame(&mut self) -> NextFrame {
        let server = self.server.as_mut().expect("attached");
        let buf = &mut server.io.read_buf;
        if self.owed.stream_left > 0 {
            if let Some(c) = self.cache_fill.as_mut() {
                c.spoil();
            }
            let take = self.owed.stream_left.min(buf.len());
            self.client.write_buf.extend_from_slice(&buf.split_to(take));
            self.owed.stream_left -= take;
            if buf.is_empty() {
                return NextFrame::Wait;
            }
            // What follows in the buffer starts a new frame.
        }
        let header = match check_frame(buf, u32::MAX as u64) {
            Ok(Some(h)) => h,
            Ok(None) => return NextFrame::Wait,
            Err(e) => {
                tracing::warn!(error = %e, "malformed message from server");
                self.engine
                    .server_lost_because(format!("it sent a malformed message: {e}"));
                return NextFrame::Lost;
            }
        };
        let max = self.ctx.config.max_message_size;
        if header.total as u64 > max && !matches!(header.tag, b'D' | b'd') {
            // Rows and copy data stream through; any other message is
            // buffered whole, so it is held to the client's limit.
            let why = format!(
                "its {:?} message of {} bytes is over max_message_size ({max} bytes)",
                header.tag as char, header.total
            );
            tracing::warn!(server = %server.cancel.address, "closing a server connection: {why}");
            self.engine.server_lost_because(why);
            return NextFrame::Lost;
        }
        if buf.len() < header.total {
            if matches!(header.tag, b'D' | b'd') && buf.len() >= STREAM_THRESHOLD {
                if let Some(c) = self.cache_fill.as_mut() {
                    c.spoil();
                }
                self.owed.stream_left = header.total - buf.len();
                if header.tag == b'D' && self.txn.run.is_none() {
                    if let Some(m) = self.mirror.as_mut() {
                        m.server_row(&buf[5..], header.total - 5);
                    }
                }
                self.client.write_buf.extend_from_slice(buf);
                buf.clear();
            } else {
                buf.reserve(fulcrum_net::reserve_ahead(buf.len(), header.total));
            }
            return NextFrame::Wait;
        }
        NextFrame::Whole(header)
    }

    /// Looks at the whole ErrorResponse or NoticeResponse at the front of
    /// the server buffer: an error is counted (and a read-only refusal from
    /// the primary has the router recheck it) and its SQLSTATE returned.
    /// Breaks when the message says the server is closing this connection.
    #[inline]
    fn look_at_error(&mut self, header: FrameHeader) -> ControlFlow<(), Option<String>> {
        let buf = &self.server.as_ref().expect("attached").io.read_buf;
        let mut error_code = None;
        if header.tag == b'E' && buf.len() >= header.total {
            let fields = parse_error_fields(&buf[5..header.total]);
            self.ctx.metrics.error(fields.code.get(..2).unwrap_or("??"));
            if fields.code == sqlstate::READ_ONLY_SQL_TRANSACTION
                && self.ctx.router.is_primary(self.backend)
            {
                // The write target refused a write as read-only: it may
                // have been demoted elsewhere (Patroni, an operator).
                self.ctx.router.recheck();
            }
            error_code = Some(fields.code.to_owned());
        }
        if matches!(header.tag, b'E' | b'N') && self.stmts.rewrite && self.engine.pinned().is_none()
        {
            let fields = parse_error_fields(&buf[5..header.total]);
            // An immediate shutdown warns (a notice, 57P01/57P02) before
            // closing; a terminated backend or a crash sends FATAL.
            let closing = fields.severity == "FATAL"
                || fields.severity == "PANIC"
                || (header.tag == b'N' && fields.code.starts_with("57P"));
            if closing {
                // The server is closing this connection (shutdown, crash,
                // pg_terminate_backend): the client's session is not over.
                tracing::info!(code = %fields.code, message = ?fields.message, "server ended the connection");
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(error_code)
    }

    /// Tells the reply queue of the whole frame at the front of the server
    /// buffer (left there): whether it goes to the client, its effects, and
    /// what of it settles the connection's state.
    #[inline]
    fn take_server_frame(&mut self, header: FrameHeader, fx: &mut ServerEffects) -> (Step, Noted) {
        let server = self.server.as_mut().expect("attached");
        let server_pid = server.cancel.process_id;
        let frame = &mut server.io.read_buf[..header.total];
        tracing::trace!(tag = %(header.tag as char), len = frame.len(), "server message");
        if header.tag == b'A' && self.id.server_key.is_none() {
            // A pinned client knows Fulcrum's pid; one given its
            // server's (session pooling) sees the server's as it is.
            own_notification_pid(frame, server_pid, self.id.cancel.process_id);
        }
        self.owed.expect.drain_synthetic(
            &mut self.client.write_buf,
            status_byte(self.engine.status()),
        );
        let step = self.owed.expect.on_server_into(header.tag, &frame[5..], fx);
        if step == Step::Forward && self.engine.log_open() {
            // Only what reaches the client (not Fulcrum's own queries).
            super::txn_log::log_server_frame(&mut self.engine, header.tag, &frame[5..]);
        }
        (step, Noted::of(header.tag, &frame[5..]))
    }

    /// Settles what a server frame changes on the connection: reported
    /// parameters, a COMMIT's or ROLLBACK's outcome, DDL, confirmed and
    /// stale prepared statements, a finished statement's stamp.
    #[inline]
    fn note_server_frame(
        &mut self,
        noted: Noted,
        fx: &mut ServerEffects,
        error_code: Option<String>,
    ) {
        match noted {
            Noted::Parameter(n, v) => {
                let server = self.server.as_mut().expect("attached");
                if n == "application_name" {
                    server.application_name_reported(&v);
                }
                server.report(&n, &v);
                if server.lexes_apart {
                    self.pin(super::attach::LEXES_APART);
                }
            }
            Noted::Commit => self.params.txn_committed = Some(true),
            Noted::Rollback => self.params.txn_committed = Some(false),
            Noted::Ddl => {
                // Statements prepared before may now be stale; again
                // at the end of the transaction, when others see it.
                self.ctx.statements.schema_changed();
                // A function may have been created or changed.
                self.ctx.functions.forget();
                // A trigger, rule, view or key may have come or gone.
                self.ctx.relations.forget();
                self.ddl_in_txn = true;
            }
            Noted::Nothing => {}
        }
        if let Some(name) = fx.prepared.take() {
            let server = self.server.as_mut().expect("attached");
            server.prepared.confirm(name);
        }
        if let Some((stamp, rows, failed)) = &fx.finished {
            // The unit's own time (`record_unit`) is usually the same span.
            stamp.finish_after(self.engine.since(stamp.at()), *rows, *failed);
        }
        if fx.skipped_to_sync {
            let server = self.server.as_mut().expect("attached");
            server.drop_pending_statements();
        }
        if let (Some(name), Some(code)) = (&fx.failed_statement, &error_code) {
            if statement_went_stale(code) {
                let server = self.server.as_mut().expect("attached");
                server.prepared.remove(name);
                self.renew_statement(name);
            }
        }
    }

    /// After a server frame went where it goes: ignored Syncs, a
    /// ReadyForQuery's settling, a position or commit id learnt.
    #[inline]
    fn after_server_frame(&mut self, fx: &ServerEffects) {
        self.owed.ready = self.owed.ready.saturating_sub(fx.ignored_syncs);
        if let Some(status) = fx.ready {
            if self.cache_written.is_some() {
                self.cache_ready(status);
            }
            if status == b'I' && std::mem::take(&mut self.ddl_in_txn) {
                self.ctx.statements.schema_changed();
                // Read again now that others see it.
                self.ctx.relations.forget();
            }
            self.on_ready(status);
            self.log_ready(status);
            if status != b'I' && self.ctx.router.is_primary(self.backend) {
                // A transaction on the primary: it may write.
                self.engine.txn_on_primary();
            }
            if status == b'I' {
                self.after_unit();
            }
        }
        if let Some(lsn) = fx.position {
            self.on_position(lsn);
        }
        if let Some(id) = fx.commit_id {
            self.engine.commit_id_learnt(id);
        }
    }

    /// ReadyForQuery: a unit of work ended; settle its session-state changes.
    pub(super) fn on_ready(&mut self, status: u8) {
        let was = status_byte(self.engine.status());
        self.set_status(status);
        self.owed.ready = self.owed.ready.saturating_sub(1);
        if status == b'I' {
            // The transaction is over: its id with it.
            self.engine.txn_ended();
        }
        if self.owed.ready == 0 {
            self.engine.commit_answered();
            // What the next unit prepares may evict what this one used.
            if let Some(server) = self.server.as_mut() {
                server.prepared.begin_unit();
            }
        }
        // Replay the unit's statements in order: a SET inside a block that
        // this same unit rolls back must not be kept.
        let mut in_txn = was != b'I';
        let mut failed = was == b'E';
        let mut now = Vec::new();
        let ops = self.owed.expect.take_batch_ops();
        // Most units change no session state: no iterator made and dropped
        // (about 28 instructions each, here and in `apply_ops`).
        if !ops.is_empty() {
            for op in ops {
                match op {
                    Effect::Begin => in_txn = true,
                    Effect::Commit | Effect::Rollback => {
                        let committed = matches!(op, Effect::Commit) && !failed;
                        let done = std::mem::take(&mut self.params.txn_ops);
                        if committed {
                            now.extend(done);
                        }
                        in_txn = false;
                        failed = false;
                    }
                    // A sequence advanced stays advanced when its block rolls back.
                    op @ Effect::ResetBeforeReuse(_) => now.push(op),
                    op if in_txn => self.params.txn_ops.push(op),
                    op => now.push(op),
                }
            }
        }
        match status {
            b'I' => {
                if self.params.txn_committed == Some(true) {
                    now.extend(std::mem::take(&mut self.params.txn_ops));
                }
                self.params.txn_forgotten();
            }
            b'E' => {}
            _ => {}
        }
        self.apply_ops(now);
    }

    pub(super) fn apply_ops(&mut self, ops: Vec<Effect>) {
        if ops.is_empty() {
            return;
        }
        for op in ops {
            let server = self.server.as_mut().expect("attached");
            match op {
                Effect::Set { key, stmt } => {
                    server.applied.insert(key.clone(), stmt.clone());
                    self.params.desired.insert(key, stmt);
                }
                Effect::Reset { key } => {
                    server.applied.remove(&key);
                    match self.params.startup.get(&key) {
                        Some(s) => self.params.desired.insert(key, s.clone()),
                        None => self.params.desired.remove(&key),
                    };
                }
                Effect::ResetAll => {
                    server.applied.clear();
                    self.params.desired = Settings::new(self.params.startup.clone());
                }
                Effect::DiscardAll => {
                    // DISCARD ALL includes UNLISTEN *.
                    if let Some(l) = &self.listen {
                        l.unlisten_all();
                    }
                    server.applied.clear();
                    server.prepared.clear();
                    self.params.desired = Settings::new(self.params.startup.clone());
                    self.stmts.map.clear();
                }
                Effect::Unlisten(channel) => {
                    if let Some(l) = &self.listen {
                        l.unlisten(channel.as_deref());
                    }
                }
                // With a reset that clears it, the connection is reset before
                // its next checkout; without one, the client keeps it.
                Effect::ResetBeforeReuse(reason) if reset_clears_session(&self.ctx) => {
                    tracing::debug!(reason, "server connection reset before its next use");
                    server.reset_due = true;
                }
                Effect::ResetBeforeReuse(reason) => self.pin(reason),
                // Recorded when sent (`signal.rs`, `record_notifier`).
                Effect::Notifies => {}
                // Resolved at Bind; one left unresolved could not be replayed.
                Effect::SetParam { .. } => self.pin("set_config"),
                Effect::Deallocate(_)
                | Effect::Pin(_)
                | Effect::Begin
                | Effect::Commit
                | Effect::Rollback => {}
            }
        }
    }
}

/// What of a server frame settles the connection's state, read from the
/// frame while it lies in the server buffer.
enum Noted {
    Nothing,
    /// A ParameterStatus: its name and value.
    Parameter(String, String),
    Commit,
    Rollback,
    /// A CommandComplete of DDL.
    Ddl,
}

impl Noted {
    #[inline]
    fn of(tag: u8, body: &[u8]) -> Noted {
        match tag {
            b'S' => match parse_parameter_status(body) {
                Some((n, v)) => Noted::Parameter(n.to_owned(), v.to_owned()),
                None => Noted::Nothing,
            },
            b'C' => match command_tag(body) {
                b"COMMIT" => Noted::Commit,
                b"ROLLBACK" => Noted::Rollback,
                tag if is_ddl_tag(tag) => Noted::Ddl,
                _ => Noted::Nothing,
            },
            _ => Noted::Nothing,
        }
    }
}

/// What `next_server_frame` found at the front of the server buffer.
enum NextFrame {
    /// A whole frame, still in the buffer.
    Whole(FrameHeader),
    /// Nothing whole yet (or all of it streamed through): wait for more.
    Wait,
    /// The connection is given up (`Engine::take_lost_because` says why).
    Lost,
}
