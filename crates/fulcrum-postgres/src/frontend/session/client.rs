//! Client to server: taking the client's frames, routing each new unit
//! once, holding a unit behind work in flight, and settling after every
//! batch so no answer Fulcrum owes is left behind.

use super::look::{query_look, unit_text, QueryLook};
use super::*;
use crate::codec::frame::{FrameError, FrameHeader};

/// What [`Session::attach_unit_now`] left to wait for.
pub(super) struct UnitWait {
    begin: Option<String>,
    rest: NotAtOnce,
}

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
            self.parse_unit = None;
            let header = match self.front_header(max) {
                Ok(Some(h)) => h,
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
            let look = self.look_at_front(header);
            if look.pid_call || look.local {
                match self.answer_front(header.total, look).await {
                    token::PositionAnswer::No => {}
                    token::PositionAnswer::Answered => continue,
                    token::PositionAnswer::Hold => break true,
                }
            }
            if matches!(
                header.tag,
                b'Q' | b'P' | b'B' | b'D' | b'C' | b'E' | b'S' | b'H' | b'F'
            ) {
                // The result cache: a client without a connection, or a
                // session-pooled one holding its own (`cache_scope`).
                if self.ctx.cache.is_some()
                    && matches!(header.tag, b'Q' | b'P' | b'B')
                    && (self.server.is_none() || self.pool_mode == PoolMode::Session)
                {
                    let mut step = match header.tag {
                        b'Q' => self.cache_front(header.total, look.text),
                        _ => self.cache_front_extended(),
                    };
                    if let cache::CacheStep::Wait(w) = step {
                        // Another client's fill: boxed, rare.
                        step = Box::pin(self.cache_wait(w)).await;
                    }
                    if matches!(step, cache::CacheStep::Answered) {
                        continue;
                    }
                }
                if self.server.is_none() {
                    // The usual unit: no async layer before its attach.
                    unit_started.get_or_insert_with(|| self.engine.now());
                    let routing = self.route_unit(look.text);
                    if let Err(wait) = self.attach_unit_now(routing) {
                        Box::pin(self.attach_unit_wait(wait)).await?;
                    }
                } else if self.at_unit_start()
                    && self.route_behind(look.text, &mut unit_started).await?
                {
                    // Classified again when it is taken up.
                    self.parse_unit = None;
                    break true;
                }
            }
            let frame = self.take_front_frame(header.tag, header.total);
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

    /// The header of the whole frame at the front of the client buffer;
    /// `None` while it is not all there (room is reserved for it).
    #[inline]
    fn front_header(&mut self, max: u64) -> Result<Option<FrameHeader>, FrameError> {
        match check_frame(&self.client.read_buf, max)? {
            Some(h) if self.client.read_buf.len() >= h.total => Ok(Some(h)),
            Some(h) => {
                self.client.reserve_for(h.total);
                Ok(None)
            }
            None => Ok(None),
        }
    }

    /// One look at a Query's first word tells whether Fulcrum may answer
    /// it itself (most statements skip every check); its text's length is
    /// handed to routing and to the frame's handling.
    #[inline]
    fn look_at_front(&self, header: FrameHeader) -> QueryLook {
        match header.tag {
            b'Q' => query_look(&self.client.read_buf[5..header.total]),
            _ => QueryLook::default(),
        }
    }

    /// Answers the frame at the front (`total` bytes) when it is one
    /// Fulcrum answers itself, as `look` found it may be: a pid call, a
    /// setting, a causal-token position, LISTEN, a mapped DEALLOCATE or a
    /// deferred transaction control. `Hold` when it must wait for earlier
    /// work's answer.
    async fn answer_front(&mut self, total: usize, look: QueryLook) -> token::PositionAnswer {
        use token::PositionAnswer::{Answered, No};
        let local = look.local;
        if look.pid_call && self.try_answer_pid_call(total) {
            return Answered;
        }
        if local && self.try_answer_setting(total) {
            return Answered;
        }
        if local {
            match self.try_answer_position(total).await {
                No => {}
                answer => return answer,
            }
        }
        if local {
            match self.try_answer_listen(total).await {
                No => {}
                answer => return answer,
            }
        }
        if local && self.server.is_none() && self.try_answer_local_deallocate(total) {
            // A mapped statement's DEALLOCATE needs no server.
            let _ = self.client.read_buf.split_to(total);
            return Answered;
        }
        if local && self.server.is_none() && self.try_defer_transaction_control(total) {
            let _ = self.client.read_buf.split_to(total);
            return Answered;
        }
        No
    }

    /// Routes a new unit behind work still on the attached connection:
    /// the engine is stepped. True when that unit is held until this
    /// connection has answered.
    async fn route_behind(
        &mut self,
        text_len: Option<usize>,
        unit_started: &mut Option<std::time::Instant>,
    ) -> Result<bool, SessionError> {
        let routing = self.route_unit(text_len);
        let was = self.engine.phase();
        let actions = self.engine.step(Event::Unit(routing));
        if self.carry_out(actions).await? == Carried::Held {
            // It needs another connection (a write behind a replica read),
            // or is a read waiting for the position of the write before
            // it: it stays buffered until this connection has answered.
            return Ok(true);
        }
        if was == Phase::Settling {
            // It rides along on the primary connection held for the
            // position query, and counts as a unit.
            let now = self.engine.rides_along(routing.may_write);
            unit_started.get_or_insert(now);
        }
        Ok(false)
    }

    /// Takes the frame at the front (`total` bytes) off the client buffer:
    /// commit ids asked for around it, and it is logged, mirrored and
    /// counted in the unit.
    #[inline]
    fn take_front_frame(&mut self, tag: u8, total: usize) -> BytesMut {
        self.ask_commit_id_ahead(tag, total);
        if tag == b'S' {
            self.ask_commit_id_before_sync();
        }
        let frame = self.client.read_buf.split_to(total);
        self.log_client_frame(tag, &frame);
        if let Some(m) = self.mirror.as_mut() {
            m.client_frame(tag, &frame);
        }
        self.engine.unit_frame(&frame);
        frame
    }

    /// The classification of the unit at the front of the client buffer
    /// (a Query's text `text_len` bytes long, when `query_look` found it);
    /// a Query's whole classification is kept for its session effects. A
    /// Query the result cache looked up is not classified again: its
    /// classification is in `query_unit` already (an unnamed statement's
    /// Parse: in `parse_unit`).
    pub(super) fn next_unit_decision(&mut self, text_len: Option<usize>) -> Decision {
        // A Query whose text `query_look` found (most units): classified
        // from there, with no closure or cell between (the general way
        // below cost about 190 instructions more a unit), and kept where
        // it is made: the classifier's cached one, shared (`classify_shared`).
        if let (Some(b'Q'), Some(n)) = (self.client.read_buf.first(), text_len) {
            // Not UTF-8 (a LATIN1 client's literal): classified all the
            // same (`classify_bytes`).
            let text = &self.client.read_buf[5..5 + n];
            if self.query_unit.is_none() {
                self.query_unit = Some(self.ctx.classify_bytes(text));
            }
            let unit = self.query_unit.as_ref().expect("classified above");
            return self.query_decision(text, unit);
        }
        // What the result cache looked up serves a Query only.
        self.query_unit = None;
        let query_unit = std::cell::RefCell::new(None);
        let decide = |sql: &[u8], unit: Arc<fulcrum_sql::Classified>| {
            let d = self.query_decision(sql, &unit);
            *query_unit.borrow_mut() = Some(unit);
            d
        };
        // The unnamed statement's Parse at the front, as the result cache
        // classified it: the first text `unit_decision` classifies.
        let front_parse = match self.client.read_buf.first() {
            Some(b'P') => self.parse_unit.clone(),
            _ => None,
        };
        let front_parse = std::cell::RefCell::new(front_parse);
        let classify = |sql: &[u8]| {
            let looked_up = front_parse.borrow_mut().take();
            decide(
                sql,
                looked_up.unwrap_or_else(|| self.ctx.classify_bytes(sql)),
            )
        };
        let decision = unit_decision(
            &self.client.read_buf,
            self.ctx.config.max_message_size,
            &classify,
            &self.stmts.map,
            self.stmts.unnamed_decision,
        );
        self.query_unit = query_unit.into_inner();
        decision
    }

    /// The decision for a statement `sql` classified as `unit`: the
    /// cluster's catalog applied; a LISTEN Fulcrum answers itself is a read.
    fn query_decision(&self, sql: &[u8], unit: &fulcrum_sql::Classified) -> Decision {
        let d = self
            .ctx
            .catalog_decision(unit, &self.id.user, &self.id.database);
        if self.listens_locally()
            && notify::is_listen_decision(d)
            && fulcrum_sql::listen::listen_statement(&fulcrum_sql::encoding::statement_text(sql))
                .is_some()
        {
            // Answered by Fulcrum, never run on a server: no pin.
            return Decision::Read;
        }
        d
    }

    /// The one routing decision for the unit at the front of the client
    /// buffer (`fulcrum_session::decide`; a Query's text `text_len` bytes
    /// long, as `query_look` found it).
    pub(super) fn route_unit(&mut self, text_len: Option<usize>) -> Routing {
        let decision = self.next_unit_decision(text_len);
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
            cache_fill: self.cache_fill.is_some(),
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
    /// the deferred BEGIN (if any) going ahead of the unit in the same
    /// write, with no future when a connection is at hand (the usual
    /// unit); `Err`: what is left, for [`Session::attach_unit_wait`].
    pub(super) fn attach_unit_now(&mut self, routing: Routing) -> Result<(), UnitWait> {
        let begin = self.engine.take_begin();
        if let (Some(m), Some(sql)) = (self.mirror.as_mut(), begin.as_deref()) {
            m.begin(sql);
        }
        // A client without a connection is always told where to attach.
        let actions = self.engine.step(Event::Unit(routing));
        match self.carry_out_at_once(actions) {
            Ok(carried) => {
                debug_assert_eq!(carried, Carried::Done, "attached at once");
                self.unit_attached(begin);
                Ok(())
            }
            Err(rest) => Err(UnitWait { begin, rest }),
        }
    }

    /// The rest of [`Session::attach_unit_now`]: the full way of the
    /// attach (`attach_waiting`) or the engine's other actions. Callers
    /// box it: a unit with a connection at hand never takes it, and an
    /// idle client's task does not carry it.
    pub(super) async fn attach_unit_wait(&mut self, wait: UnitWait) -> Result<(), SessionError> {
        let carried = match wait.rest {
            NotAtOnce::Attach(route, pick) => {
                self.attach_waiting(route, pick).await?;
                Carried::Done
            }
            NotAtOnce::Actions(actions) => self.carry_out(actions).await?,
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
        self.unit_attached(wait.begin);
        Ok(())
    }

    /// A unit's connection is attached: the engine is told where, a
    /// replica's unit is armed for a retry, and the deferred BEGIN goes
    /// ahead of it.
    fn unit_attached(&mut self, begin: Option<String>) {
        let actual = self.ctx.router.route_of(self.backend);
        let actions = self.engine.step(Event::Attached(actual));
        self.carry_out_now(actions);
        self.arm_retry(begin.is_some());
        if let Some(sql) = begin {
            if self.engine.replay_on() && self.engine.pinned().is_none() && self.stmts.rewrite {
                // The transaction's log starts with the BEGIN sent ahead.
                self.engine
                    .deferred_begin_sent(self.client.output_position(), sql.clone());
            }
            // The transaction starts on the chosen server, in the same
            // write as its first statement.
            put_query(&mut self.to_server, sql.as_str());
            self.owed.expect.push(Expect::SwallowQuery);
        }
    }

    /// The next client frame starts a unit on an attached connection,
    /// outside a transaction, of an unpinned client.
    fn at_unit_start(&self) -> bool {
        self.engine.status() == Status::Idle
            && !self.owed.unsynced
            && self.engine.pinned().is_none()
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
