//! Attaching a server connection for a unit of work (a replica, else the
//! primary, waiting for one during a failover), and giving it back when
//! the unit is over.

use super::*;

impl Session {
    pub(super) async fn attach(&mut self, route: Route) -> Result<(), SessionError> {
        if self.server.is_some() {
            return Ok(());
        }
        // Admin PAUSE (and SWITCHOVER) holds new units of work here; the
        // admission is counted until the server connection is checked out.
        let _admission = self.ctx.router.admit().await;
        if let Some(backend) = self.ctx.router.pick(route) {
            if !self.ctx.router.is_primary(backend)
                && self.engine.unit.retry.avoid() != Some(backend)
            {
                match self.try_attach_replica(backend).await {
                    Ok(true) => return Ok(()),
                    Ok(false) => {} // fall back to the primary below
                    Err(e) => return Err(e),
                }
            }
        }
        self.attach_primary().await?;
        self.engine.unit.wrote_on_primary = self.engine.unit.may_write;
        Ok(())
    }

    /// Attaches to the primary. With none now (it is down, or a failover is
    /// under way), or when it cannot be reached, waits up to `pool_timeout`
    /// for the health loop to name one: the client has sent nothing to any
    /// server yet, so nothing is lost by waiting.
    pub(super) async fn attach_primary(&mut self) -> Result<(), SessionError> {
        let wait = self.ctx.config.pool_timeout;
        let ctx = self.ctx.clone();
        // The caller holds the admission already.
        let deadline = tokio::time::Instant::now() + wait;
        let mut primaries = fulcrum_pool::PrimaryWait::new(&ctx.router, deadline, false);
        while let Some((primary, _)) = primaries.next().await {
            match self.attach_to(primary).await {
                Err(SessionError::BackendDown(why)) => primaries.down(primary, why),
                r => return r,
            }
        }
        let why = primaries.why().unwrap_or_else(|| {
            format!(
                "the primary {} is down",
                ctx.backends[ctx.router.last_primary()]
            )
        });
        let msg = format!(
            "fulcrum: {why}; cluster \"{}\" has no primary to take this work (it is down{}); waited {:?}, try again",
            self.ctx.name(),
            if self.ctx.config.health.failover == fulcrum_config::Failover::None {
                ""
            } else {
                ", or a failover is under way"
            },
            wait
        );
        Err(self.fatal_client(sqlstate::CONNECTION_FAILURE, &msg).await)
    }

    /// Attaches to a replica; `Ok(false)` when it cannot be reached (it is
    /// then skipped for a while and the read goes to the primary).
    pub(super) async fn try_attach_replica(
        &mut self,
        backend: BackendId,
    ) -> Result<bool, SessionError> {
        let pool = self.ctx.pool(backend, &self.id.user, &self.id.database);
        let ctx = self.ctx.clone();
        let (user, database) = (self.id.user.clone(), self.id.database.clone());
        match pool
            .get(|| async move { ctx.open(backend, &user, &database).await })
            .await
        {
            Ok(mut server) => {
                if server.applied != self.params.desired
                    && sync_params(&mut server, &self.params.desired)
                        .await
                        .is_err()
                {
                    server.discard();
                    return Ok(false);
                }
                if route_is_causal(self.reads.for_unit())
                    && self.causal_check(backend, &mut server).await
                        == fulcrum_session::Check::Primary
                {
                    if server.io.read_buf.is_empty() {
                        server.release();
                    } else {
                        server.discard();
                    }
                    return Ok(false);
                }
                self.engine.unit.wrote_on_primary = false;
                self.backend = backend;
                self.id.cancel.set_target(Some(server.cancel.clone()));
                server.prepared.begin_unit();
                self.server = Some(server);
                self.engine.unit.attached();
                self.id.entry.set_active(backend);
                Ok(true)
            }
            Err(PoolError::Connect(e)) if e.is_backend_down() => {
                tracing::warn!(replica = %self.ctx.backends[backend], error = %e, "replica unreachable; reads go elsewhere until the health check admits it again");
                self.ctx.router.suspect(backend);
                Ok(false)
            }
            Err(PoolError::Connect(e)) => {
                tracing::warn!(replica = %self.ctx.backends[backend], error = %e, "replica refused the connection; using the primary");
                self.ctx
                    .forget_pool_if_empty(backend, &self.id.user, &self.id.database);
                self.ctx.router.ban(backend, REPLICA_BAN);
                Ok(false)
            }
            Err(PoolError::Timeout(..) | PoolError::Budget(..) | PoolError::Closed) => Ok(false),
        }
    }

    pub(super) async fn attach_to(&mut self, backend: BackendId) -> Result<(), SessionError> {
        self.backend = backend;
        // The pool handle is kept per backend: no map lookup per transaction.
        let pool = match &self.pool {
            Some((b, p)) if *b == backend => p.clone(),
            _ => {
                let p = self.ctx.pool(backend, &self.id.user, &self.id.database);
                self.pool = Some((backend, p.clone()));
                p
            }
        };
        let ctx = self.ctx.clone();
        let (user, database) = (self.id.user.clone(), self.id.database.clone());
        let waited = std::time::Instant::now();
        self.ctx.metrics.waiting.inc();
        self.id.entry.set_waiting();
        let checkout = pool
            .get(|| async move { ctx.open(backend, &user, &database).await })
            .await;
        self.ctx.metrics.waiting.dec();
        self.ctx
            .metrics
            .pool_wait
            .observe(waited.elapsed().as_secs_f64());
        let mut server = match checkout {
            Ok(s) => s,
            Err(PoolError::Connect(ConnectError::Server { fields, .. }))
                if fields.code.starts_with("57P") && self.stmts.rewrite =>
            {
                // Shutting down, starting up or in recovery: as good as down
                // for this unit, which may wait for the primary to come back.
                tracing::warn!(code = %fields.code, cluster = self.ctx.name(), message = ?fields.message, "primary refused new connections");
                return Err(SessionError::BackendDown(format!(
                    "{} (primary of cluster \"{}\") refused the connection: {} ({})",
                    self.ctx.backends[backend],
                    self.ctx.name(),
                    fields.message,
                    fields.code
                )));
            }
            Err(PoolError::Connect(ConnectError::Server { frame, fields, .. })) => {
                // The server's own refusal (e.g. 3D000 unknown database): pass it on unchanged.
                tracing::info!(code = %fields.code, message = ?fields.message, "server refused login");
                self.pool = None;
                self.ctx
                    .forget_pool_if_empty(backend, &self.id.user, &self.id.database);
                self.client.queue(&frame);
                let _ = self.client.flush().await;
                return Err(SessionError::Refused(fields.message));
            }
            Err(PoolError::Connect(e)) if e.is_backend_down() => {
                tracing::warn!(error = %e, cluster = self.ctx.name(), "cannot reach the primary");
                return Err(SessionError::BackendDown(format!(
                    "cannot open a connection to {} (primary of cluster \"{}\"): {e}",
                    self.ctx.backends[backend],
                    self.ctx.name()
                )));
            }
            Err(PoolError::Connect(e)) => {
                tracing::warn!(error = %e, cluster = self.ctx.name(), "cannot open server connection");
                let msg = format!(
                    "fulcrum: cannot open a connection to {} (primary of cluster \"{}\"): {}; the server may be down, try again when it is back",
                    self.ctx.backends[backend],
                    self.ctx.name(),
                    e
                );
                let code = if e.is_backend_down() {
                    sqlstate::CONNECTION_FAILURE
                } else {
                    sqlstate::CANNOT_CONNECT_NOW
                };
                return Err(self.fatal_client(code, &msg).await);
            }
            Err(e @ PoolError::Timeout(..)) | Err(e @ PoolError::Closed) => {
                let msg = format!(
                    "fulcrum: {e} for user \"{}\" database \"{}\" on {}; raise pool_size or pool_timeout for cluster \"{}\"",
                    self.id.user,
                    self.id.database,
                    self.ctx.backends[backend],
                    self.ctx.name()
                );
                return Err(self
                    .fatal_client(sqlstate::TOO_MANY_CONNECTIONS, &msg)
                    .await);
            }
            Err(e @ PoolError::Budget(..)) => {
                let msg = format!(
                    "fulcrum: {e} on {}; raise it or pool_timeout for cluster \"{}\"",
                    self.ctx.backends[backend],
                    self.ctx.name()
                );
                return Err(self
                    .fatal_client(sqlstate::TOO_MANY_CONNECTIONS, &msg)
                    .await);
            }
        };
        if server.applied != self.params.desired {
            if let Err(e) = sync_params(&mut server, &self.params.desired).await {
                return Err(match e {
                    InternalError::Server { frame, fields } => {
                        self.client.queue(&frame);
                        let _ = self.client.flush().await;
                        SessionError::Refused(fields.message)
                    }
                    other => {
                        server.discard();
                        let msg = format!("fulcrum: server connection failed while restoring session settings: {other}");
                        self.fatal_client(sqlstate::CONNECTION_FAILURE, &msg).await
                    }
                });
            }
        }
        self.install(backend, server);
        Ok(())
    }

    /// Makes `server` (of `backend`) the attached connection.
    pub(super) fn install(&mut self, backend: BackendId, mut server: Checkout<ServerConn>) {
        self.backend = backend;
        self.id.cancel.set_target(Some(server.cancel.clone()));
        server.prepared.begin_unit();
        self.server = Some(server);
        self.engine.unit.attached();
        self.id.entry.set_active(backend);
    }

    /// Tells the engine where the attached connection stands after the
    /// latest answer, and gives the connection back when it says so (the
    /// client is between transactions, unpinned, and nothing is owed).
    pub(super) fn maybe_detach(&mut self) {
        if self.server.is_none() {
            return;
        }
        let status = match self.status {
            b'I' => Status::Idle,
            b'E' => Status::Failed,
            _ => Status::InTransaction,
        };
        let owed = self.owed();
        if self
            .engine
            .step(Event::Ready { status, owed })
            .contains(Action::Detach)
        {
            self.detach();
        }
    }

    /// What the attached connection still owes.
    pub(super) fn owed(&self) -> Owed {
        if self.owed.ready == 0
            && !self.owed.unsynced
            && self.owed.stream_left == 0
            && self.owed.expect.is_empty()
        {
            Owed::Nothing
        } else if self.owed.ready == 0
            && !self.owed.unsynced
            && self.owed.stream_left == 0
            && self.owed.expect.only_position()
        {
            Owed::OwnQuery
        } else {
            Owed::Client
        }
    }

    /// Returns the server connection to the pool.
    pub(super) fn detach(&mut self) {
        if let Some(server) = self.server.take() {
            self.engine.unit.retry.disarm();
            self.id.cancel.set_target(None);
            self.record_unit();
            self.id.entry.set_idle();
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

    /// A unit of work is over: its latency, metrics and slow log (once).
    pub(super) fn record_unit(&mut self) {
        if let Some(took) = self.engine.unit.finished() {
            self.ctx
                .unit_done(self.backend, took, &self.id.user, &self.id.database);
        }
    }

    /// Between transactions with nothing in flight: where a SIGTERM drain
    /// may end the session without cutting any work.
    pub(super) fn at_boundary(&self) -> bool {
        self.engine.at_boundary()
            && self.status == b'I'
            && self.owed() == Owed::Nothing
            && self.lost.is_none()
            && self.client.read_buf.is_empty()
    }

    /// The route label of the attached server (metrics).
    pub(super) fn route_label(&self) -> fulcrum_metrics::RouteLabel {
        self.ctx.route_label(self.backend)
    }

    /// State that cannot be replayed was set: the client keeps its connection.
    pub(super) fn pin(&mut self, reason: &'static str) {
        if self.engine.pinned().is_none() {
            tracing::debug!(reason, "client pinned to its server connection");
            self.engine.step(Event::Pin(reason)).close_now();
        }
    }
}
