//! The unit's server connection: attaching one (the steps are
//! `fulcrum_cluster::attach`'s, the checkout `checkout.rs`'s), telling the
//! engine where it stands after each answer, and giving it back when the
//! unit is over.

use super::*;

/// Why a client whose `client_encoding` Fulcrum cannot lex keeps its
/// server connection (`fulcrum_sql::encoding`).
pub(super) const LEXES_APART: &str =
    "client_encoding is one whose characters may end in an ASCII byte (SJIS, BIG5, GBK, UHC, GB18030, JOHAB)";

impl Session {
    /// Attaches a server connection for `route` (`fulcrum_cluster::attach`:
    /// a replica, else the primary, waited for during a failover).
    pub(super) async fn attach(&mut self, route: Route) -> Result<(), SessionError> {
        if self.server.is_some() || self.attach_now(route) {
            return Ok(());
        }
        // Admin PAUSE (of the cluster or of the client's database) and
        // SWITCHOVER hold new units of work here; the
        // admission is counted until the server connection is checked out.
        let ctx = self.ctx.clone();
        let _admission = match ctx.router.try_admit_to(&self.id.database) {
            Some(a) => a,
            None => ctx.router.admit_to(&self.id.database).await,
        };
        let avoid = self.engine.unit().retry.avoid();
        match fulcrum_cluster::attach::attach(&ctx, route, avoid, self).await {
            Ok(a) => {
                let on_primary = ctx.router.is_primary(a.backend);
                self.engine.attached(on_primary, a.waited_until);
                self.install(a.backend, a.conn);
                Ok(())
            }
            Err(why) => Err(Box::pin(self.unattached(why)).await),
        }
    }

    /// Attaches, without waiting, a connection at hand for `route` that
    /// needs no reset and has the client's settings, when nothing holds
    /// new units (`fulcrum_cluster::attach::at_once`, no future); false,
    /// with nothing changed, when the full way is needed.
    pub(super) fn attach_now(&mut self, route: Route) -> bool {
        let ctx = &self.ctx;
        let Some(_admission) = ctx.router.try_admit_to(&self.id.database) else {
            return false;
        };
        let avoid = self.engine.unit().retry.avoid();
        let desired = &self.params.desired;
        let ready = |c: &ServerConn| !c.reset_due && c.applied == *desired;
        let at_once =
            fulcrum_cluster::attach::at_once(ctx, route, avoid, self.pool.as_ref(), ready);
        let Some((backend, conn)) = at_once else {
            return false;
        };
        // `at_once` takes only the primary's connections.
        self.engine.attached(true, None);
        self.id.entry.counts.waited(std::time::Duration::ZERO);
        self.install(backend, conn);
        true
    }

    /// Makes `server` (of `backend`) the attached connection (the engine
    /// was told first: `Engine::attached`, `Engine::replay_attached`).
    pub(super) fn install(&mut self, backend: BackendId, mut server: Checkout<ServerConn>) {
        self.backend = backend;
        self.id.cancel.set_target(Some(&server.cancel));
        server.prepared.begin_unit();
        self.stmts.unnamed_sent = false;
        server.link(self.id.entry.id);
        let lexes_apart = server.lexes_apart;
        self.server = Some(server);
        self.id.entry.set_active(backend);
        if lexes_apart {
            self.pin(LEXES_APART);
        }
    }

    /// Tells the engine where the attached connection stands after the
    /// latest answer, and gives the connection back when it says so (the
    /// client is between transactions, unpinned, and nothing is owed).
    pub(super) fn maybe_detach(&mut self) {
        if self.server.is_none() {
            return;
        }
        let status = self.engine.status();
        let owed = self.owed();
        // Detach, and a pending drain's Close at a boundary. Mostly
        // nothing (the answer is still coming): no loop over no actions.
        let actions = self.engine.step(Event::Ready { status, owed });
        if !actions.is_empty() {
            self.carry_out_now(actions);
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
        if let Some(mut server) = self.server.take() {
            // `server_reset_query_always`: the next checkout runs it first.
            server.reset_due |= self.ctx.config.server_reset_query_always;
            self.engine.answered();
            self.id.cancel.set_target(None);
            self.record_unit();
            self.id.entry.set_idle();
            // A connection holding more prepared statements than allowed is
            // closed rather than reused: memory on both sides stays bounded.
            let max = self.ctx.config.max_prepared_statements as usize;
            if server.io.read_buf.is_empty() && (max == 0 || server.prepared.len() <= max) {
                cleanup::shed_large_settings(&mut server);
                server.release();
            } else {
                server.discard();
            }
        }
    }

    /// A unit of work is over: its latency, metrics and slow log (once).
    pub(super) fn record_unit(&mut self) {
        if let Some(took) = self.engine.unit_over() {
            self.ctx
                .unit_done(self.backend, took, &self.id.user, &self.id.database);
            self.id.entry.counts.unit(took);
        }
    }

    /// Between transactions with nothing in flight: where a SIGTERM drain
    /// may end the session without cutting any work (the engine's boundary
    /// is never `Lost`: a lost transaction is answered until it ends).
    pub(super) fn at_boundary(&self) -> bool {
        self.engine.at_boundary()
            && self.engine.status() == Status::Idle
            && self.owed() == Owed::Nothing
            && self.client.read_buf.is_empty()
    }

    /// The route label of the attached server (metrics).
    pub(super) fn route_label(&self) -> fulcrum_metrics::RouteLabel {
        self.ctx.route_label(self.backend)
    }

    /// State that cannot be replayed was set: the client keeps its connection.
    pub(super) fn pin(&mut self, reason: &'static str) {
        if self.engine.pinned().is_none() {
            tracing::debug!(target: "fulcrum_pin", reason, "client pinned to its server connection");
        }
        // A client pinned already (session pooling) still has the state
        // recorded: the result cache serves it no more (`state_left`).
        let actions = self.engine.step(Event::Pin(reason));
        self.carry_out_now(actions);
    }
}
