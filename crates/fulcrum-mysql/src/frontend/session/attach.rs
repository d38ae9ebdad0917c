//! Server connections for the session: checking one out for a route (a
//! replica, else the primary, waiting for one during a failover), giving
//! it back, what a lost connection means for the client, and the end of
//! the session.

use super::*;
use fulcrum_session::Outcome;

impl Session {
    /// Between transactions with nothing in flight (a SIGTERM drain may end
    /// the session here): not in a transaction, no command half-read.
    pub(super) fn at_boundary(&self) -> bool {
        !self.in_transaction() && self.client.read_buf.is_empty()
    }

    /// In a transaction, by the server's last answer (or autocommit off).
    pub(super) fn in_transaction(&self) -> bool {
        self.status.contains(StatusFlags::SERVER_STATUS_IN_TRANS)
            || !self.status.contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT)
    }

    /// The route label of the attached server (metrics).
    pub(super) fn route_label(&self) -> fulcrum_metrics::RouteLabel {
        self.ctx.route_label(self.backend)
    }

    pub(super) fn pin(&mut self, reason: &'static str) {
        if self.engine.pinned().is_none() {
            tracing::debug!(reason, "client pinned to its server connection");
            self.engine.step(Event::Pin(reason)).close_now();
        }
    }

    /// Attaches a server connection for `route`: a replica (the primary if
    /// none can be had), or the primary, waiting up to `pool_timeout` for
    /// one during a failover.
    pub(super) async fn attach(&mut self, route: Route, seq: u8) -> Result<(), SessionError> {
        let attach = self.engine.step(Event::Unit(Routing {
            target: Target::Go(route),
            pin: None,
            may_write: self.engine.unit.may_write,
            consistency: self.reads.session(),
        }));
        // The route the engine asks for (a client holding a connection is
        // asked for none and keeps it).
        let route = attach
            .iter()
            .find_map(|a| match a {
                Action::Attach(r) => Some(r),
                _ => None,
            })
            .unwrap_or(route);
        self.attach_to(route, seq).await?;
        let actual = if self.ctx.router.is_primary(self.backend) {
            Route::Primary
        } else {
            Route::Replica
        };
        self.engine.step(Event::Attached(actual)).close_now();
        Ok(())
    }

    async fn attach_to(&mut self, route: Route, seq: u8) -> Result<(), SessionError> {
        if let Some(b) = self.ctx.router.pick(route) {
            if !self.ctx.router.is_primary(b) && self.try_attach(b).await {
                return Ok(());
            }
        }
        let wait = self.ctx.config.pool_timeout;
        let ctx = self.ctx.clone();
        let deadline = tokio::time::Instant::now() + wait;
        let mut primaries = fulcrum_pool::PrimaryWait::new(&ctx.router, deadline, false);
        while let Some((primary, _)) = primaries.next().await {
            match self.checkout(primary).await {
                Ok(server) => {
                    self.install(primary, server);
                    return Ok(());
                }
                Err(PoolError::Connect(e)) if e.is_backend_down() => {
                    primaries.down(primary, e.to_string());
                }
                Err(PoolError::Connect(crate::backend::ConnectError::Server {
                    payload,
                    message,
                    ..
                })) => {
                    write_packet(&mut self.client.write_buf, seq, &payload);
                    let _ = self.flush().await;
                    return Err(SessionError::Refused(message));
                }
                Err(e) => {
                    let msg = format!(
                        "fulcrum: {e} for user '{}' on {}; raise pool_size or pool_timeout for cluster \"{}\"",
                        self.user,
                        self.ctx.address(primary),
                        self.ctx.name()
                    );
                    put_error(&mut self.client.write_buf, seq, codes::CON_COUNT, &msg);
                    let _ = self.flush().await;
                    return Err(SessionError::Refused(msg));
                }
            }
        }
        let why = primaries.why().unwrap_or_else(|| {
            format!(
                "the primary {} is down",
                ctx.address(ctx.router.last_primary())
            )
        });
        let msg = format!(
            "fulcrum: {why}; cluster \"{}\" has no primary to take this work; waited {wait:?}, try again",
            self.ctx.name()
        );
        put_error(
            &mut self.client.write_buf,
            seq,
            codes::SERVER_SHUTDOWN,
            &msg,
        );
        let _ = self.flush().await;
        Err(SessionError::Refused(msg))
    }

    /// A replica's connection, or false when it cannot be had (the replica
    /// is then reported suspect and the work goes to the primary).
    pub(super) async fn try_attach(&mut self, backend: BackendId) -> bool {
        match self.checkout(backend).await {
            Ok(mut server) => {
                if !self.causal_ok(backend, &mut server).await {
                    if server.io.read_buf.is_empty() {
                        server.release();
                    } else {
                        server.discard();
                    }
                    return false;
                }
                self.install(backend, server);
                true
            }
            Err(PoolError::Connect(e)) => {
                tracing::warn!(replica = %self.ctx.address(backend), error = %e, "replica unreachable; using the primary");
                self.ctx.router.suspect(backend);
                false
            }
            Err(_) => false,
        }
    }

    /// Makes `server` (of `backend`) the attached connection.
    pub(super) fn install(&mut self, backend: BackendId, server: Checkout<ServerConn>) {
        self.client_entry.set_active(backend);
        self.backend = backend;
        self.ctx.set_running(
            self.hello.connection_id,
            Some((backend, server.connection_id)),
        );
        self.server = Some(server);
        self.engine.unit.attached();
    }

    pub(super) async fn checkout(
        &self,
        backend: BackendId,
    ) -> Result<Checkout<ServerConn>, PoolError<crate::backend::ConnectError>> {
        let pool = self.ctx.pool(
            backend,
            &self.user,
            self.hello.wire_format,
            self.hello.charset,
        );
        let ctx = self.ctx.clone();
        let (user, wire, charset) = (
            self.user.clone(),
            self.hello.wire_format,
            self.hello.charset,
        );
        pool.get(|| async move { ctx.open(backend, &user, wire, charset).await })
            .await
    }

    /// Returns the server connection to the pool unless the client needs it.
    /// Tells the engine where the connection stands after an answer (in a
    /// transaction or not; still needed for the next command, after an
    /// insert whose id may be asked for), and gives it back when the
    /// engine says so.
    pub(super) fn maybe_detach(&mut self) {
        if self.server.is_none() {
            return;
        }
        let in_txn = self.in_transaction();
        let ready = Event::Ready {
            status: if in_txn {
                Status::InTransaction
            } else {
                Status::Idle
            },
            owed: if self.keep_for_next {
                Owed::Client
            } else {
                Owed::Nothing
            },
        };
        if self.engine.step(ready).contains(Action::Detach) {
            self.detach();
        }
    }

    /// Returns the server connection to the pool.
    pub(super) fn detach(&mut self) {
        if let Some(server) = self.server.take() {
            self.ctx.set_running(self.hello.connection_id, None);
            self.client_entry.set_idle();
            if let Some(took) = self.engine.unit.finished() {
                let schema = self.schema.as_deref().unwrap_or("");
                self.ctx.unit_done(self.backend, took, &self.user, schema);
            }
            // A connection holding more prepared statements than allowed is
            // closed rather than reused: memory on both sides stays bounded.
            let max = self.ctx.config.max_prepared_statements as usize;
            if server.io.read_buf.is_empty() && (max == 0 || server.prepared.len() <= max) {
                server.release();
            } else {
                server.discard();
            }
        }
    }

    /// The server connection died under the client: ERR for the command in
    /// flight; a client that was in a transaction or pinned is disconnected
    /// (its state is gone, and it must not go on as if it were not).
    pub(super) async fn lost(&mut self, seq: u8, why: &str) -> SessionError {
        let backend = self.backend;
        if let Some(s) = self.server.take() {
            s.discard();
        }
        self.ctx.set_running(self.hello.connection_id, None);
        self.ctx.router.suspect(backend);
        let in_txn = self.in_transaction();
        let replayable = self.replayable();
        if self.txn.run.is_some() && !replayable {
            // The replay's own server died past transaction_replay_timeout.
            return self
                .replay_failed("its server was lost too, and its time is up")
                .await;
        }
        if self.txn.log.enabled() && !replayable && in_txn {
            tracing::info!(
                log = self.txn.log.describe(),
                "server lost in a transaction that cannot be replayed"
            );
        }
        // A COMMIT, or a write outside a transaction, may have committed
        // before the connection died: only the server knows (08007). The
        // BEGIN that opens a replayable transaction commits nothing.
        let commit = std::mem::take(&mut self.engine.unit.commit_in_flight);
        let unknown = commit
            || (!in_txn
                && !replayable
                && self.engine.unit.may_write
                && self.ctx.router.is_primary(backend));
        // MySQL can end any answer with an ERR: no "half a message" case.
        let loss = Loss {
            retryable: self.engine.unit.retry.armed(),
            commit_in_flight: unknown,
            batch_open: false,
            mid_message: false,
            replayable,
        };
        let action = self.engine.step(Event::ServerLost(loss)).iter().next();
        if action == Some(Action::Replay) {
            self.txn.lost_seq = seq;
            tracing::warn!(server = %self.ctx.address(backend), %why, "server connection lost in a transaction; replaying it");
            return SessionError::Replay;
        }
        if action == Some(Action::Retry) {
            tracing::warn!(server = %self.ctx.address(backend), "server connection lost before it answered a read");
            self.engine.unit.retry.disarm();
            self.client.write_buf.clear();
            return SessionError::Retry;
        }
        // A transaction or pinned state lost with its connection ends the
        // session (the engine is Lost, or says Close); a lone statement
        // does not.
        // A COMMIT whose outcome is unknown ended the transaction either
        // way: the client knows it is out of it, and keeps its session
        // (as after an autocommit write). Any other transaction lost
        // mid-way ends the session, so that nothing the client sends next
        // runs outside the transaction it believes it is in.
        if commit && action == Some(Action::Fail(Outcome::Unknown)) && self.engine.is_lost() {
            self.engine.step(Event::LostEnded).close_now();
        }
        let ends = !matches!(action, Some(Action::Fail(_))) || self.engine.is_lost();
        let (state, advice) = match action {
            Some(Action::Fail(Outcome::Unknown)) => (*b"08007", Outcome::Unknown.advice()),
            _ if ends => (
                *b"70100",
                "the transaction or session state was lost: reconnect",
            ),
            Some(Action::Fail(outcome)) => (*b"70100", outcome.advice()),
            _ => (*b"70100", Outcome::NotAnswered.advice()),
        };
        let msg = format!(
            "fulcrum: lost the connection to server {} of cluster \"{}\" ({why}); {advice}",
            self.ctx.address(backend),
            self.ctx.name(),
        );
        tracing::warn!(server = %self.ctx.address(backend), sqlstate = %String::from_utf8_lossy(&state), "server connection lost during a client's work");
        // ER_CONNECTION_KILLED (MariaDB's 1927; 2013 is client-side), with
        // SQLSTATE 08007 when the outcome is unknown (docs/failover.md).
        put_err(&mut self.client.write_buf, seq, 1927, state, &msg);
        let _ = self.flush().await;
        self.status = StatusFlags::SERVER_STATUS_AUTOCOMMIT;
        self.keep_for_next = false;
        if ends {
            SessionError::Refused(msg)
        } else {
            SessionError::Recoverable
        }
    }

    /// The client is gone: a connection in a transaction or pinned is closed
    /// (the server rolls back and forgets); otherwise it goes back.
    pub(super) async fn cleanup(&mut self) {
        // The engine says what the connection needs first: a rollback (in
        // a transaction) or a reset (pinned state); either closes it here.
        let clean = self.engine.step(Event::ClientGone).clean();
        if let Some(server) = self.server.take() {
            let dirty =
                clean.is_some_and(|(rollback, reset)| rollback || reset) || self.in_transaction();
            if dirty || !server.io.read_buf.is_empty() {
                server.discard();
            } else {
                server.release();
            }
        }
    }
}
