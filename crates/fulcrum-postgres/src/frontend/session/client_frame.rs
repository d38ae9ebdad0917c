//! One client frame, taken off the client buffer: screened (Terminate, copy
//! data, a DEALLOCATE answered here, an unknown type), queued for the
//! server with what the reply queue is to expect of it, and the per-client
//! limits on settings and prepared statements it is held to.

use super::*;

/// What `screen_query` made of a Query before it is routed.
enum Screened {
    /// It goes on to the server.
    Pass,
    /// Fulcrum answered it (a DEALLOCATE of mapped statements).
    Answered,
    /// It would set more than `max_client_settings`.
    TooManySettings,
}

impl Session {
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
                self.on_copy_frame(tag, frame);
                return Ok(true);
            }
            b'Q' => match self.screen_query(&frame, text_len) {
                Screened::Pass => {}
                Screened::Answered => return Ok(true),
                Screened::TooManySettings => return Err(self.too_many_settings().await),
            },
            b'P' | b'B' | b'D' | b'C' | b'E' | b'S' | b'H' | b'F' => {}
            other => return self.invalid_frame(other).await,
        }
        if self.server.is_none() {
            // The frame is off the buffer: the front is the next one's.
            let routing = self.route_unit(None);
            if let Err(wait) = self.attach_unit_now(routing) {
                Box::pin(self.attach_unit_wait(wait)).await?;
            }
        }
        // A replay sends the logged frames again: they were counted (and
        // their digests stamped) when the client sent them.
        let replaying = self.txn.run.is_some();
        if matches!(tag, b'Q' | b'E' | b'F') && !replaying {
            self.ctx
                .metrics
                .queries(self.backend, self.route_label(), 1);
            self.id.entry.counts.queries(1);
        }
        match tag {
            b'Q' => self.queue_query(frame, text_len, replaying),
            b'F' => self.queue_function_call(frame),
            b'S' => self.queue_sync(frame),
            b'H' => self.queue_flush(frame),
            b'P' if self.one_statement_too_many(&frame) => {
                self.flush_server().await?;
                return Err(self.too_many_statements().await);
            }
            b'P' => self.on_parse(frame),
            b'B' => self.on_bind(frame),
            b'D' | b'C' => self.on_describe_or_close(tag, frame),
            b'E' if self.listen.is_some() && self.virtual_execute(&frame).await => {
                self.owed.unsynced = true;
            }
            b'E' => {
                let Some(ops) = self.execute_effects(&frame) else {
                    self.flush_server().await?;
                    return Err(self.too_many_settings().await);
                };
                self.queue_execute(frame, ops);
            }
            _ => unreachable!("filtered above"),
        }
        Ok(true)
    }

    /// Ends the session of a client that sent a message of unknown type `tag`.
    async fn invalid_frame(&mut self, tag: u8) -> Result<bool, SessionError> {
        let msg = format!("fulcrum: invalid frontend message type {}", tag);
        self.flush_server().await?;
        Err(self.fatal_client(sqlstate::PROTOCOL_VIOLATION, &msg).await)
    }

    /// Copy data, CopyDone or CopyFail: to the server, if there is one
    /// (copy data outside a copy is ignored by servers too).
    #[inline]
    fn on_copy_frame(&mut self, tag: u8, frame: BytesMut) {
        if self.server.is_some() {
            self.queue_to_server(frame);
            if tag != b'd' {
                self.owed.expect.client_copy_end();
            }
        }
    }

    /// A Query before it is routed: its classification says whether it
    /// deallocates (answered here when Fulcrum can) and is kept for the
    /// Query's handling after (one pass).
    #[inline]
    fn screen_query(&mut self, frame: &[u8], text_len: Option<usize>) -> Screened {
        // Read where it is kept (routing classified it already, mostly):
        // not moved out and back.
        if self.query_unit.is_none() {
            let text = text_len.map_or(&[][..], |n| &frame[5..5 + n]);
            self.query_unit = Some(self.query_unit(text));
        }
        let unit = self.query_unit.as_ref().expect("classified above");
        if self.one_setting_too_many(unit.effects.iter().as_slice()) {
            // The session ends: what it was classified as is not needed.
            self.query_unit = None;
            return Screened::TooManySettings;
        }
        let deallocates = unit
            .effects
            .iter()
            .any(|e| matches!(e, Effect::Deallocate(_)));
        if deallocates && self.try_answer_deallocate(&frame[5..]) {
            if let Some(m) = self.mirror.as_mut() {
                // No ReadyForQuery of the server's will answer it.
                m.answered_locally();
            }
            return Screened::Answered;
        }
        Screened::Pass
    }

    /// Queues a simple Query for the server: its commit, writes, digest
    /// stamp and pins are noted, and its session effects are expected with
    /// its answer.
    #[inline]
    fn queue_query(&mut self, frame: BytesMut, text_len: Option<usize>, replaying: bool) {
        let text = text_len.map_or(&[][..], |n| &frame[5..5 + n]);
        let unit = self.query_unit(text);
        if unit.may_commit {
            self.engine.commit_sent();
        }
        self.cache_query_writes(&unit);
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
        let mut replay = Vec::new();
        for effect in unit.effects.iter() {
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

    /// Queues a FunctionCall: a call by the function's OID, nothing tells
    /// what it does to the session (default-deny: the client is pinned).
    fn queue_function_call(&mut self, frame: BytesMut) {
        self.pin("FunctionCall message");
        self.cache_writes(&fulcrum_sql::Writes::Everything);
        self.queue_to_server(frame);
        self.owed.expect.push(Expect::Query(Vec::new(), None));
        self.owed.ready += 1;
    }

    /// Queues a Sync, expecting its ReadyForQuery unless the server will
    /// ignore it (sent during copy-in).
    #[inline]
    fn queue_sync(&mut self, frame: BytesMut) {
        self.queue_to_server(frame);
        // What follows may be on another connection (`ensure_unnamed`).
        self.stmts.unnamed_sent = false;
        if !self.owed.expect.sync_is_ignored() {
            self.owed.expect.push(Expect::Sync);
            self.owed.ready += 1;
            self.owed.unsynced = false;
        }
    }

    /// Queues a Flush: what follows is not yet synced.
    #[inline]
    fn queue_flush(&mut self, frame: BytesMut) {
        self.queue_to_server(frame);
        self.owed.unsynced = true;
    }

    /// The session effects of an Execute (a notifier among them is
    /// recorded); `None` when they would set more than `max_client_settings`.
    #[inline]
    fn execute_effects(&mut self, frame: &[u8]) -> Option<Vec<Effect>> {
        let ops = self.execute_ops(&frame[5..]);
        if ops.contains(&Effect::Notifies) {
            self.record_notifier();
        }
        (!self.one_setting_too_many(&ops)).then_some(ops)
    }

    /// Queues an Execute whose session effects are `ops`, stamped unless
    /// it is replayed.
    #[inline]
    fn queue_execute(&mut self, frame: BytesMut, ops: Vec<Effect>) {
        let replaying = self.txn.run.is_some();
        let stamp = if replaying {
            None
        } else {
            self.execute_stamp(&frame[5..])
        };
        self.queue_to_server(frame);
        self.owed.expect.push(Expect::Execute(ops, stamp));
        self.owed.unsynced = true;
    }

    /// The classification of a simple query's `text`: the one route_unit
    /// made of it, or (on an attached connection) one now, which for a
    /// plain statement is a cache hit. Its effects, may-commit and digest
    /// key are read from it: the text is not scanned again.
    fn query_unit(&mut self, text: &[u8]) -> Arc<fulcrum_sql::Classified> {
        if let Some(unit) = self.query_unit.take() {
            return unit;
        }
        self.ctx.classify_bytes(text)
    }

    /// Whether `effects` would give the client more tracked settings than
    /// `max_client_settings` (each is kept and replayed per connection).
    fn one_setting_too_many(&self, effects: &[Effect]) -> bool {
        if effects.is_empty() {
            // Most statements: nothing to count.
            return false;
        }
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

    /// Ends the session of a client past `max_client_prepared_statements`
    /// (or `max_client_prepared_bytes`).
    async fn too_many_statements(&mut self) -> SessionError {
        let max = self.ctx.config.max_client_prepared_statements;
        let bytes = self.ctx.config.max_client_prepared_bytes;
        let msg = format!(
            "fulcrum: too many prepared statements for one client (max_client_prepared_statements = {max}, max_client_prepared_bytes = {bytes}); close statements the client no longer uses"
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
}
