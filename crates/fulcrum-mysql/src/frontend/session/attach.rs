//! The session's server connection: attaching one for a route (the steps
//! are `fulcrum_cluster::attach`'s, the checkout `checkout.rs`'s), telling
//! the engine where it stands after each answer, and giving it back.

use super::*;

/// Why a client whose character set Fulcrum cannot lex keeps its server
/// connection (`fulcrum_sql::encoding`).
pub(super) const LEXES_APART: &str =
    "a character set whose characters may end in a backslash (big5, cp932, gbk, sjis, gb18030)";

impl Session {
    /// Between transactions with nothing in flight (a SIGTERM drain may end
    /// the session here): not in a transaction, no command half-read.
    pub(super) fn at_boundary(&self) -> bool {
        !self.in_transaction() && self.client.read_buf.is_empty()
    }

    /// In a transaction, as the engine was last told (autocommit off
    /// counts as one).
    pub(super) fn in_transaction(&self) -> bool {
        self.engine.status() != Status::Idle
    }

    /// The status flags of the server's last answer (or of Fulcrum's own
    /// in its place): kept for the OK and EOF packets Fulcrum writes, and
    /// told to the engine as the client's transaction status.
    pub(super) fn set_status(&mut self, flags: StatusFlags) {
        self.status = flags;
        let open = flags.contains(StatusFlags::SERVER_STATUS_IN_TRANS)
            || !flags.contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT);
        self.engine.told(if open {
            Status::InTransaction
        } else {
            Status::Idle
        });
        self.cache_txn_answered();
    }

    /// The route label of the attached server (metrics).
    pub(super) fn route_label(&self) -> fulcrum_metrics::RouteLabel {
        self.ctx.route_label(self.backend)
    }

    pub(super) fn pin(&mut self, reason: &'static str) {
        if self.engine.pinned().is_none() {
            tracing::debug!(target: "fulcrum_pin", reason, "client pinned to its server connection");
        }
        // A client pinned already (session pooling) still has the state
        // recorded: the result cache serves it no more (`state_left`).
        let actions = self.engine.step(Event::Pin(reason));
        let carried = self.carry_out_now(actions);
        debug_assert_eq!(carried, Carried::Done, "Pin answers nothing");
    }

    /// Attaches a server connection for a unit routed `routing` (the
    /// engine says where: a replica, the primary if none can be had, or the
    /// primary, waited for up to `pool_timeout` during a failover); a
    /// retried read avoids the replica that was lost under it.
    pub(super) async fn attach(&mut self, routing: Routing, seq: u8) -> Result<(), SessionError> {
        let holding = self.server.is_some();
        // Attach: a client without a connection is always told where.
        let actions = self.engine.step(Event::Unit(routing));
        let carried = match self.carry_out_at_once(actions) {
            Ok(carried) => carried,
            Err(actions) => self.carry_out(actions, seq).await?,
        };
        debug_assert_eq!(carried, Carried::Done, "a unit answers nothing");
        if holding {
            // A client holding its connection is asked for none.
            return Ok(());
        }
        if self.server.is_none() {
            debug_assert!(false, "no route for a client without a connection");
            self.check_out(Route::Primary, seq).await?;
        }
        let actual = self.ctx.router.route_of(self.backend);
        let actions = self.engine.step(Event::Attached(actual));
        let carried = self.carry_out_now(actions);
        debug_assert_eq!(carried, Carried::Done, "Attached answers nothing");
        if !fulcrum_sql::encoding::mysql_collation_lexes_like_the_server(self.hello.charset) {
            self.pin(LEXES_APART);
        }
        Ok(())
    }

    /// Checks out a server connection for `route` and makes it the
    /// attached one (the engine's `Attach`).
    pub(super) async fn check_out(&mut self, route: Route, seq: u8) -> Result<(), SessionError> {
        if self.check_out_now(route) {
            return Ok(());
        }
        let ctx = self.ctx.clone();
        let avoid = self.engine.unit().retry.avoid();
        // Nothing at hand: the wait (or the connect) is a boxed future,
        // allocated when it runs, not carried by every idle client's task.
        let attached = Box::pin(fulcrum_cluster::attach::attach(&ctx, route, avoid, self)).await;
        match attached {
            Ok(a) => {
                let on_primary = ctx.router.is_primary(a.backend);
                self.engine.attached(on_primary, a.waited_until);
                self.install(a.backend, a.conn)
            }
            Err(why) => return Err(Box::pin(self.unattached(why, seq)).await),
        }
        Ok(())
    }

    /// Checks out, without waiting, a connection at hand for `route` (the
    /// schema and settings are made the client's after, as for any):
    /// `fulcrum_cluster::attach::at_once`, no future. False, with nothing
    /// changed, when the full way is needed.
    pub(super) fn check_out_now(&mut self, route: Route) -> bool {
        let avoid = self.engine.unit().retry.avoid();
        let at_once =
            fulcrum_cluster::attach::at_once(&self.ctx, route, avoid, self.pool.as_ref(), |_| true);
        let Some((backend, conn)) = at_once else {
            return false;
        };
        // `at_once` takes only the primary's connections.
        self.engine.attached(true, None);
        self.client_entry.counts.waited(std::time::Duration::ZERO);
        self.install(backend, conn);
        true
    }

    /// Makes `server` (of `backend`) the attached connection (the engine
    /// was told first: `Engine::attached`, `Engine::replay_attached`).
    pub(super) fn install(&mut self, backend: BackendId, server: Checkout<ServerConn>) {
        self.client_entry.set_active(backend);
        server.link(self.client_entry.id);
        self.backend = backend;
        self.set_running(Some((backend, server.connection_id)));
        self.server = Some(server);
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
            // The engine counts a connection kept for the next command.
            owed: Owed::Nothing,
        };
        // Detach, and a pending drain's Close at a boundary.
        let actions = self.engine.step(ready);
        let carried = self.carry_out_now(actions);
        debug_assert_eq!(carried, Carried::Done, "Ready answers nothing");
    }

    /// Returns the server connection to the pool.
    pub(super) fn detach(&mut self) {
        if let Some(server) = self.server.take() {
            self.set_running(None);
            self.client_entry.set_idle();
            if let Some(took) = self.engine.unit_over() {
                let schema = self.schema.as_deref().unwrap_or("");
                self.ctx.unit_done(self.backend, took, &self.user, schema);
                self.client_entry.counts.unit(took);
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
}
