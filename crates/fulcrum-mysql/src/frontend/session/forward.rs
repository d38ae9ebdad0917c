//! Forwarding one command: attach a connection with the client's schema
//! and settings, write the command, stream the answer back to its end
//! (`reply.rs`), retry a replica read whose server died before answering,
//! and LOAD DATA LOCAL's file packets.

use super::*;

impl Session {
    /// Sends the client's command to its server and its answer back.
    // A function returning its future, not an `async fn`: an `async fn`
    // keeps its arguments twice in its state (as passed and as moved in),
    // bytes every idle client's task carries (issue 44).
    #[allow(clippy::manual_async_fn)] // on purpose: the note above
    pub(super) fn forward<'a>(
        &'a mut self,
        msg: &'a [u8],
        seq: u8,
        shape: Shape,
        routing: Routing,
        mut effects: Effects,
    ) -> impl std::future::Future<Output = Result<(), SessionError>> + 'a {
        async move {
            let fresh = self.server.is_none();
            // Given to each attempt: a retried read is recorded once, by the
            // attempt that got the answer.
            let digest = self.digests.pending.take();
            if !self.ensure_attached(routing, seq).await? {
                return Ok(());
            }
            let retryable = fresh
                && routing.target == Target::Go(Route::Replica)
                && self.engine.pinned().is_none()
                && !self.ctx.router.is_primary(self.backend);
            self.engine.may_retry(retryable, 0);
            let first = self.backend;
            self.digests.pending = digest.clone();
            // By reference: a retry sends the same effects again (the
            // answer that would have used them never came).
            match self.forward_bytes(msg, seq, shape, &mut effects).await {
                Err(SessionError::Retry) => {
                    self.cache_spoil();
                    tracing::info!(replica = %self.ctx.address(first), "replica lost before it answered; the read goes to another backend");
                    // Anywhere but the dead replica (suspect now besides).
                    let attached = self.attach(routing, seq).await;
                    self.engine.retry_sent();
                    attached?;
                    match self.prepare_server(seq).await {
                        Ok(()) => {}
                        Err(Ok(())) => {
                            self.maybe_detach();
                            return Ok(());
                        }
                        Err(Err(e)) => return Err(e),
                    }
                    self.digests.pending = digest;
                    self.forward_bytes(msg, seq, shape, &mut effects).await
                }
                r => {
                    self.engine.answered();
                    r
                }
            }
        }
    }

    /// Attaches a server for `route` if none is attached, with the client's
    /// schema and settings; false when that failed and an ERR was queued.
    pub(super) async fn ensure_attached(
        &mut self,
        routing: Routing,
        seq: u8,
    ) -> Result<bool, SessionError> {
        if self.server.is_none() {
            self.engine.arrived();
        }
        if self.server.is_some() {
            return Ok(true);
        }
        // Admin PAUSE (and SWITCHOVER) holds new units of work here; the
        // admission is counted until the server connection is checked out.
        let admission = match self.ctx.router.try_admit() {
            Some(a) => a,
            None => self.ctx.router.admit().await,
        };
        self.attach(routing, seq).await?;
        drop(admission);
        match self.prepare_server(seq).await {
            Ok(()) => Ok(true),
            Err(Ok(())) => {
                self.maybe_detach();
                Ok(false)
            }
            Err(Err(e)) => Err(e),
        }
    }

    /// Writes `msg` to the attached server and streams its answer back.
    // A function returning its future, not an `async fn`: an `async fn`
    // keeps its arguments twice in its state (as passed and as moved in),
    // bytes every idle client's task carries (issue 44).
    #[allow(clippy::manual_async_fn)] // on purpose: the note above
    pub(super) fn forward_bytes<'a>(
        &'a mut self,
        msg: &'a [u8],
        seq: u8,
        shape: Shape,
        effects: &'a mut Effects,
    ) -> impl std::future::Future<Output = Result<(), SessionError>> + 'a {
        async move {
            let replaying = self.txn.run.is_some();
            let kept_for_this = self.engine.command_sent();
            let stamp = self.count_and_stamp(msg, replaying);
            let server = self.server.as_mut().expect("attached");
            if server.io.send(msg).await.is_err() {
                return Err(self.lost(seq, "writing to the server failed").await);
            }
            if let Some(t) = self.engine.forwarded() {
                self.ctx.metrics.proxy.observe(t.elapsed().as_secs_f64());
            }
            let mut reply = Reply::new(shape, server.caps);
            // `[[cluster.mirror]]`: the answer's rows are summed up for the diff.
            let mirroring = self.digests.mirror.is_some() && !replaying;
            let sent_at = std::time::Instant::now();
            let skip = self
                .relay_answer(seq, &mut reply, effects.thread_ids, mirroring)
                .await?;
            if mirroring {
                if let Some(m) = self.digests.mirror.as_mut() {
                    m.answered(msg, &reply, sent_at, skip);
                    if m.waiting() {
                        // `mirror_mode = "sync"`: the answer waits for the mirror's.
                        m.wait().await;
                    }
                }
            }
            // Answered: whatever it was, its outcome is known. The answer's end
            // is read from the clock once, for its digest and the unit's end.
            self.engine.commit_answered();
            self.engine.new_wake();
            if let Some(stamp) = stamp {
                stamp.finish(reply.rows, reply.error, self.engine.now());
            }
            if let Some(status) = reply.status {
                self.set_status(status);
            }
            // Before the client can see the answer's end.
            self.cache_answered();
            if !reply.error || reply.last_gtid.is_some() {
                let target = self.unit_routing.target;
                self.after_primary_answer(reply.last_gtid.take(), target, effects.keep_next)
                    .await?;
            }
            if let Some(code) = reply.error_code {
                self.ctx.metrics.error(&code.to_string());
            }
            if !reply.error {
                self.record_effects(effects.set.take(), effects.schema.take());
            }
            // An insert's id may be asked for next (LAST_INSERT_ID()): same connection.
            self.engine.answer_keeps(
                reply.last_insert_id != 0 || effects.keep_next,
                kept_for_this,
            );
            // In a transaction the engine keeps the connection; it learns the
            // status from every answer.
            self.maybe_detach();
            Ok(())
        }
    }

    /// Counts a COM_QUERY or COM_STMT_EXECUTE about to go to the server
    /// and takes the pending digest's stamp. Neither for a replay: it sends
    /// the logged commands again, counted (and their digests stamped) when
    /// the client sent them.
    fn count_and_stamp(&mut self, msg: &[u8], replaying: bool) -> Option<fulcrum_metrics::Stamp> {
        if matches!(msg.get(HEADER_LEN), Some(&0x03) | Some(&0x17)) && !replaying {
            self.ctx
                .metrics
                .queries(self.backend, self.route_label(), 1);
            self.client_entry.counts.queries(1);
        }
        self.digests
            .pending
            .take()
            .filter(|_| !replaying)
            .map(|digest| {
                let primary = self.ctx.router.is_primary(self.backend);
                fulcrum_metrics::Stamp::new(digest, self.engine.now(), primary)
            })
    }

    /// Streams the server's answer to the client up to its end (`reply`
    /// says where that is): rows summed up for the mirror, a process
    /// list's thread ids translated (`thread_ids`), LOAD DATA LOCAL's file
    /// sent when asked for. True when the answer asked for a file (the
    /// mirror skips it).
    async fn relay_answer(
        &mut self,
        seq: u8,
        reply: &mut Reply,
        thread_ids: bool,
        mirroring: bool,
    ) -> Result<bool, SessionError> {
        let max = self.ctx.config.max_message_size as usize;
        let mut skip = false;
        // A process list: its thread ids become clients' ids (`identity.rs`).
        let mut ids = thread_ids
            .then(|| super::identity::ThreadIds::new(self.ctx.thread_owners(self.backend)));
        // Bytes relayed, counted once per answer.
        let mut sent = 0u64;
        while !reply.is_done() {
            // A message already whole in the buffer (most of an answer's:
            // one read brings several) is taken without the read's future.
            let server = self.server.as_ref().expect("attached");
            let total = match scan_message(&server.io.read_buf, max.max(MAX_PAYLOAD)) {
                Ok(Some(span)) => span.total,
                _ => self.next_server_span(seq, max).await?,
            };
            // The message is read where it lies in the server buffer and
            // copied once, to the client's (no split, no reference count).
            let server = self.server.as_mut().expect("attached");
            let frame = &server.io.read_buf[..total];
            let first = &frame[HEADER_LEN..HEADER_LEN + (total - HEADER_LEN).min(MAX_PAYLOAD)];
            let was_row = reply.in_rows();
            let column = reply.next_is_column();
            if let Err(e) = reply.on_message(first) {
                return Err(self.lost(seq, &e.0).await);
            }
            let row = was_row && reply.in_rows();
            if row && mirroring {
                if let Some(m) = self.digests.mirror.as_mut() {
                    m.row(first);
                }
            }
            let mut translated = None;
            if let Some(ids) = ids.as_mut() {
                if column {
                    ids.column(first);
                } else if row {
                    translated = ids.row(frame);
                }
            }
            if let Some(c) = self.cache.fill.as_mut() {
                c.message(frame, first, reply, translated.is_some());
            }
            let frame = translated.as_deref().unwrap_or(frame);
            sent += frame.len() as u64;
            self.client.write_buf.extend_from_slice(frame);
            bytes::Buf::advance(&mut server.io.read_buf, total);
            skip |= reply.wants_file();
            if reply.wants_file() || self.client.write_buf.len() >= FLUSH_AT {
                self.count_sent(std::mem::take(&mut sent));
            }
            if reply.wants_file() {
                self.flush().await?;
                self.send_file(seq).await?;
                reply.file_sent();
            } else if self.client.write_buf.len() >= FLUSH_AT {
                self.flush().await?;
            }
        }
        self.count_sent(sent);
        Ok(skip)
    }

    /// Bytes relayed to the client: the metric and the client's counter.
    fn count_sent(&mut self, n: u64) {
        if n > 0 {
            self.ctx.metrics.bytes_out.inc_by(n);
            self.client_entry.counts.sent(n);
        }
    }

    /// A successful command's session changes: its `SET` statement joins
    /// those replayed (and is applied on the attached connection), its
    /// schema becomes the client's and the connection's.
    fn record_effects(&mut self, set: Option<String>, schema: Option<String>) {
        let server = self.server.as_mut().expect("attached");
        if let Some(set) = set {
            if let Some(t) = crate::codec::wait_timeout::session_wait_timeout(&set) {
                self.wait_timeout = Some(t);
            }
            let lexes_apart = fulcrum_sql::encoding::mysql_set_lexes_apart(&set);
            self.desired.push(set);
            server.applied = self.desired.clone();
            if lexes_apart {
                self.pin(super::attach::LEXES_APART);
            }
        }
        let server = self.server.as_mut().expect("attached");
        if let Some(schema) = schema {
            server.schema = Some(schema.clone());
            self.schema = Some(schema);
        }
    }

    /// LOAD DATA LOCAL INFILE: the client's packets go to the server as they
    /// come, up to the empty packet that ends the file.
    pub(super) async fn send_file(&mut self, seq: u8) -> Result<(), SessionError> {
        loop {
            let header = loop {
                match crate::codec::packet::check_packet(&self.client.read_buf, MAX_PAYLOAD) {
                    Ok(Some(h)) if self.client.read_buf.len() >= HEADER_LEN + h.len => break h,
                    Ok(_) => {
                        if self.client.read_buf.capacity() - self.client.read_buf.len() < 4096 {
                            self.client.read_buf.reserve(64 * 1024);
                        }
                        if self.client.read_more().await? == 0 {
                            return Err(SessionError::ClientGone);
                        }
                    }
                    Err(e) => return Err(SessionError::Refused(format!("bad file packet: {e}"))),
                }
            };
            let packet = self.client.read_buf.split_to(HEADER_LEN + header.len);
            let server = self.server.as_mut().expect("attached");
            if server.io.send(&packet).await.is_err() {
                return Err(self.lost(seq, "writing to the server failed").await);
            }
            if header.len == 0 {
                return Ok(());
            }
        }
    }

    /// The next whole message from the attached server.
    pub(super) async fn next_server_message(
        &mut self,
        seq: u8,
        max: usize,
    ) -> Result<BytesMut, SessionError> {
        let total = self.next_server_span(seq, max).await?;
        let server = self.server.as_mut().expect("attached");
        Ok(server.io.read_buf.split_to(total))
    }

    /// Reads until a whole message is at the front of the server buffer
    /// and gives its length (header included), leaving it there.
    pub(super) async fn next_server_span(
        &mut self,
        seq: u8,
        max: usize,
    ) -> Result<usize, SessionError> {
        let limit = self.ctx.config.query_timeout;
        // Only with `query_timeout` set: no reference counts touched per
        // message otherwise.
        let killer = limit.map(|_| {
            (
                self.ctx.clone(),
                self.backend,
                self.user.clone(),
                self.hello.wire_format,
                self.hello.charset,
            )
        });
        let server: &mut ServerConn = self.server.as_mut().expect("attached");
        let thread = server.connection_id;
        let mut killed = false;
        let span = loop {
            match scan_message(&server.io.read_buf, max.max(MAX_PAYLOAD)) {
                Ok(Some(span)) => break span,
                Ok(None) => {
                    let read = server.io.read_more();
                    let read = match limit.filter(|_| !killed) {
                        None => read.await,
                        Some(limit) => match tokio::time::timeout(limit, read).await {
                            Ok(r) => r,
                            Err(_) => {
                                // `query_timeout`: the server has been silent
                                // this long; KILL QUERY it, then read on (its
                                // ERR 1317 reaches the client).
                                killed = true;
                                if let Some(killer) = killer.clone() {
                                    kill_query(killer, thread, limit);
                                }
                                continue;
                            }
                        },
                    };
                    match read {
                        Ok(n) if n > 0 => {}
                        _ => return Err(self.lost(seq, "the server closed the connection").await),
                    }
                }
                Err(e) => return Err(self.lost(seq, &e.to_string()).await),
            }
        };
        Ok(span.total)
    }

    /// Gives the attached server the client's schema and session settings.
    /// Usually it has them already (the client's own connection, or one
    /// with the same schema and no settings): that is checked first, with
    /// no copy and no future; the round trips are made out of line.
    pub(super) async fn prepare_server(&mut self, seq: u8) -> Result<(), Result<(), SessionError>> {
        let server = self.server.as_ref().expect("attached");
        let schema_there = match &self.schema {
            Some(schema) => server.schema.as_deref() == Some(schema.as_str()),
            None => true,
        };
        if schema_there && server.applied == self.desired {
            return Ok(());
        }
        Box::pin(self.apply_to_server(seq)).await
    }

    /// `prepare_server`'s round trips: `USE` and the session settings.
    async fn apply_to_server(&mut self, seq: u8) -> Result<(), Result<(), SessionError>> {
        let server = self.server.as_mut().expect("attached");
        let (schema, desired) = (self.schema.clone(), self.desired.clone());
        let result = async {
            if let Some(schema) = &schema {
                if server.schema.as_deref() != Some(schema.as_str()) {
                    server.use_schema(schema).await?;
                }
            }
            if server.applied != desired {
                server.sync_session(&desired).await?;
                if let Some(schema) = &schema {
                    server.use_schema(schema).await?;
                }
            }
            Ok::<(), InternalError>(())
        }
        .await;
        match result {
            Ok(()) => Ok(()),
            Err(InternalError::Server { payload, .. }) => {
                write_packet(&mut self.client.write_buf, seq, &payload);
                Err(Ok(()))
            }
            Err(e) => Err(Err(self.lost(seq, &e.to_string()).await)),
        }
    }

    pub(super) async fn flush(&mut self) -> Result<(), SessionError> {
        if !self.replay_gate().await? {
            // A replay is under way: its answers are compared, not sent.
            return Ok(());
        }
        if !self.client.write_buf.is_empty() {
            self.engine.answered();
            self.client.flush().await?;
        }
        Ok(())
    }
}

/// `query_timeout`: `KILL QUERY <thread>` on a fresh connection to the same
/// backend, as the client's user (who may kill its own threads).
fn kill_query(
    (ctx, backend, user, wire_format, charset): (Arc<MyClusterContext>, BackendId, Arc<str>, C, u8),
    thread: u32,
    limit: std::time::Duration,
) {
    ctx.metrics.timeout("query");
    tracing::info!(user = ?user, cluster = %ctx.config.name, ?limit, "query_timeout: killing the query on the server");
    tokio::spawn(async move {
        let result = match ctx.open(backend, &user, wire_format, charset).await {
            Ok(mut conn) => conn
                .run_simple(
                    crate::codec::command::Command::Query,
                    format!("KILL QUERY {thread}").as_bytes(),
                )
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "query_timeout: KILL QUERY failed");
        }
    });
}
