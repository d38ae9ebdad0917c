//! Client to server: taking the client's frames, routing each new unit
//! once, holding a unit behind work in flight, and settling after every
//! batch so no answer Fulcrum owes is left behind.

use super::look::{query_look, unit_text, QueryLook};
use super::*;

impl Session {
    /// Handles what the client sent, then settles: answers Fulcrum owes
    /// itself go out, and a connection with nothing in flight goes back. A
    /// unit held behind work that has just finished is taken up at once, so
    /// no unit waits for a server answer that is not coming.
    pub(super) async fn on_client_input(&mut self) -> Result<(), SessionError> {
        loop {
            let held = self.take_client_frames().await?;
            self.settle().await?;
            self.engine.holding(held && self.server.is_some());
            if !(held && self.server.is_none()) {
                return Ok(());
            }
        }
    }

    /// After a batch of client frames: sends what is queued for the server,
    /// emits the synthetic replies now at the front of the reply queue,
    /// writes to the client, and detaches when nothing is in flight.
    pub(super) async fn settle(&mut self) -> Result<(), SessionError> {
        self.flush_server().await?;
        self.owed.expect.drain_synthetic(
            &mut self.client.write_buf,
            status_byte(self.engine.status()),
        );
        self.flush_client().await?;
        self.maybe_detach();
        Ok(())
    }

    /// Takes the complete client frames in the buffer. Returns true when it
    /// stopped at a unit it holds (waiting for the attached connection).
    pub(super) async fn take_client_frames(&mut self) -> Result<bool, SessionError> {
        let max = self.ctx.config.max_message_size;
        // When a new unit of work started here: the time to its hand-over
        // to the server is what Fulcrum adds (`fulcrum_proxy_seconds`).
        let mut unit_started = None;
        let held = loop {
            // The classification route_unit makes of this frame, if it is a
            // Query, serves its session effects too (one pass).
            self.query_unit = None;
            let header = match check_frame(&self.client.read_buf, max) {
                Ok(Some(h)) if self.client.read_buf.len() >= h.total => h,
                Ok(Some(h)) => {
                    self.client.reserve_for(h.total);
                    break false;
                }
                Ok(None) => break false,
                Err(e) => {
                    self.flush_server().await?;
                    return Err(self
                        .fatal_client(sqlstate::PROTOCOL_VIOLATION, &format!("fulcrum: {e}"))
                        .await);
                }
            };
            if self.engine.is_lost()
                && self.server.is_none()
                && self.answer_lost(header.tag, header.total)
            {
                continue;
            }
            // One look at a Query's first word tells whether Fulcrum may
            // answer it itself; most statements skip every check below.
            let look = match header.tag {
                b'Q' => query_look(&self.client.read_buf[5..header.total]),
                _ => QueryLook::default(),
            };
            let (pid_call, local) = (look.pid_call, look.local);
            self.query_text_len = look.text;
            if pid_call && self.try_answer_pid_call(header.total) {
                continue;
            }
            if local && self.try_answer_setting(header.total) {
                continue;
            }
            if local {
                match self.try_answer_position(header.total).await {
                    token::PositionAnswer::No => {}
                    token::PositionAnswer::Answered => continue,
                    token::PositionAnswer::Hold => break true,
                }
            }
            if local {
                match self.try_answer_listen(header.total).await {
                    token::PositionAnswer::No => {}
                    token::PositionAnswer::Answered => continue,
                    token::PositionAnswer::Hold => break true,
                }
            }
            if local && self.server.is_none() && self.try_answer_local_deallocate(header.total) {
                // A mapped statement's DEALLOCATE needs no server.
                let _ = self.client.read_buf.split_to(header.total);
                continue;
            }
            if local && self.server.is_none() && self.try_defer_transaction_control(header.total) {
                let _ = self.client.read_buf.split_to(header.total);
                continue;
            }
            if matches!(
                header.tag,
                b'Q' | b'P' | b'B' | b'D' | b'C' | b'E' | b'S' | b'H' | b'F'
            ) {
                if self.server.is_none() {
                    unit_started.get_or_insert_with(|| self.engine.now());
                    let routing = self.route_unit();
                    self.attach_unit(routing).await?;
                } else if self.at_unit_start() {
                    // A new unit behind work still on the connection.
                    let routing = self.route_unit();
                    let was = self.engine.phase();
                    let actions = self.engine.step(Event::Unit(routing));
                    if self.carry_out(actions).await? == Carried::Held {
                        // It needs another connection (a write behind a
                        // replica read), or is a read waiting for the
                        // position of the write before it: it stays
                        // buffered until this connection has answered.
                        break true;
                    }
                    if was == Phase::Settling {
                        // It rides along on the primary connection held for
                        // the position query, and counts as a unit.
                        let now = self.engine.rides_along(routing.may_write);
                        unit_started.get_or_insert(now);
                    }
                }
            }
            self.ask_commit_id_ahead(header.tag, header.total);
            if header.tag == b'S' {
                self.ask_commit_id_before_sync();
            }
            let frame = self.client.read_buf.split_to(header.total);
            // What the look found was of this frame, no longer the front.
            self.query_text_len = None;
            self.log_client_frame(header.tag, &frame);
            if let Some(m) = self.mirror.as_mut() {
                m.client_frame(header.tag, &frame);
            }
            self.engine.unit_frame(&frame);
            if !self.on_client_frame(header.tag, frame, look.text).await? {
                self.flush_server().await?;
                return Err(SessionError::ClientGone);
            }
            if header.tag == b'Q' {
                self.ask_commit_id_behind();
            }
        };
        if let Some(t) = unit_started {
            self.ctx.metrics.proxy.observe(t.elapsed().as_secs_f64());
        }
        Ok(held)
    }

    /// Handles one client frame (a Query's text `text_len` bytes long, as
    /// `query_look` found it). Returns false on Terminate.
    pub(super) async fn on_client_frame(
        &mut self,
        tag: u8,
        frame: BytesMut,
        text_len: Option<usize>,
    ) -> Result<bool, SessionError> {
        tracing::trace!(tag = %(tag as char), len = frame.len(), "client message");
        match tag {
            b'X' => return Ok(false),
            b'd' | b'c' | b'f' => {
                // Copy data outside a copy is ignored by servers too.
                if self.server.is_some() {
                    self.queue_to_server(frame);
                    if tag != b'd' {
                        self.owed.expect.client_copy_end();
                    }
                }
                return Ok(true);
            }
            b'Q' => {
                // The classification says whether it deallocates; it is
                // kept for the Query's handling below (one pass).
                let text = text_len.map_or(&[][..], |n| &frame[5..5 + n]);
                let unit = self.query_unit(text);
                if self.one_setting_too_many(unit.effects.iter().as_slice()) {
                    return Err(self.too_many_settings().await);
                }
                let deallocates = unit
                    .effects
                    .iter()
                    .any(|e| matches!(e, Effect::Deallocate(_)));
                self.query_unit = Some(unit);
                if deallocates && self.try_answer_deallocate(&frame[5..]) {
                    if let Some(m) = self.mirror.as_mut() {
                        // No ReadyForQuery of the server's will answer it.
                        m.answered_locally();
                    }
                    return Ok(true);
                }
            }
            b'P' | b'B' | b'D' | b'C' | b'E' | b'S' | b'H' | b'F' => {}
            other => {
                let msg = format!("fulcrum: invalid frontend message type {}", other);
                self.flush_server().await?;
                return Err(self.fatal_client(sqlstate::PROTOCOL_VIOLATION, &msg).await);
            }
        }
        if self.server.is_none() {
            let routing = self.route_unit();
            self.attach_unit(routing).await?;
        }
        // A replay sends the logged frames again: they were counted (and
        // their digests stamped) when the client sent them.
        let replaying = self.txn.run.is_some();
        if matches!(tag, b'Q' | b'E' | b'F') && !replaying {
            self.ctx
                .metrics
                .queries(self.backend, self.route_label(), 1);
        }
        match tag {
            b'Q' => {
                let text = text_len.map_or(&[][..], |n| &frame[5..5 + n]);
                let unit = self.query_unit(text);
                if unit.may_commit {
                    self.engine.commit_sent();
                }
                self.txn.unit_writes = may_write(unit.decision);
                let stamp = if replaying {
                    None
                } else {
                    let now = self.engine.now();
                    let memo = &mut self.stmts.last_digest;
                    self.ctx
                        .digest_stamp_of(&unit, text, self.backend, now, memo)
                };
                if unit.unproven.is_some() {
                    let (user, database) = (&self.id.user, &self.id.database);
                    if let Some(reason) = self.ctx.unproven_pin(&unit, user, (0, 0), database) {
                        self.pin(reason);
                    }
                }
                let effects = unit.effects;
                let mut replay = Vec::new();
                for effect in effects.iter() {
                    match effect {
                        Effect::Pin(reason) => self.pin(reason),
                        Effect::Deallocate(None) => {
                            self.stmts.map.clear();
                            self.stmts.digests.clear();
                        }
                        Effect::Deallocate(Some(_)) => {}
                        Effect::Notifies => self.record_notifier(),
                        e => replay.push(e.clone()),
                    }
                }
                self.queue_to_server(frame);
                self.owed.expect.push(Expect::Query(replay, stamp));
                self.owed.ready += 1;
            }
            b'F' => {
                // A call by the function's OID: nothing tells what it does
                // to the session (default-deny).
                self.pin("FunctionCall message");
                self.queue_to_server(frame);
                self.owed.expect.push(Expect::Query(Vec::new(), None));
                self.owed.ready += 1;
            }
            b'S' => {
                self.queue_to_server(frame);
                if !self.owed.expect.sync_is_ignored() {
                    self.owed.expect.push(Expect::Sync);
                    self.owed.ready += 1;
                    self.owed.unsynced = false;
                }
            }
            b'H' => {
                self.queue_to_server(frame);
                self.owed.unsynced = true;
            }
            b'P' => {
                if self.one_statement_too_many(&frame) {
                    let max = self.ctx.config.max_client_prepared_statements;
                    let bytes = self.ctx.config.max_client_prepared_bytes;
                    let msg = format!(
                        "fulcrum: too many prepared statements for one client (max_client_prepared_statements = {max}, max_client_prepared_bytes = {bytes}); close statements the client no longer uses"
                    );
                    self.flush_server().await?;
                    return Err(self.fatal_client("54000", &msg).await);
                }
                self.on_parse(frame)
            }
            b'B' => self.on_bind(frame),
            b'D' | b'C' => self.on_describe_or_close(tag, frame),
            b'E' if self.listen.is_some() && self.virtual_execute(&frame).await => {
                self.owed.unsynced = true;
            }
            b'E' => {
                let ops = self.execute_ops(&frame[5..]);
                if ops.contains(&Effect::Notifies) {
                    self.record_notifier();
                }
                let replaying = self.txn.run.is_some();
                if self.one_setting_too_many(&ops) {
                    self.flush_server().await?;
                    return Err(self.too_many_settings().await);
                }
                let stamp = if replaying {
                    None
                } else {
                    self.execute_stamp(&frame[5..])
                };
                self.queue_to_server(frame);
                self.owed.expect.push(Expect::Execute(ops, stamp));
                self.owed.unsynced = true;
            }
            _ => unreachable!("filtered above"),
        }
        Ok(true)
    }

    /// The classification of the unit at the front of the client buffer;
    /// a Query's whole classification is kept for its session effects.
    pub(super) fn next_unit_decision(&mut self) -> Decision {
        let query_unit = std::cell::RefCell::new(None);
        let local_listen = self.listens_locally();
        let classify = |sql: &str| {
            let unit = self.ctx.classify_unit(sql);
            let d = self
                .ctx
                .catalog_decision(&unit, &self.id.user, &self.id.database);
            *query_unit.borrow_mut() = Some(unit);
            if local_listen
                && notify::is_listen_decision(d)
                && fulcrum_sql::listen::listen_statement(sql).is_some()
            {
                // Answered by Fulcrum, never run on a server: no pin.
                return Decision::Read;
            }
            d
        };
        // A Query whose text `query_look` found: classified from there.
        let front_text = match (self.client.read_buf.first(), self.query_text_len) {
            (Some(b'Q'), Some(n)) => {
                Some(std::str::from_utf8(&self.client.read_buf[5..5 + n]).ok())
            }
            _ => None,
        };
        let decision = match front_text {
            Some(Some(text)) => classify(text),
            Some(None) => Decision::Write,
            None => unit_decision(
                &self.client.read_buf,
                self.ctx.config.max_message_size,
                &classify,
                &self.stmts.map,
                self.stmts.unnamed_decision,
            ),
        };
        self.query_unit = query_unit.into_inner();
        decision
    }

    /// The one routing decision for the unit at the front of the client
    /// buffer (`fulcrum_session::decide`).
    pub(super) fn route_unit(&mut self) -> Routing {
        let decision = self.next_unit_decision();
        // Hints live in comments: a text the classifier saw none in has none.
        let commented = self.query_unit.as_ref().is_none_or(|u| u.comments);
        let text = if commented {
            unit_text(&self.client.read_buf)
        } else {
            None
        };
        match text {
            Some(text) => self.reads.note_hint(text),
            None => self.reads.clear_hint(),
        }
        let txn = match (self.engine.deferred(), status_byte(self.engine.status())) {
            (Some(read_only), _) => RouteTxn::Deferred { read_only },
            (None, b'I') => RouteTxn::None,
            _ => RouteTxn::Open,
        };
        let routing = decide(&Facts {
            decision,
            complete: true, // an unfinished unit is classified a write
            executes: unit_executes(&self.client.read_buf, self.ctx.config.max_message_size),
            txn,
            pinned: self.engine.pinned().is_some(),
            attached: self.server.is_some(),
            hint: self.reads.hint(),
            session: self.reads.session(),
            position_unknown: self.reads.position_unknown(),
            default_route: self.ctx.config.default_route,
        });
        if let Some(reason) = routing.pin {
            tracing::debug!(target: "fulcrum_pin", reason, "client pinned to its server connection");
        }
        self.engine.routed(&routing);
        if self.mirror.is_some() {
            // What the statements are, not where they go (a read inside a
            // transaction goes to the primary), each statement of a Query
            // judged too (`fulcrum_cluster::mirror::unit_may_write`).
            let text = match self.client.read_buf.first() {
                Some(b'Q') => unit_text(&self.client.read_buf),
                _ => None,
            };
            let text = text.and_then(|t| std::str::from_utf8(t).ok()).unwrap_or("");
            let (user, database) = (&self.id.user, &self.id.database);
            let writes = fulcrum_cluster::mirror::unit_may_write(decision, text, |s| {
                let unit = self.ctx.classify_unit(s);
                self.ctx.catalog_decision(&unit, user, database)
            });
            if let Some(m) = self.mirror.as_mut() {
                m.unit_writes(writes);
            }
        }
        routing
    }

    /// Attaches a server connection for a unit from a client that has none,
    /// the deferred BEGIN (if any) going ahead of the unit in the same write.
    pub(super) async fn attach_unit(&mut self, routing: Routing) -> Result<(), SessionError> {
        let begin = self.engine.take_begin();
        if let (Some(m), Some(sql)) = (self.mirror.as_mut(), begin.as_deref()) {
            m.begin(sql);
        }
        // A client without a connection is always told where to attach.
        let actions = self.engine.step(Event::Unit(routing));
        let carried = match self.carry_out_at_once(actions) {
            Ok(carried) => carried,
            Err(actions) => self.carry_out(actions).await?,
        };
        debug_assert_eq!(
            carried,
            Carried::Done,
            "a unit without a connection is never held"
        );
        if self.server.is_none() {
            debug_assert!(false, "no route for a client without a connection");
            self.attach(Route::Primary).await?;
        }
        let actual = self.ctx.router.route_of(self.backend);
        let actions = self.engine.step(Event::Attached(actual));
        self.carry_out_now(actions);
        self.arm_retry(begin.is_some());
        if let Some(sql) = begin {
            if self.engine.txn_log.enabled() && self.engine.pinned().is_none() && self.stmts.rewrite
            {
                // The transaction's log starts with the BEGIN sent ahead.
                self.engine
                    .txn_log
                    .open(self.client.output_position(), Some(sql.clone()));
            }
            // The transaction starts on the chosen server, in the same
            // write as its first statement.
            put_query(&mut self.to_server, sql.as_str());
            self.owed.expect.push(Expect::SwallowQuery);
        }
        Ok(())
    }

    /// The next client frame starts a unit on an attached connection,
    /// outside a transaction, of an unpinned client.
    fn at_unit_start(&self) -> bool {
        self.engine.status() == Status::Idle
            && !self.owed.unsynced
            && self.engine.pinned().is_none()
    }

    /// The classification of a simple query's `text`: the one route_unit
    /// made of it, or (on an attached connection) one now, which for a
    /// plain statement is a cache hit. Its effects, may-commit and digest
    /// key are read from it: the text is not scanned again.
    fn query_unit(&mut self, text: &[u8]) -> fulcrum_sql::Classified {
        if let Some(unit) = self.query_unit.take() {
            return unit;
        }
        match std::str::from_utf8(text) {
            Ok(text) => self.ctx.classify_unit(text),
            _ => fulcrum_sql::Classified::from(Decision::Unknown),
        }
    }

    /// Whether `effects` would give the client more tracked settings than
    /// `max_client_settings` (each is kept and replayed per connection).
    fn one_setting_too_many(&self, effects: &[Effect]) -> bool {
        let max = self.ctx.config.max_client_settings as usize;
        let desired = &self.params.desired;
        let fresh = effects
            .iter()
            .filter(|e| matches!(e, Effect::Set { key, .. } if !desired.contains_key(key)))
            .count();
        // The startup parameters are always there and do not count.
        let set = desired.len().saturating_sub(self.params.startup.len());
        if fresh > 0 && set + fresh > max {
            return true;
        }
        // And in bytes: what is kept and re-sent per connection.
        let max_bytes = self.ctx.config.max_client_settings_bytes as usize;
        let adds: usize = effects
            .iter()
            .map(|e| match e {
                Effect::Set { key, stmt } => key.len() + stmt.len(),
                _ => 0,
            })
            .sum();
        adds > 0 && desired.bytes() + adds > max_bytes
    }

    /// Ends the session of a client past `max_client_settings`.
    async fn too_many_settings(&mut self) -> SessionError {
        let max = self.ctx.config.max_client_settings;
        let bytes = self.ctx.config.max_client_settings_bytes;
        let msg = format!(
            "fulcrum: too many session settings for one client (max_client_settings = {max}, max_client_settings_bytes = {bytes}); RESET the ones no longer needed"
        );
        self.fatal_client("54000", &msg).await
    }

    /// A Parse that would give the client one named statement more than
    /// `max_client_prepared_statements` (each is kept in Fulcrum's memory).
    /// And in bytes: `max_client_prepared_bytes` of names and Parse frames.
    fn one_statement_too_many(&mut self, frame: &[u8]) -> bool {
        let Some(p) = parse_msg(&frame[5..]).filter(|p| !p.name.is_empty()) else {
            return false;
        };
        let max = self.ctx.config.max_client_prepared_statements as usize;
        let fresh = !self.stmts.map.contains_key(p.name);
        if fresh && self.stmts.map.len() >= max {
            return true;
        }
        let max_bytes = self.ctx.config.max_client_prepared_bytes as usize;
        let adds = p.name.len() + frame.len();
        if self.stmts.bytes + adds > max_bytes {
            // Closed and replaced statements only ever lower the true sum.
            self.stmts.bytes = self
                .stmts
                .map
                .iter()
                .map(|(name, s)| name.len() + s.parse.len())
                .sum();
            if self.stmts.bytes + adds > max_bytes {
                return true;
            }
        }
        self.stmts.bytes += adds;
        false
    }

    /// Queues a client frame for the server. A large one with nothing ahead
    /// of it is moved, not copied, so a big statement is held once.
    fn queue_to_server(&mut self, frame: BytesMut) {
        if self.to_server.is_empty() && frame.len() >= 64 * 1024 {
            self.to_server = frame;
        } else {
            self.to_server.extend_from_slice(&frame);
        }
    }

    /// A unit just attached to a replica, outside a transaction, is kept
    /// until it is answered, to be sent elsewhere if the replica dies.
    pub(super) fn arm_retry(&mut self, with_begin: bool) {
        let eligible = self.stmts.rewrite
            && self.engine.pinned().is_none()
            && self.engine.status() == Status::Idle
            && !with_begin
            && !self.ctx.router.is_primary(self.backend);
        let mark = self.client.write_buf.len();
        self.engine.may_retry(eligible, mark);
    }
}
