//! The end of a session: the server connection goes back clean (rolled
//! back, reset) or is closed, and the helpers that clean it.

use super::*;

impl Session {
    /// The client is gone: give the server connection back clean, or close it.
    pub(super) async fn cleanup(&mut self) {
        // The client listens no more (its hub forgets it).
        self.listen = None;
        self.id.cancel.set_target(None);
        // A replay under way ends with its client (the engine's
        // `ClientGone` leaves `Replaying` for `Idle`); its connection is
        // closed below, mid-work.
        self.txn.run = None;
        // What the engine asks of the connection before it goes back
        // (`Clean`); nothing asked (no transaction, no pin): it goes back as
        // it is, unless work is in flight.
        let actions = self.engine.step(Event::ClientGone);
        if let Err(e) = self.carry_out(actions).await {
            tracing::debug!(error = %e, "cleaning the server connection");
        }
        self.clean(false, false).await;
    }

    /// `Clean`: the server connection goes back clean (rolled back when
    /// the client was in a transaction, as the status it was last told
    /// says, which is when the engine asks `rollback`; reset when `reset`),
    /// or is closed. Nothing when no connection is attached.
    pub(super) async fn clean(&mut self, _rollback: bool, reset: bool) {
        let Some(mut server) = self.server.take() else {
            return;
        };
        if self.owed.expect.only_position()
            && self.owed.ready == 0
            && !self.owed.unsynced
            && self.owed.stream_left == 0
        {
            // Only Fulcrum's own position query is in flight: its answer is
            // a moment away; wait for it and keep the connection.
            let expect = &mut self.owed.expect;
            let drained =
                tokio::time::timeout(CLEANUP_TIMEOUT, drain_internal(&mut server, expect)).await;
            if !matches!(drained, Ok(true)) {
                server.discard();
                return;
            }
        }
        let busy = self.owed.ready > 0
            || self.owed.unsynced
            || !self.owed.expect.is_empty()
            || self.owed.stream_left > 0;
        if busy || !server.io.read_buf.is_empty() {
            // Mid-query: stop the work and close; the server rolls back.
            let key = server.cancel.clone();
            server.discard();
            let timeout = self.ctx.config.connect_timeout;
            tokio::spawn(async move {
                let _ = crate::backend::connect::send_cancel(&key, timeout).await;
            });
            return;
        }
        let reset_session = reset;
        let in_txn = self.engine.status() != Status::Idle;
        // `server_reset_query_always`: the next checkout runs it (unless it
        // runs here).
        server.reset_due |= self.ctx.config.server_reset_query_always && !reset_session;
        shed_large_settings(&mut server);
        if !in_txn && !reset_session {
            server.release();
            return;
        }
        // `server_reset_query` (DISCARD ALL by default); none configured: a
        // connection that needs a reset is closed, never returned dirty. In
        // transaction pooling a pinned client's connection also serves
        // clients whose statements Fulcrum maps onto it, so a reset that does
        // not clear the whole session closes it too (session pooling keeps
        // PgBouncer's meaning: the operator's reset is what runs).
        let session_pooling = self.pool_mode == PoolMode::Session;
        let clears = reset_clears_session(&self.ctx)
            || (session_pooling && !self.ctx.config.server_reset_query.is_empty());
        if reset_session && !clears {
            server.discard();
            return;
        }
        let ctx = &self.ctx;
        let clean = async {
            if in_txn {
                server.run_internal("ROLLBACK").await?;
            }
            if reset_session {
                run_reset(ctx, &mut server).await?;
            }
            Ok::<(), InternalError>(())
        };
        match tokio::time::timeout(CLEANUP_TIMEOUT, clean).await {
            Ok(Ok(())) => server.release(),
            _ => server.discard(),
        }
    }
}

/// Reads `server`'s answers to what Fulcrum sent itself until `expect` is
/// empty; true when the connection is then clean.
pub(super) async fn drain_internal(server: &mut ServerConn, expect: &mut Expectations) -> bool {
    loop {
        while let Ok(Some(h)) = check_frame(&server.io.read_buf, u32::MAX as u64) {
            if server.io.read_buf.len() < h.total {
                break;
            }
            let frame = server.io.read_buf.split_to(h.total);
            expect.on_server(h.tag, &frame[5..]);
        }
        if expect.is_empty() {
            return server.io.read_buf.is_empty();
        }
        match server.io.read_more().await {
            Ok(n) if n > 0 => {}
            _ => return false,
        }
    }
}

/// Settings larger than this are not kept on a connection that goes back
/// to the pool: its next checkout resets and applies in full, so a client
/// with megabytes of settings leaves no copy of them behind.
const KEEP_APPLIED_MAX_BYTES: usize = 64 * 1024;

/// Drops a large record of what `server` carries (see above).
pub(super) fn shed_large_settings(server: &mut ServerConn) {
    if server.applied.bytes() > KEEP_APPLIED_MAX_BYTES {
        server.applied = Settings::unknown();
    }
}

/// Whether `server_reset_query` clears everything a pinned client may have
/// left (it includes `DISCARD ALL`): only then is a connection that needs a
/// reset returned to the pool after it.
pub(super) fn reset_clears_session(ctx: &ClusterContext) -> bool {
    let reset = &ctx.config.server_reset_query;
    !reset.is_empty()
        && ctx
            .classify_unit(reset)
            .effects
            .iter()
            .any(|e| matches!(e, Effect::DiscardAll))
}

/// Runs `server_reset_query` (none configured: nothing) on `server`, and
/// forgets what it is known to have cleared: `DISCARD ALL` drops the
/// settings Fulcrum replayed and the statements it prepared there,
/// `DEALLOCATE ALL` the statements. After any other query Fulcrum's record
/// stays as it was, so the next checkout still brings the settings to what
/// its client wants, and no statement is prepared twice or thought gone.
pub(super) async fn run_reset(
    ctx: &ClusterContext,
    server: &mut ServerConn,
) -> Result<(), InternalError> {
    let reset = &ctx.config.server_reset_query;
    if reset.is_empty() {
        return Ok(());
    }
    server.run_internal(reset).await?;
    let effects = ctx.classify_unit(reset).effects;
    if effects.iter().any(|e| matches!(e, Effect::DiscardAll)) {
        server.applied.clear();
        server.prepared.clear();
    } else if effects
        .iter()
        .any(|e| matches!(e, Effect::Deallocate(None)))
    {
        server.prepared.clear();
    }
    Ok(())
}

/// Brings a server connection's session parameters to what the client set:
/// `RESET ALL` then the client's statements, in one round trip.
pub(super) async fn sync_params(
    server: &mut ServerConn,
    desired: &Settings,
) -> Result<(), InternalError> {
    let mut sql = String::new();
    if server.applied.needs_reset() {
        // What a returned connection may still carry is a closed list:
        // RESET ALL leaves the session user and the role as they are, so
        // both are reset too, tracked or not.
        sql.push_str("RESET SESSION AUTHORIZATION;RESET ROLE;RESET ALL");
    }
    for stmt in desired.values() {
        if !sql.is_empty() {
            sql.push(';');
        }
        sql.push_str(stmt);
    }
    if !sql.is_empty() {
        server.run_internal(&sql).await?;
    }
    server.applied = desired.clone();
    Ok(())
}
