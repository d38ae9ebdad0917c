//! The unit's server connection: attaching one (the steps are
//! `fulcrum_cluster::attach`'s, the checkout `checkout.rs`'s), telling the
//! engine where it stands after each answer, and giving it back when the
//! unit is over.

use super::*;

/// Why a client whose `client_encoding` Fulcrum cannot lex keeps its
/// server connection (`fulcrum_sql::encoding`).
pub(super) const LEXES_APART: &str =
    "client_encoding is one whose characters may end in an ASCII byte (SJIS, BIG5, GBK, UHC, GB18030, JOHAB)";

/// Where the full way of an attach starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pick {
    /// Nothing picked yet: the full way asks the router.
    Later,
    /// The router's pick for a read (`Router::pick`), made already: a
    /// pick moves the balancing, so it is made once a unit.
    Made(Option<BackendId>),
}

impl Session {
    /// Attaches a server connection for `route` (`fulcrum_cluster::attach`:
    /// a replica, else the primary, waited for during a failover): one at
    /// hand at once (`attach_now`), else the full way, boxed.
    pub(super) async fn attach(&mut self, route: Route) -> Result<(), SessionError> {
        if self.server.is_some() {
            return Ok(());
        }
        match self.attach_now(route) {
            Ok(()) => Ok(()),
            Err(pick) => Box::pin(self.attach_waiting(route, pick)).await,
        }
    }

    /// The full way of an attach: the pause gate, a checkout that may wait
    /// or connect, a replica's position check, the primary waited for. Its
    /// state is over a kilobyte: callers box it, so it is allocated when a
    /// unit takes it, not carried by every idle client's task (issue 44).
    pub(super) async fn attach_waiting(
        &mut self,
        route: Route,
        pick: Pick,
    ) -> Result<(), SessionError> {
        // Admin PAUSE (of the cluster or of the client's database) and
        // SWITCHOVER hold new units of work here; the
        // admission is counted until the server connection is checked out.
        let ctx = self.ctx.clone();
        let (_admission, picked) = match (ctx.router.try_admit_to(&self.id.database), pick) {
            (Some(a), Pick::Made(picked)) => (a, picked),
            (Some(a), Pick::Later) => (a, ctx.router.pick(route)),
            // Held: the pick is made afresh once the unit is let through.
            (None, _) => {
                let a = ctx.router.admit_to(&self.id.database).await;
                (a, ctx.router.pick(route))
            }
        };
        let avoid = self.engine.unit().retry.avoid();
        match fulcrum_cluster::attach::attach_picked(&ctx, picked, avoid, self).await {
            Ok(a) => {
                let on_primary = ctx.router.is_primary(a.backend);
                self.engine.attached(on_primary, a.waited_until);
                self.install(a.backend, a.conn);
                Ok(())
            }
            Err(why) => Err(self.unattached(why).await),
        }
    }

    /// Attaches, without waiting, a connection at hand that needs no reset
    /// and has the client's settings, when nothing holds new units: of the
    /// primary for a write (or any unit of a cluster of one), of the
    /// backend the router picks for a read (on a replica, when no position
    /// need be asked); no future. `Err`, with nothing attached, when the
    /// full way is needed, from the pick made here, if any.
    pub(super) fn attach_now(&mut self, route: Route) -> Result<(), Pick> {
        let router = &self.ctx.router;
        let Some(_admission) = router.try_admit_to(&self.id.database) else {
            return Err(Pick::Later);
        };
        if self.engine.unit().retry.avoid().is_some() {
            return Err(Pick::Later);
        }
        if route == Route::Replica && router.backend_count() > 1 {
            let picked = router.pick(route);
            let at_hand = match picked {
                Some(b) => self.attach_at_hand(b, router.is_primary(b)),
                None => false,
            };
            return if at_hand {
                Ok(())
            } else {
                Err(Pick::Made(picked))
            };
        }
        match router.primary() {
            Some(primary) if self.attach_at_hand(primary, true) => Ok(()),
            _ => Err(Pick::Later),
        }
    }

    /// Attaches an idle connection of `backend` (the `primary`, or not)
    /// ready at once (`Pool::try_get`, not due a check) that needs no reset
    /// and has the client's settings; false, with nothing changed, when
    /// there is none. Counted as the full way counts a checkout that did
    /// not wait. Inlined: a write's call, with `primary` known, is the
    /// usual unit's.
    #[inline]
    fn attach_at_hand(&mut self, backend: BackendId, primary: bool) -> bool {
        // The pool handle is kept per backend: no map lookup per unit.
        let pool = match &self.pool {
            Some((b, p)) if *b == backend => p,
            _ => {
                let p = self
                    .ctx
                    .pool(backend, &self.id.pool_user, &self.id.database);
                &self.pool.insert((backend, p)).1
            }
        };
        let (ctx, id, reads, desired) =
            (&self.ctx, &self.id, &mut self.reads, &self.params.desired);
        // A replica serves a causal read at once only when no position
        // need be asked (`Reads::serves_at_once`, as `fits` would find;
        // a read that never wrote, the usual one): else the full way.
        let ready = |c: &ServerConn| {
            !c.reset_due
                && c.applied == *desired
                && (primary
                    || !route_is_causal(reads.for_unit())
                    || reads.serves_at_once(&ctx.reads(&id.user, &id.database), backend))
        };
        let Some(conn) = fulcrum_cluster::attach::ready_at_hand(ctx, pool, primary, ready) else {
            return false;
        };
        if primary {
            self.id.entry.counts.waited(std::time::Duration::ZERO);
        }
        self.engine.attached(primary, None);
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
