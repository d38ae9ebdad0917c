//! One client's session after login: the forwarding loop. Client frames go to
//! the server connection the client is attached to (attached on demand in
//! transaction mode, for life in session mode); server frames come back
//! through the reply queue (`expect`), which also tells when a transaction
//! has ended so the connection can go back to the pool.
//!
//! Frames are forwarded as raw bytes; only tags, lengths and the few bodies
//! needed for statement mapping and session state are read. Writes are
//! coalesced: one write per batch of frames read.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use fulcrum_config::{DefaultRoute, PoolMode};
use fulcrum_pool::{BackendId, Checkout, Pool, PoolError, Route};
use fulcrum_sql::{route, Decision, RouteTo, SessionState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod causal;
mod failure;
mod lost;

use super::cancel::CancelSlot;
use super::context::ClusterContext;
use super::error::SessionError;
use super::expect::{Expect, Expectations, Step};
use super::login::{fatal, Login};
use super::session_sql::{self, SessionOp};
use super::statements::ClientStatement;
use super::unit_route::unit_decision;
use crate::backend::conn::{Prepared, SessionParams};
use crate::backend::internal::InternalError;
use crate::backend::{ConnectError, ServerConn};
use crate::codec::backend_msg::{
    self, command_tag, parse_error_fields, parse_parameter_status, sqlstate,
};
use crate::codec::frame::check_frame;
use crate::codec::frontend_msg::{
    bind_msg, parse_msg, put_bind, put_query, put_target, query_text, target_msg,
};

/// Server frames of these types larger than this are streamed through, not buffered whole.
const STREAM_THRESHOLD: usize = 64 * 1024;
/// How long a replica that could not be reached is left out of reads.
const REPLICA_BAN: Duration = Duration::from_secs(5);
/// How long cleaning a server connection for reuse may take before it is closed instead.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(5);

/// A transaction opened by the client but not yet by any server.
struct DeferredBegin {
    sql: String,
    read_only: bool,
}

pub struct Session {
    ctx: Arc<ClusterContext>,
    client: TcpStream,
    cbuf: BytesMut,
    to_client: BytesMut,
    to_server: BytesMut,
    user: Arc<str>,
    database: Arc<str>,
    startup: SessionParams,
    /// Session parameters as the client has set them.
    desired: SessionParams,
    /// Session ops done inside the open transaction (applied at COMMIT).
    txn_ops: Vec<SessionOp>,
    txn_committed: Option<bool>,
    statements: HashMap<Vec<u8>, Arc<ClientStatement>>,
    server: Option<Checkout<ServerConn>>,
    backend: BackendId,
    pool: Option<(BackendId, Pool<ServerConn>)>,
    expect: Expectations,
    /// Sync/Query/FunctionCall sent and not yet answered with ReadyForQuery.
    pending_ready: usize,
    /// Extended-protocol messages sent since the last Sync.
    unsynced: bool,
    /// Last transaction status the server reported.
    status: u8,
    /// Bytes of a large server frame still to pass through unread.
    server_stream_left: usize,
    pinned: Option<&'static str>,
    rewrite_statements: bool,
    /// Routing decision of the client's last unnamed Parse.
    unnamed_decision: Decision,
    /// Session-state statements prepared through the extended protocol
    /// (statement name -> ops) and the portals bound to them, so a SET sent
    /// with Parse/Bind/Execute is replayed like one sent as a simple query.
    stmt_ops: HashMap<Vec<u8>, Vec<SessionOp>>,
    portal_ops: HashMap<Vec<u8>, Vec<SessionOp>>,
    /// A BEGIN (and SET TRANSACTION) answered by Fulcrum and not sent yet:
    /// the transaction's server is chosen by its first real statement.
    deferred: Option<DeferredBegin>,
    /// The classifier's decision for the Query being routed, reused when it is handled.
    last_query_decision: Option<Decision>,
    /// When the current server connection was attached (unit latency for p2c).
    attached_at: Option<std::time::Instant>,
    cancel: Arc<CancelSlot>,
    /// The transaction (or batch) lost with its server, answered locally.
    lost: Option<lost::Lost>,
    /// The client frames of the unit in flight on a replica, kept until its
    /// first answer reaches the client, to send again if the replica dies.
    retry_buf: BytesMut,
    retry_armed: bool,
    /// `to_client` length when the unit was attached (replies before it stay).
    retry_client_mark: usize,
    /// A retried unit is being sent again (no second retry).
    retrying: bool,
    /// The backend a retried unit must not go back to.
    retry_avoid: Option<BackendId>,
    /// Turns true on SIGTERM: the session ends at its next transaction boundary.
    shutdown: tokio::sync::watch::Receiver<bool>,
    /// Read consistency of this session (`SET fulcrum.consistency`).
    consistency: fulcrum_config::Consistency,
    /// The hint of the unit being routed, if it has one.
    unit_consistency: Option<fulcrum_config::Consistency>,
    /// The position the client's reads must not be older than.
    causal: fulcrum_pool::Causal<u64>,
    /// The unit being routed may write (anything but a plain read).
    unit_may_write: bool,
    /// The attached unit is on the primary and may have written.
    write_unit: bool,
    /// This client's row in `SHOW CLIENTS`.
    client_entry: fulcrum_cluster::clients::ClientHandle,
    /// DDL ran in the open transaction (the schema generation moves again
    /// when it ends).
    ddl_in_txn: bool,
    /// A statement that may commit (COMMIT, END, COMMIT PREPARED) was sent
    /// and not yet answered with ReadyForQuery: if the server dies now, the
    /// outcome is unknown (SQLSTATE 08007).
    pub(super) commit_in_flight: bool,
}

impl Session {
    pub fn new(
        ctx: Arc<ClusterContext>,
        client: TcpStream,
        cbuf: BytesMut,
        login: Login,
        cancel: Arc<CancelSlot>,
        shutdown: tokio::sync::watch::Receiver<bool>,
        client_entry: fulcrum_cluster::clients::ClientHandle,
    ) -> Session {
        let transaction_mode = ctx.config.pool_mode == PoolMode::Transaction;
        let ctx_consistency = ctx.config.consistency;
        Session {
            backend: ctx.router.primary().unwrap_or(0),
            ctx,
            client,
            cbuf,
            // Allocated at first use and kept: an idle client that has not
            // run anything holds no output buffers (memory per idle client).
            to_client: BytesMut::new(),
            to_server: BytesMut::new(),
            user: login.user,
            database: login.database,
            desired: login.startup.clone(),
            startup: login.startup,
            txn_ops: Vec::new(),
            txn_committed: None,
            statements: HashMap::new(),
            server: None,
            pool: None,
            expect: Expectations::default(),
            pending_ready: 0,
            unsynced: false,
            status: b'I',
            server_stream_left: 0,
            pinned: if transaction_mode {
                None
            } else {
                Some("session pool mode")
            },
            rewrite_statements: transaction_mode,
            unnamed_decision: Decision::Write,
            stmt_ops: HashMap::new(),
            portal_ops: HashMap::new(),
            deferred: None,
            last_query_decision: None,
            attached_at: None,
            cancel,
            lost: None,
            retry_buf: BytesMut::new(),
            retry_armed: false,
            retry_client_mark: 0,
            retrying: false,
            retry_avoid: None,
            shutdown,
            consistency: ctx_consistency,
            unit_consistency: None,
            causal: fulcrum_pool::Causal::default(),
            unit_may_write: true,
            write_unit: false,
            client_entry,
            ddl_in_txn: false,
            commit_in_flight: false,
        }
    }

    /// Finishes login (first server contact validates the database and the
    /// startup parameters), then forwards until the client leaves.
    pub async fn run(mut self) -> Result<(), SessionError> {
        let result = self.start().await;
        let result = match result {
            Ok(()) => self.forward().await,
            Err(e) => Err(e),
        };
        self.cleanup().await;
        match result {
            Err(SessionError::ClientGone) => Ok(()),
            r => r,
        }
    }

    async fn start(&mut self) -> Result<(), SessionError> {
        let backend = self.ctx.router.primary().unwrap_or(self.backend);
        let cached = if self.pinned.is_none() {
            self.ctx
                .cached_welcome(backend, &self.user, &self.database, &self.startup)
        } else {
            None
        };
        let reported = match cached {
            Some(r) => r,
            None => {
                // First client with these parameters: a server validates the
                // database and the startup parameters, and tells their values.
                self.attach(Route::Primary).await?;
                let server = self.server.as_ref().expect("attached");
                self.ctx.cache_welcome(
                    self.backend,
                    &self.user,
                    &self.database,
                    &self.startup,
                    &server.reported,
                );
                Arc::new(server.reported.clone())
            }
        };
        let mut out = BytesMut::with_capacity(512);
        backend_msg::auth_request(&mut out, backend_msg::AUTH_OK, &[]);
        for (name, value) in reported.iter() {
            backend_msg::parameter_status(&mut out, name, value);
        }
        backend_msg::backend_key_data(&mut out, self.cancel.process_id, self.cancel.secret_key);
        backend_msg::ready_for_query(&mut out, b'I');
        self.client.write_all(&out).await?;
        self.maybe_detach();
        Ok(())
    }

    async fn forward(&mut self) -> Result<(), SessionError> {
        enum Event {
            Client(std::io::Result<usize>),
            Server(std::io::Result<usize>),
            Shutdown,
        }
        loop {
            let draining = *self.shutdown.borrow();
            if draining && self.at_boundary() {
                let msg =
                    "fulcrum: shutting down (SIGTERM); connect again to reach another instance";
                return Err(fatal(&mut self.client, sqlstate::ADMIN_SHUTDOWN, msg).await);
            }
            if self.cbuf.capacity() - self.cbuf.len() < 1024 {
                self.cbuf.reserve(8 * 1024);
            }
            let event = match self.server.as_mut() {
                Some(server) => {
                    let conn: &mut ServerConn = server;
                    if conn.read_buf.capacity() - conn.read_buf.len() < 4096 {
                        conn.read_buf.reserve(16 * 1024);
                    }
                    tokio::select! {
                        r = self.client.read_buf(&mut self.cbuf) => Event::Client(r),
                        r = conn.stream.read_buf(&mut conn.read_buf) => Event::Server(r),
                        _ = self.shutdown.changed(), if !draining => Event::Shutdown,
                    }
                }
                None => tokio::select! {
                    r = self.client.read_buf(&mut self.cbuf) => Event::Client(r),
                    _ = self.shutdown.changed(), if !draining => Event::Shutdown,
                },
            };
            match event {
                Event::Shutdown => continue,
                Event::Client(r) => {
                    let n = r?;
                    if n == 0 {
                        return Err(SessionError::ClientGone);
                    }
                    self.ctx.metrics.bytes_in.inc_by(n as u64);
                    self.on_client_input().await?;
                }
                Event::Server(Ok(n)) if n > 0 => {
                    self.ctx.metrics.bytes_out.inc_by(n as u64);
                    self.on_server_input().await?;
                    if self.server.is_none() {
                        // The server closed (a FATAL or shutdown notice): what
                        // Fulcrum answered in its place goes out now.
                        self.flush_client().await?;
                    }
                    // Work held back while a replica finished goes now.
                    if !self.cbuf.is_empty() {
                        self.on_client_input().await?;
                    }
                }
                Event::Server(_) => {
                    self.server_lost().await?;
                    if self.server.is_none() {
                        self.flush_client().await?;
                    }
                    if !self.cbuf.is_empty() {
                        self.on_client_input().await?;
                    }
                }
            }
        }
    }

    // ---- attaching and detaching ------------------------------------------------

    async fn attach(&mut self, route: Route) -> Result<(), SessionError> {
        if self.server.is_some() {
            return Ok(());
        }
        // Admin PAUSE (and SWITCHOVER) holds new units of work here; the
        // admission is counted until the server connection is checked out.
        let _admission = self.ctx.router.admit().await;
        let route = if route == Route::Replica && self.causal_needs_primary() {
            Route::Primary
        } else {
            route
        };
        if let Some(backend) = self.ctx.router.pick(route) {
            if !self.ctx.router.is_primary(backend) && self.retry_avoid != Some(backend) {
                match self.try_attach_replica(backend).await {
                    Ok(true) => return Ok(()),
                    Ok(false) => {} // fall back to the primary below
                    Err(e) => return Err(e),
                }
            }
        }
        self.attach_primary().await?;
        self.write_unit = self.unit_may_write;
        Ok(())
    }

    /// Attaches to the primary. With none now (it is down, or a failover is
    /// under way), or when it cannot be reached, waits up to `pool_timeout`
    /// for the health loop to name one: the client has sent nothing to any
    /// server yet, so nothing is lost by waiting.
    async fn attach_primary(&mut self) -> Result<(), SessionError> {
        let wait = self.ctx.config.pool_timeout;
        let deadline = tokio::time::Instant::now() + wait;
        let mut why = format!(
            "the primary {} is down",
            self.ctx.backends[self.ctx.router.last_primary()]
        );
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let primary = match self.ctx.router.primary() {
                Some(p) => Some(p),
                None => self.ctx.router.wait_primary(None, left).await,
            };
            let Some(primary) = primary else {
                break;
            };
            match self.attach_to(primary).await {
                Err(SessionError::BackendDown(e)) => {
                    self.ctx.router.suspect(primary);
                    why = e;
                }
                r => return r,
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            // Until the health loop has looked, the same primary may still be named.
            tokio::time::sleep(left.min(Duration::from_millis(100))).await;
        }
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
        Err(fatal(&mut self.client, sqlstate::CONNECTION_FAILURE, &msg).await)
    }

    /// Attaches to a replica; `Ok(false)` when it cannot be reached (it is
    /// then skipped for a while and the read goes to the primary).
    async fn try_attach_replica(&mut self, backend: BackendId) -> Result<bool, SessionError> {
        let pool = self.ctx.pool(backend, &self.user, &self.database);
        let ctx = self.ctx.clone();
        let (user, database) = (self.user.clone(), self.database.clone());
        match pool
            .get(|| async move { ctx.open(backend, &user, &database).await })
            .await
        {
            Ok(mut server) => {
                if server.applied != self.desired
                    && sync_params(&mut server, &self.desired).await.is_err()
                {
                    server.discard();
                    return Ok(false);
                }
                if route_is_causal(self.read_consistency())
                    && matches!(
                        self.causal_check(backend, &mut server).await,
                        causal::Check::Primary
                    )
                {
                    if server.read_buf.is_empty() {
                        server.release();
                    } else {
                        server.discard();
                    }
                    return Ok(false);
                }
                self.write_unit = false;
                self.backend = backend;
                self.cancel.set_target(Some(server.cancel.clone()));
                self.server = Some(server);
                self.attached_at = Some(std::time::Instant::now());
                self.client_entry.set_active(backend);
                Ok(true)
            }
            Err(PoolError::Connect(e)) if e.is_backend_down() => {
                tracing::warn!(replica = %self.ctx.backends[backend], error = %e, "replica unreachable; reads go elsewhere until the health check admits it again");
                self.ctx.router.suspect(backend);
                Ok(false)
            }
            Err(PoolError::Connect(e)) => {
                tracing::warn!(replica = %self.ctx.backends[backend], error = %e, "replica refused the connection; using the primary");
                self.ctx.router.ban(backend, REPLICA_BAN);
                Ok(false)
            }
            Err(PoolError::Timeout(..)) | Err(PoolError::Closed) => Ok(false),
        }
    }

    async fn attach_to(&mut self, backend: BackendId) -> Result<(), SessionError> {
        self.backend = backend;
        // The pool handle is kept per backend: no map lookup per transaction.
        let pool = match &self.pool {
            Some((b, p)) if *b == backend => p.clone(),
            _ => {
                let p = self.ctx.pool(backend, &self.user, &self.database);
                self.pool = Some((backend, p.clone()));
                p
            }
        };
        let ctx = self.ctx.clone();
        let (user, database) = (self.user.clone(), self.database.clone());
        let waited = std::time::Instant::now();
        self.ctx.metrics.waiting.inc();
        self.client_entry.set_waiting();
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
                if fields.code.starts_with("57P") && self.rewrite_statements =>
            {
                // Shutting down, starting up or in recovery: as good as down
                // for this unit, which may wait for the primary to come back.
                tracing::warn!(code = %fields.code, cluster = self.ctx.name(), "primary refused new connections: {}", fields.message);
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
                tracing::info!(code = %fields.code, "server refused login: {}", fields.message);
                let _ = self.client.write_all(&frame).await;
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
                return Err(fatal(&mut self.client, code, &msg).await);
            }
            Err(e @ PoolError::Timeout(..)) | Err(e @ PoolError::Closed) => {
                let msg = format!(
                    "fulcrum: {e} for user \"{}\" database \"{}\" on {}; raise pool_size or pool_timeout for cluster \"{}\"",
                    self.user,
                    self.database,
                    self.ctx.backends[backend],
                    self.ctx.name()
                );
                return Err(fatal(&mut self.client, sqlstate::TOO_MANY_CONNECTIONS, &msg).await);
            }
        };
        if server.applied != self.desired {
            if let Err(e) = sync_params(&mut server, &self.desired).await {
                return Err(match e {
                    InternalError::Server { frame, fields } => {
                        let _ = self.client.write_all(&frame).await;
                        SessionError::Refused(fields.message)
                    }
                    other => {
                        server.discard();
                        let msg = format!("fulcrum: server connection failed while restoring session settings: {other}");
                        fatal(&mut self.client, sqlstate::CONNECTION_FAILURE, &msg).await
                    }
                });
            }
        }
        self.cancel.set_target(Some(server.cancel.clone()));
        self.server = Some(server);
        self.attached_at = Some(std::time::Instant::now());
        self.client_entry.set_active(backend);
        Ok(())
    }

    /// Returns the server connection to the pool when the client is between
    /// transactions and nothing is in flight.
    fn maybe_detach(&mut self) {
        if self.pinned.is_some()
            || self.status != b'I'
            || self.pending_ready > 0
            || self.unsynced
            || !self.expect.is_empty()
            || self.server_stream_left > 0
        {
            return;
        }
        if let Some(server) = self.server.take() {
            self.retry_armed = false;
            self.retry_buf.clear();
            self.cancel.set_target(None);
            self.record_unit();
            self.client_entry.set_idle();
            // A connection holding more prepared statements than allowed is
            // closed rather than reused: memory on both sides stays bounded.
            let max = self.ctx.config.max_prepared_statements as usize;
            if server.read_buf.is_empty() && (max == 0 || server.prepared.len() <= max) {
                server.release();
            } else {
                server.discard();
            }
        }
    }

    /// A unit of work is over: its latency, metrics and slow log (once).
    fn record_unit(&mut self) {
        if let Some(at) = self.attached_at.take() {
            let took = at.elapsed();
            self.ctx.router.record_latency(self.backend, took);
            self.ctx
                .metrics
                .unit(self.backend, self.route_label(), took);
            if self.ctx.slow_query_threshold.is_some_and(|t| took >= t) {
                // No statement text: it would carry the query's parameters.
                tracing::info!(
                    cluster = %self.ctx.name(),
                    user = %self.user,
                    database = %self.database,
                    server = %self.ctx.backends[self.backend],
                    took_ms = took.as_millis() as u64,
                    "slow unit of work"
                );
            }
        }
    }

    /// Between transactions with nothing in flight: where a SIGTERM drain
    /// may end the session without cutting any work.
    fn at_boundary(&self) -> bool {
        self.status == b'I'
            && self.pending_ready == 0
            && !self.unsynced
            && self.expect.is_empty()
            && self.server_stream_left == 0
            && self.deferred.is_none()
            && self.lost.is_none()
            && self.cbuf.is_empty()
    }

    /// The route label of the attached server (metrics).
    fn route_label(&self) -> fulcrum_metrics::RouteLabel {
        if self.ctx.router.is_primary(self.backend) {
            fulcrum_metrics::RouteLabel::Write
        } else {
            fulcrum_metrics::RouteLabel::Read
        }
    }

    fn pin(&mut self, reason: &'static str) {
        if self.pinned.is_none() {
            tracing::debug!(reason, "client pinned to its server connection");
            self.pinned = Some(reason);
        }
    }

    // ---- client to server ---------------------------------------------------------

    /// Handles what the client sent, then settles: answers Fulcrum owes
    /// itself go out, and a connection with nothing in flight goes back. A
    /// unit held behind work that has just finished is taken up at once, so
    /// no unit waits for a server answer that is not coming.
    async fn on_client_input(&mut self) -> Result<(), SessionError> {
        loop {
            let held = self.take_client_frames().await?;
            self.settle().await?;
            if !(held && self.server.is_none()) {
                return Ok(());
            }
        }
    }

    /// After a batch of client frames: sends what is queued for the server,
    /// emits the synthetic replies now at the front of the reply queue,
    /// writes to the client, and detaches when nothing is in flight.
    async fn settle(&mut self) -> Result<(), SessionError> {
        self.flush_server().await?;
        self.expect
            .drain_synthetic(&mut self.to_client, self.status);
        self.flush_client().await?;
        self.maybe_detach();
        Ok(())
    }

    /// Takes the complete client frames in the buffer. Returns true when it
    /// stopped at a unit it holds (waiting for the attached connection).
    async fn take_client_frames(&mut self) -> Result<bool, SessionError> {
        let max = self.ctx.config.max_message_size;
        // When a new unit of work started here: the time to its hand-over
        // to the server is what Fulcrum adds (`fulcrum_proxy_seconds`).
        let mut unit_started = None;
        let held = loop {
            let header = match check_frame(&self.cbuf, max) {
                Ok(Some(h)) if self.cbuf.len() >= h.total => h,
                Ok(Some(h)) => {
                    self.cbuf.reserve(h.total - self.cbuf.len());
                    break false;
                }
                Ok(None) => break false,
                Err(e) => {
                    self.flush_server().await?;
                    return Err(fatal(
                        &mut self.client,
                        sqlstate::PROTOCOL_VIOLATION,
                        &format!("fulcrum: {e}"),
                    )
                    .await);
                }
            };
            if self.lost.is_some()
                && self.server.is_none()
                && self.answer_lost(header.tag, header.total)
            {
                continue;
            }
            if header.tag == b'Q' && self.try_answer_setting(header.total) {
                continue;
            }
            if header.tag == b'Q'
                && self.server.is_none()
                && self.try_answer_local_deallocate(header.total)
            {
                // A mapped statement's DEALLOCATE needs no server.
                let _ = self.cbuf.split_to(header.total);
                continue;
            }
            if header.tag == b'Q'
                && self.server.is_none()
                && self.try_defer_transaction_control(header.total)
            {
                let _ = self.cbuf.split_to(header.total);
                continue;
            }
            if matches!(
                header.tag,
                b'Q' | b'P' | b'B' | b'D' | b'C' | b'E' | b'S' | b'H' | b'F'
            ) {
                if self.server.is_none() {
                    unit_started.get_or_insert_with(std::time::Instant::now);
                    let route = self.route_next_unit();
                    self.attach(route).await?;
                    self.arm_retry();
                    if let Some(d) = self.deferred.take() {
                        // The transaction starts on the chosen server, in
                        // the same write as its first statement.
                        put_query(&mut self.to_server, &d.sql);
                        self.expect.push(Expect::SwallowQuery);
                    }
                } else if self.must_wait_for_replica() {
                    // The next unit needs the primary: leave it buffered until
                    // the replica's work is done and the connection is back.
                    break true;
                } else if self.must_wait_for_position() {
                    // A read right after a write: wait for the write's
                    // position (already asked), then route it to a replica.
                    break true;
                } else if self.status == b'I'
                    && !self.unsynced
                    && self.pending_ready == 0
                    && !self.write_unit
                    && self.ctx.router.is_primary(self.backend)
                {
                    // A new unit on a primary connection still held (for the
                    // position query): it may write too, and counts as a unit.
                    self.write_unit = !matches!(self.next_unit_decision(), Decision::Read);
                    if self.attached_at.is_none() {
                        self.attached_at = Some(std::time::Instant::now());
                    }
                    unit_started.get_or_insert_with(std::time::Instant::now);
                }
            }
            let frame = self.cbuf.split_to(header.total);
            if self.retry_armed {
                if self.retry_buf.len() + frame.len() <= failure::RETRY_MAX {
                    self.retry_buf.extend_from_slice(&frame);
                } else {
                    self.retry_armed = false;
                    self.retry_buf.clear();
                }
            }
            if !self.on_client_frame(header.tag, frame).await? {
                self.flush_server().await?;
                return Err(SessionError::ClientGone);
            }
        };
        if let Some(t) = unit_started {
            self.ctx.metrics.proxy.observe(t.elapsed().as_secs_f64());
        }
        Ok(held)
    }

    /// Handles one client frame. Returns false on Terminate.
    async fn on_client_frame(&mut self, tag: u8, frame: BytesMut) -> Result<bool, SessionError> {
        tracing::trace!(tag = %(tag as char), len = frame.len(), "client message");
        match tag {
            b'X' => return Ok(false),
            b'd' | b'c' | b'f' => {
                // Copy data outside a copy is ignored by servers too.
                if self.server.is_some() {
                    self.to_server.extend_from_slice(&frame);
                    if tag != b'd' {
                        self.expect.client_copy_end();
                    }
                }
                return Ok(true);
            }
            b'Q' => {
                if self.try_answer_deallocate(&frame[5..]) {
                    return Ok(true);
                }
            }
            b'P' | b'B' | b'D' | b'C' | b'E' | b'S' | b'H' | b'F' => {}
            other => {
                let msg = format!("fulcrum: invalid frontend message type {}", other);
                self.flush_server().await?;
                return Err(fatal(&mut self.client, sqlstate::PROTOCOL_VIOLATION, &msg).await);
            }
        }
        if self.server.is_none() {
            self.attach(Route::Primary).await?;
        }
        if matches!(tag, b'Q' | b'E' | b'F') {
            self.ctx
                .metrics
                .queries(self.backend, self.route_label(), 1);
        }
        match tag {
            b'Q' => {
                let ops = match query_text(&frame[5..]) {
                    Some(text) if self.may_change_session(text) => session_sql::scan(text),
                    _ => Vec::new(),
                };
                if query_text(&frame[5..]).is_some_and(may_commit) {
                    self.commit_in_flight = true;
                }
                let mut replay = Vec::with_capacity(ops.len());
                for op in ops {
                    match op {
                        SessionOp::Pin(reason) => self.pin(reason),
                        SessionOp::Deallocate(None) => self.statements.clear(),
                        SessionOp::Deallocate(Some(_)) => {}
                        op => replay.push(op),
                    }
                }
                self.to_server.extend_from_slice(&frame);
                self.expect.push(Expect::Query(replay));
                self.pending_ready += 1;
            }
            b'F' => {
                self.to_server.extend_from_slice(&frame);
                self.expect.push(Expect::Query(Vec::new()));
                self.pending_ready += 1;
            }
            b'S' => {
                self.to_server.extend_from_slice(&frame);
                if !self.expect.sync_is_ignored() {
                    self.expect.push(Expect::Sync);
                    self.pending_ready += 1;
                    self.unsynced = false;
                }
            }
            b'H' => {
                self.to_server.extend_from_slice(&frame);
                self.unsynced = true;
            }
            b'P' => self.on_parse(frame),
            b'B' => self.on_bind(frame),
            b'D' | b'C' => self.on_describe_or_close(tag, frame),
            b'E' => {
                let ops = self.execute_ops(&frame[5..]);
                self.to_server.extend_from_slice(&frame);
                self.expect.push(Expect::Execute(ops));
                self.unsynced = true;
            }
            _ => unreachable!("filtered above"),
        }
        Ok(true)
    }

    /// The decision for the unit at the front of the client buffer.
    fn next_unit_decision(&self) -> Decision {
        let d = unit_decision(
            &self.cbuf,
            self.ctx.config.max_message_size,
            &|sql| self.ctx.classify(sql),
            &self.statements,
            self.unnamed_decision,
        );
        if d == Decision::Unknown && self.ctx.config.default_route == DefaultRoute::Replica {
            return Decision::Read;
        }
        d
    }

    /// Primary or replica for the next unit of work (only transaction
    /// pooling routes per unit; session mode and pinned clients stay put).
    fn route_next_unit(&mut self) -> Route {
        if self.pinned.is_some() {
            self.unit_may_write = true;
            return Route::Primary;
        }
        let decision = self.next_unit_decision();
        if self.cbuf.first() == Some(&b'Q') {
            self.last_query_decision = Some(decision);
        }
        self.note_hint();
        self.unit_may_write = (!matches!(decision, Decision::Read)
            || self.deferred.as_ref().is_some_and(|d| !d.read_only))
            && unit_executes(&self.cbuf, self.ctx.config.max_message_size);
        if let Some(d) = &self.deferred {
            // A deferred transaction: read-only ones may use a replica.
            if d.read_only && !matches!(decision, Decision::Pin(_)) {
                return Route::Replica;
            }
            if let Decision::Pin(reason) = decision {
                self.pin(reason);
            }
            return Route::Primary;
        }
        if let Decision::Pin(reason) = decision {
            self.pin(reason);
        }
        let state = SessionState {
            in_transaction: false,
            pinned: self.pinned.is_some(),
        };
        match route(decision, state) {
            RouteTo::Replica => Route::Replica,
            RouteTo::Primary | RouteTo::Same => Route::Primary,
        }
    }

    /// Whether a simple query needs the session-state scan: a single plain
    /// read or write (by the classifier, usually a cache hit) does not.
    fn may_change_session(&mut self, text: &[u8]) -> bool {
        let single = match text.iter().position(|&b| b == b';') {
            None => true,
            Some(p) => text[p + 1..].iter().all(u8::is_ascii_whitespace),
        };
        if !single {
            return true;
        }
        let decision = match self.last_query_decision.take() {
            Some(d) => d,
            None => match std::str::from_utf8(text) {
                Ok(t) => self.ctx.classify(t),
                Err(_) => return true,
            },
        };
        !matches!(
            decision,
            Decision::Read | Decision::Write | Decision::Primary
        )
    }

    /// On a replica, between units, outside a transaction: a unit that needs
    /// the primary must wait for this connection to be released.
    fn must_wait_for_replica(&self) -> bool {
        !self.ctx.router.is_primary(self.backend)
            && !self.unsynced
            && self.status == b'I'
            && self.pinned.is_none()
            && self.next_unit_decision().needs_primary()
    }

    /// Only the position query holds the primary connection, and the next
    /// unit is a read: it waits for the position rather than riding along
    /// on the primary.
    fn must_wait_for_position(&self) -> bool {
        self.expect.only_position()
            && self.pending_ready == 0
            && !self.unsynced
            && self.status == b'I'
            && self.pinned.is_none()
            && self.next_unit_decision() == Decision::Read
    }

    /// A unit just attached to a replica, outside a transaction, is kept
    /// until it is answered, to be sent elsewhere if the replica dies.
    fn arm_retry(&mut self) {
        self.retry_buf.clear();
        self.retry_armed = !self.retrying
            && self.rewrite_statements
            && self.pinned.is_none()
            && self.status == b'I'
            && self.deferred.is_none()
            && !self.ctx.router.is_primary(self.backend);
        self.retry_client_mark = self.to_client.len();
    }

    /// Answers a frame of a client whose transaction died with its server;
    /// false when the frame is for normal processing.
    fn answer_lost(&mut self, tag: u8, total: usize) -> bool {
        let Some(lost) = self.lost.as_mut() else {
            return false;
        };
        let ctx = &self.ctx;
        let ends =
            |text: &[u8]| std::str::from_utf8(text).is_ok_and(|t| ctx.classify(t) == Decision::End);
        match lost.answer(tag, &self.cbuf[5..total], &ends, &mut self.to_client) {
            lost::Answer::Pass => {
                self.lost = None;
                false
            }
            lost::Answer::Held => {
                if tag == b'Q' || tag == b'S' || tag == b'F' {
                    self.status = b'E';
                }
                let _ = self.cbuf.split_to(total);
                true
            }
            lost::Answer::Done => {
                self.lost = None;
                self.status = b'I';
                let _ = self.cbuf.split_to(total);
                true
            }
        }
    }

    /// A lone `BEGIN`/`START TRANSACTION`, then `SET TRANSACTION ...`, or the
    /// `COMMIT`/`ROLLBACK` of a transaction with no statement yet, is answered
    /// by Fulcrum without a server: the first real statement picks the server
    /// (a replica for a read-only transaction) and the BEGIN travels with it.
    fn try_defer_transaction_control(&mut self, total: usize) -> bool {
        if !self.rewrite_statements || self.pinned.is_some() {
            return false;
        }
        let Some(text) = query_text(&self.cbuf[5..total]) else {
            return false;
        };
        // Cheap test first: only transaction control can be deferred.
        let first = session_sql::first_word_bytes(text);
        let candidate = if self.deferred.is_some() {
            ["set", "commit", "end", "rollback", "abort"]
                .iter()
                .any(|w| first.eq_ignore_ascii_case(w.as_bytes()))
        } else {
            first.eq_ignore_ascii_case(b"begin") || first.eq_ignore_ascii_case(b"start")
        };
        if !candidate {
            return false;
        }
        let Ok(text) = std::str::from_utf8(text) else {
            return false;
        };
        if session_sql::split_statements(text).len() != 1 {
            return false;
        }
        let decision = self.ctx.classify(text);
        let sql = text.trim().trim_end_matches(';').trim().to_owned();
        let (tag, status) = match (decision, self.deferred.as_mut()) {
            (Decision::Begin { read_only }, None) if self.status == b'I' => {
                self.deferred = Some(DeferredBegin { sql, read_only });
                ("BEGIN", b'T')
            }
            (Decision::TxnReadOnly, Some(d)) => {
                d.sql.push_str("; ");
                d.sql.push_str(&sql);
                d.read_only = true;
                ("SET", b'T')
            }
            (Decision::Txn, Some(d)) if starts_with_ci(&sql, "set transaction") => {
                // Standbys refuse SERIALIZABLE, and READ WRITE undoes a READ
                // ONLY: such a transaction needs the primary.
                let lower = sql.to_ascii_lowercase();
                if lower.contains("serializable") || lower.contains("read write") {
                    d.read_only = false;
                }
                d.sql.push_str("; ");
                d.sql.push_str(&sql);
                ("SET", b'T')
            }
            (Decision::End, Some(_)) if is_chained(&sql) => {
                // COMMIT/ROLLBACK AND CHAIN of a transaction with no
                // statement yet: a new one opens at once, just as deferred.
                let first = sql.split_whitespace().next().unwrap_or("");
                let tag = if first.eq_ignore_ascii_case("rollback")
                    || first.eq_ignore_ascii_case("abort")
                {
                    "ROLLBACK"
                } else {
                    "COMMIT"
                };
                (tag, b'T')
            }
            (Decision::End, Some(_)) => {
                self.deferred = None;
                let first = sql
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .to_ascii_lowercase();
                let tag = if first == "commit" || first == "end" {
                    "COMMIT"
                } else {
                    "ROLLBACK"
                };
                (tag, b'I')
            }
            _ => return false,
        };
        backend_msg::command_complete(&mut self.to_client, tag);
        backend_msg::ready_for_query(&mut self.to_client, status);
        self.status = status;
        true
    }

    /// `DEALLOCATE name` of a statement Fulcrum mapped is answered here: the
    /// shared server-side statement stays for other clients.
    fn try_answer_deallocate(&mut self, body: &[u8]) -> bool {
        if !self.rewrite_statements {
            return false;
        }
        let Some(ops) = deallocate_ops(body) else {
            return false;
        };
        let [SessionOp::Deallocate(target)] = ops.as_slice() else {
            return false;
        };
        let tag = match target {
            Some(name) => {
                if self.statements.remove(name.as_bytes()).is_none() {
                    return false;
                }
                "DEALLOCATE"
            }
            None => {
                if self.pinned.is_some() {
                    return false; // SQL-level statements may exist on the server too.
                }
                self.statements.clear();
                "DEALLOCATE ALL"
            }
        };
        self.expect.push(Expect::SyntheticQuery(tag));
        if self.server.is_none() {
            self.expect
                .drain_synthetic(&mut self.to_client, self.status);
        }
        true
    }

    /// `try_answer_deallocate` for the Query at the front of the client
    /// buffer (`total` bytes), before any server is attached.
    fn try_answer_local_deallocate(&mut self, total: usize) -> bool {
        if !self.rewrite_statements || deallocate_ops(&self.cbuf[5..total]).is_none() {
            return false;
        }
        let body = self.cbuf[5..total].to_vec();
        self.try_answer_deallocate(&body)
    }

    fn on_parse(&mut self, frame: BytesMut) {
        self.unsynced = true;
        if parse_msg(&frame[5..]).is_some_and(|p| may_commit(p.query)) {
            self.commit_in_flight = true;
        }
        let decision = parse_msg(&frame[5..])
            .and_then(|p| std::str::from_utf8(p.query).ok())
            .map_or(Decision::Write, |q| self.ctx.classify(q));
        if let Decision::Pin(reason) = decision {
            self.pin(reason);
        }
        if decision == Decision::Set || !self.stmt_ops.is_empty() {
            self.track_statement_ops(&frame, decision);
        }
        let parsed = if self.rewrite_statements {
            parse_msg(&frame[5..])
        } else {
            None
        };
        if parsed.as_ref().is_none_or(|p| p.name.is_empty()) {
            self.unnamed_decision = decision;
        }
        let Some(p) = parsed.filter(|p| !p.name.is_empty()) else {
            self.to_server.extend_from_slice(&frame);
            self.expect.push(Expect::Parse(None));
            return;
        };
        let stmt = self
            .ctx
            .statements
            .statement(p.definition, p.query, decision);
        let name = p.name.to_vec();
        let server = self.server.as_mut().expect("attached");
        if server.prepared.contains_key(&stmt.server_name) {
            let mut reply = BytesMut::with_capacity(5);
            backend_msg::parse_complete(&mut reply);
            self.expect.push(Expect::Synthetic(reply.freeze()));
        } else {
            server
                .prepared
                .insert(stmt.server_name.clone(), Prepared::Pending);
            self.to_server.extend_from_slice(&stmt.parse);
            self.expect
                .push(Expect::Parse(Some(stmt.server_name.clone())));
        }
        self.statements.insert(name, stmt);
    }

    /// Remembers the session ops of a prepared SET (or forgets a name reused).
    fn track_statement_ops(&mut self, frame: &[u8], decision: Decision) {
        let Some(p) = parse_msg(&frame[5..]) else {
            return;
        };
        let mut ops = Vec::new();
        if decision == Decision::Set {
            for op in session_sql::scan(p.query) {
                match op {
                    SessionOp::Pin(reason) => self.pin(reason),
                    SessionOp::Set { .. }
                    | SessionOp::Reset { .. }
                    | SessionOp::ResetAll
                    | SessionOp::DiscardAll => ops.push(op),
                    _ => {}
                }
            }
        }
        if ops.is_empty() {
            self.stmt_ops.remove(p.name);
        } else {
            self.stmt_ops.insert(p.name.to_vec(), ops);
        }
    }

    /// The ops an Execute of `portal` will apply when it completes.
    fn execute_ops(&self, body: &[u8]) -> Vec<SessionOp> {
        if self.portal_ops.is_empty() {
            return Vec::new();
        }
        let portal = body.split(|&b| b == 0).next().unwrap_or_default();
        self.portal_ops.get(portal).cloned().unwrap_or_default()
    }

    /// The shared statement `server_name` went stale on the servers: the
    /// client's statements using it move to a fresh server-side name, so
    /// their next use prepares them again (on this and every connection).
    fn renew_statement(&mut self, server_name: &str) {
        for stmt in self.statements.values_mut() {
            if &*stmt.server_name == server_name {
                *stmt = self.ctx.statements.renew(stmt);
            }
        }
    }

    /// Makes sure the attached server has the client's statement `name`,
    /// injecting its Parse when not; returns the server-side name.
    fn ensure_prepared(&mut self, name: &[u8]) -> Option<Arc<str>> {
        let mut stmt = self.statements.get(name)?.clone();
        if stmt.generation != self.ctx.statements.generation() {
            // DDL ran since it was named: prepare it afresh under a new name.
            stmt = self.ctx.statements.current(&stmt);
            self.statements.insert(name.to_vec(), stmt.clone());
        }
        let server = self.server.as_mut().expect("attached");
        if !server.prepared.contains_key(&stmt.server_name) {
            server
                .prepared
                .insert(stmt.server_name.clone(), Prepared::Pending);
            self.to_server.extend_from_slice(&stmt.parse);
            self.expect
                .push(Expect::SwallowParse(stmt.server_name.clone()));
        }
        Some(stmt.server_name.clone())
    }

    fn on_bind(&mut self, frame: BytesMut) {
        self.unsynced = true;
        if !self.stmt_ops.is_empty() || !self.portal_ops.is_empty() {
            if let Some(b) = bind_msg(&frame[5..]) {
                match self.stmt_ops.get(b.statement) {
                    Some(ops) => {
                        let ops = ops.clone();
                        self.portal_ops.insert(b.portal.to_vec(), ops);
                    }
                    None => {
                        self.portal_ops.remove(b.portal);
                    }
                }
            }
        }
        if self.rewrite_statements {
            if let Some(b) = bind_msg(&frame[5..]).filter(|b| !b.statement.is_empty()) {
                if let Some(server_name) = self.ensure_prepared(b.statement) {
                    put_bind(
                        &mut self.to_server,
                        b.portal,
                        server_name.as_bytes(),
                        b.rest,
                    );
                    self.expect.push(Expect::Bind(Some(server_name)));
                    return;
                }
            }
        }
        self.to_server.extend_from_slice(&frame);
        self.expect.push(Expect::Bind(None));
    }

    fn on_describe_or_close(&mut self, tag: u8, frame: BytesMut) {
        self.unsynced = true;
        let target = if self.rewrite_statements {
            target_msg(&frame[5..])
        } else {
            None
        };
        match target {
            Some((b'S', name)) if !name.is_empty() && self.statements.contains_key(name) => {
                let name = name.to_vec();
                if tag == b'C' {
                    // The shared server-side statement stays; the client's name goes.
                    self.statements.remove(&name);
                    let mut reply = BytesMut::with_capacity(5);
                    backend_msg::close_complete(&mut reply);
                    self.expect.push(Expect::Synthetic(reply.freeze()));
                } else if let Some(server_name) = self.ensure_prepared(&name) {
                    put_target(&mut self.to_server, b'D', b'S', server_name.as_bytes());
                    self.expect.push(Expect::Describe(Some(server_name)));
                }
            }
            _ => {
                self.to_server.extend_from_slice(&frame);
                self.expect.push(if tag == b'D' {
                    Expect::Describe(None)
                } else {
                    Expect::Close
                });
            }
        }
    }

    async fn flush_server(&mut self) -> Result<(), SessionError> {
        if self.to_server.is_empty() {
            return Ok(());
        }
        let Some(server) = self.server.as_mut() else {
            self.to_server.clear();
            return Ok(());
        };
        if server.stream.write_all(&self.to_server).await.is_err() {
            self.to_server.clear();
            return self.server_lost().await;
        }
        self.to_server.clear();
        // Synthetic replies queued ahead of anything the server owes go out now.
        self.expect
            .drain_synthetic(&mut self.to_client, self.status);
        Ok(())
    }

    async fn flush_client(&mut self) -> Result<(), SessionError> {
        if !self.to_client.is_empty() {
            // The answer has started: a lost replica can no longer be hidden.
            self.retry_armed = false;
            self.client.write_all(&self.to_client).await?;
            self.to_client.clear();
        }
        Ok(())
    }

    // ---- server to client ---------------------------------------------------------

    async fn on_server_input(&mut self) -> Result<(), SessionError> {
        loop {
            let server = self.server.as_mut().expect("attached");
            let buf = &mut server.read_buf;
            if self.server_stream_left > 0 {
                let take = self.server_stream_left.min(buf.len());
                self.to_client.extend_from_slice(&buf.split_to(take));
                self.server_stream_left -= take;
                if buf.is_empty() {
                    break;
                }
                continue;
            }
            let header = match check_frame(buf, u32::MAX as u64) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "malformed message from server");
                    return self.server_lost().await;
                }
            };
            if buf.len() < header.total {
                if matches!(header.tag, b'D' | b'd') && buf.len() >= STREAM_THRESHOLD {
                    self.server_stream_left = header.total - buf.len();
                    self.to_client.extend_from_slice(buf);
                    buf.clear();
                } else {
                    buf.reserve(header.total - buf.len());
                }
                break;
            }
            let mut error_code = None;
            if header.tag == b'E' && buf.len() >= header.total {
                let fields = parse_error_fields(&buf[5..header.total]);
                self.ctx.metrics.error(fields.code.get(..2).unwrap_or("??"));
                error_code = Some(fields.code.to_owned());
            }
            if matches!(header.tag, b'E' | b'N') && self.rewrite_statements && self.pinned.is_none()
            {
                let fields = parse_error_fields(&buf[5..header.total]);
                // An immediate shutdown warns (a notice, 57P01/57P02) before
                // closing; a terminated backend or a crash sends FATAL.
                let closing = fields.severity == "FATAL"
                    || fields.severity == "PANIC"
                    || (header.tag == b'N' && fields.code.starts_with("57P"));
                if closing {
                    // The server is closing this connection (shutdown, crash,
                    // pg_terminate_backend): the client's session is not over.
                    tracing::info!(code = %fields.code, "server ended the connection: {}", fields.message);
                    return self.server_lost().await;
                }
            }
            let mut frame = buf.split_to(header.total);
            tracing::trace!(tag = %(header.tag as char), len = frame.len(), "server message");
            if header.tag == b'A' {
                own_notification_pid(&mut frame, server.cancel.process_id, self.cancel.process_id);
            }
            self.expect
                .drain_synthetic(&mut self.to_client, self.status);
            let (step, fx) = self.expect.on_server(header.tag, &frame[5..]);
            match header.tag {
                b'S' => {
                    if let Some((n, v)) = parse_parameter_status(&frame[5..]) {
                        server.reported.insert(n.to_owned(), v.to_owned());
                    }
                }
                b'C' => match command_tag(&frame[5..]) {
                    b"COMMIT" => self.txn_committed = Some(true),
                    b"ROLLBACK" => self.txn_committed = Some(false),
                    tag if is_ddl_tag(tag) => {
                        // Statements prepared before may now be stale; again
                        // at the end of the transaction, when others see it.
                        self.ctx.statements.schema_changed();
                        self.ddl_in_txn = true;
                    }
                    _ => {}
                },
                _ => {}
            }
            if let Some(name) = fx.prepared {
                server.prepared.insert(name, Prepared::Ready);
            }
            if fx.skipped_to_sync {
                server.drop_pending_statements();
            }
            if let (Some(name), Some(code)) = (&fx.failed_statement, &error_code) {
                if statement_went_stale(code) {
                    server.prepared.remove(name);
                    self.renew_statement(name);
                }
            }
            if step == Step::Forward {
                self.to_client.extend_from_slice(&frame);
            }
            self.pending_ready = self.pending_ready.saturating_sub(fx.ignored_syncs);
            if let Some(status) = fx.ready {
                if status == b'I' && std::mem::take(&mut self.ddl_in_txn) {
                    self.ctx.statements.schema_changed();
                }
                self.on_ready(status);
                if status != b'I' && self.ctx.router.is_primary(self.backend) {
                    // A transaction on the primary: it may write.
                    self.write_unit = true;
                }
                if status == b'I' {
                    self.after_unit();
                }
            }
            if let Some(lsn) = fx.position {
                self.on_position(lsn);
            }
        }
        self.expect
            .drain_synthetic(&mut self.to_client, self.status);
        self.flush_client().await?;
        self.flush_server().await?;
        self.maybe_detach();
        Ok(())
    }

    /// ReadyForQuery: a unit of work ended; settle its session-state changes.
    fn on_ready(&mut self, status: u8) {
        let was = self.status;
        self.status = status;
        self.pending_ready = self.pending_ready.saturating_sub(1);
        if self.pending_ready == 0 {
            self.commit_in_flight = false;
        }
        // Replay the unit's statements in order: a SET inside a block that
        // this same unit rolls back must not be kept.
        let mut in_txn = was != b'I';
        let mut failed = was == b'E';
        let mut now = Vec::new();
        for op in self.expect.take_batch_ops() {
            match op {
                SessionOp::Begin => in_txn = true,
                SessionOp::Commit | SessionOp::Rollback => {
                    let committed = matches!(op, SessionOp::Commit) && !failed;
                    let done = std::mem::take(&mut self.txn_ops);
                    if committed {
                        now.extend(done);
                    }
                    in_txn = false;
                    failed = false;
                }
                op if in_txn => self.txn_ops.push(op),
                op => now.push(op),
            }
        }
        match status {
            b'I' => {
                if self.txn_committed == Some(true) {
                    now.extend(std::mem::take(&mut self.txn_ops));
                }
                self.txn_ops.clear();
                self.txn_committed = None;
            }
            b'E' => {}
            _ => {}
        }
        self.apply_ops(now);
    }

    fn apply_ops(&mut self, ops: Vec<SessionOp>) {
        for op in ops {
            let server = self.server.as_mut().expect("attached");
            match op {
                SessionOp::Set { key, stmt } => {
                    server.applied.insert(key.clone(), stmt.clone());
                    self.desired.insert(key, stmt);
                }
                SessionOp::Reset { key } => {
                    server.applied.remove(&key);
                    match self.startup.get(&key) {
                        Some(s) => self.desired.insert(key, s.clone()),
                        None => self.desired.remove(&key),
                    };
                }
                SessionOp::ResetAll => {
                    server.applied.clear();
                    self.desired = self.startup.clone();
                }
                SessionOp::DiscardAll => {
                    server.applied.clear();
                    server.prepared.clear();
                    self.desired = self.startup.clone();
                    self.statements.clear();
                }
                SessionOp::Deallocate(_)
                | SessionOp::Pin(_)
                | SessionOp::Begin
                | SessionOp::Commit
                | SessionOp::Rollback => {}
            }
        }
    }

    // ---- the end ----------------------------------------------------------------

    /// The client is gone: give the server connection back clean, or close it.
    async fn cleanup(&mut self) {
        self.cancel.set_target(None);
        let Some(mut server) = self.server.take() else {
            return;
        };
        if self.expect.only_position()
            && self.pending_ready == 0
            && !self.unsynced
            && self.server_stream_left == 0
        {
            // Only Fulcrum's own position query is in flight: its answer is
            // a moment away; wait for it and keep the connection.
            let expect = &mut self.expect;
            let drained =
                tokio::time::timeout(CLEANUP_TIMEOUT, drain_internal(&mut server, expect)).await;
            if !matches!(drained, Ok(true)) {
                server.discard();
                return;
            }
        }
        let busy = self.pending_ready > 0
            || self.unsynced
            || !self.expect.is_empty()
            || self.server_stream_left > 0;
        if busy || !server.read_buf.is_empty() {
            // Mid-query: stop the work and close; the server rolls back.
            let key = server.cancel.clone();
            server.discard();
            let timeout = self.ctx.config.connect_timeout;
            tokio::spawn(async move {
                let _ = crate::backend::connect::send_cancel(&key, timeout).await;
            });
            return;
        }
        let reset_session = self.pinned.is_some();
        let in_txn = self.status != b'I';
        if !in_txn && !reset_session {
            server.release();
            return;
        }
        let clean = async {
            if in_txn {
                server.run_internal("ROLLBACK").await?;
            }
            if reset_session {
                server.run_internal("DISCARD ALL").await?;
                server.applied.clear();
                server.prepared.clear();
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
async fn drain_internal(server: &mut ServerConn, expect: &mut Expectations) -> bool {
    loop {
        while let Ok(Some(h)) = check_frame(&server.read_buf, u32::MAX as u64) {
            if server.read_buf.len() < h.total {
                break;
            }
            let frame = server.read_buf.split_to(h.total);
            expect.on_server(h.tag, &frame[5..]);
        }
        if expect.is_empty() {
            return server.read_buf.is_empty();
        }
        match server.stream.read_buf(&mut server.read_buf).await {
            Ok(n) if n > 0 => {}
            _ => return false,
        }
    }
}

/// Brings a server connection's session parameters to what the client set:
/// `RESET ALL` then the client's statements, in one round trip.
async fn sync_params(
    server: &mut ServerConn,
    desired: &SessionParams,
) -> Result<(), InternalError> {
    let mut sql = String::new();
    if !server.applied.is_empty() {
        // RESET ALL leaves the role and the session user as they are.
        if server.applied.contains_key("session_authorization") {
            sql.push_str("RESET SESSION AUTHORIZATION;");
        }
        if server.applied.contains_key("role") {
            sql.push_str("RESET ROLE;");
        }
        sql.push_str("RESET ALL");
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

/// Whether the unit at the front of `buf` runs anything (a simple Query,
/// an Execute or a function call before its Sync): a unit that only
/// prepares or describes statements writes nothing.
fn unit_executes(buf: &[u8], max: u64) -> bool {
    let mut at = 0;
    while let Ok(Some(h)) = check_frame(&buf[at..], max) {
        match h.tag {
            b'Q' | b'E' | b'F' => return true,
            b'S' => return false,
            _ => {}
        }
        at += h.total;
        if at >= buf.len() {
            break;
        }
    }
    // The rest has not arrived yet: it may execute.
    true
}

/// Whether a statement text may commit a transaction: it mentions COMMIT
/// (COMMIT, COMMIT PREPARED, `...; COMMIT`) or starts with END. A false
/// positive only makes a lost connection's error say "may have committed".
fn may_commit(text: &[u8]) -> bool {
    session_sql::first_word_bytes(text).eq_ignore_ascii_case(b"end")
        || text.windows(6).any(|w| w.eq_ignore_ascii_case(b"commit"))
}

/// Whether `text` starts with `prefix`, ignoring ASCII case (never slices
/// inside a multi-byte character).
fn starts_with_ci(text: &str, prefix: &str) -> bool {
    text.as_bytes()
        .get(..prefix.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(prefix.as_bytes()))
}

/// A NotificationResponse from the client's own server connection carries
/// that backend's pid; the client knows Fulcrum's (BackendKeyData), so it
/// is given that one (clients skip their own notifications by pid).
fn own_notification_pid(frame: &mut [u8], server_pid: i32, client_pid: i32) {
    if frame.len() >= 9 && frame[5..9] == server_pid.to_be_bytes() {
        frame[5..9].copy_from_slice(&client_pid.to_be_bytes());
    }
}

/// A CommandComplete tag of DDL (`CREATE TYPE`, `DROP TABLE`, `ALTER ...`).
fn is_ddl_tag(tag: &[u8]) -> bool {
    tag.starts_with(b"CREATE ") || tag.starts_with(b"DROP ") || tag.starts_with(b"ALTER ")
}

/// Errors after which a shared server-side statement is not used again:
/// its cached plan cannot change result type (0A000), a type or object it
/// was prepared with is gone (XX000 "cache lookup failed", 42704), or the
/// server does not have it (26000).
fn statement_went_stale(code: &str) -> bool {
    matches!(code, "0A000" | "XX000" | "42704" | "26000")
}

/// The session ops of a simple Query whose first word is DEALLOCATE.
fn deallocate_ops(body: &[u8]) -> Option<Vec<SessionOp>> {
    let text = query_text(body)?;
    session_sql::first_word_bytes(text)
        .eq_ignore_ascii_case(b"deallocate")
        .then(|| session_sql::scan(text))
}

/// Reads under `session` and `strong` respect a position.
fn route_is_causal(c: fulcrum_config::Consistency) -> bool {
    c != fulcrum_config::Consistency::Eventual
}

/// `COMMIT AND CHAIN` / `ROLLBACK AND CHAIN` (not `AND NO CHAIN`).
fn is_chained(sql: &str) -> bool {
    let words: Vec<String> = sql
        .split_whitespace()
        .map(|w| w.trim_end_matches(';').to_ascii_lowercase())
        .collect();
    words.len() >= 3 && words[words.len() - 2] == "and" && words[words.len() - 1] == "chain"
}

#[cfg(test)]
mod text_tests {
    use super::{is_chained, may_commit, own_notification_pid, starts_with_ci};

    #[test]
    fn prefixes_never_slice_inside_a_character() {
        assert!(starts_with_ci(
            "SET TRANSACTION READ WRITE",
            "set transaction"
        ));
        assert!(!starts_with_ci("SET TRANSACTIO", "set transaction"));
        // 14 ASCII bytes, then a 2-byte character across byte 15.
        assert!(!starts_with_ci("SET TRANSACTIOé", "set transaction"));
        assert!(!starts_with_ci("ééééééééé", "set transaction"));
    }

    #[test]
    fn statements_that_may_commit_are_seen() {
        assert!(may_commit(b"COMMIT"));
        assert!(may_commit(b"end"));
        assert!(may_commit(b"INSERT INTO t VALUES (1); commit"));
        assert!(may_commit(b"COMMIT PREPARED 'x'"));
        assert!(!may_commit(b"ROLLBACK"));
        assert!(!may_commit(b"SELECT 1"));
        assert!(!may_commit(b"ending"), "END is a whole word");
    }

    #[test]
    fn own_notifications_carry_the_pid_the_client_knows() {
        // NotificationResponse: 'A', length, pid, channel, payload.
        let mut frame = b"A\0\0\0\x0f\0\0\x01\x02ch\0p\0".to_vec();
        own_notification_pid(&mut frame, 0x0102, 77);
        assert_eq!(&frame[5..9], &77i32.to_be_bytes());
        let mut other = b"A\0\0\0\x0f\0\0\x09\x09ch\0p\0".to_vec();
        own_notification_pid(&mut other, 0x0102, 77);
        assert_eq!(
            &other[5..9],
            &0x0909i32.to_be_bytes(),
            "another backend's pid stays"
        );
    }

    #[test]
    fn and_chain_is_told_from_and_no_chain() {
        assert!(is_chained("COMMIT AND CHAIN"));
        assert!(is_chained("rollback work and chain;"));
        assert!(!is_chained("COMMIT AND NO CHAIN"));
        assert!(!is_chained("COMMIT"));
    }
}

#[cfg(test)]
mod unit_executes_tests {
    use super::unit_executes;

    fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut f = vec![tag];
        f.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        f.extend_from_slice(body);
        f
    }

    #[test]
    fn a_prepare_only_unit_executes_nothing() {
        let unit = [
            frame(b'P', b"s0\0SELECT $1::int\0\0\0"),
            frame(b'D', b"Ss0\0"),
            frame(b'S', b""),
            frame(b'Q', b"INSERT INTO t VALUES (1)\0"),
        ]
        .concat();
        assert!(!unit_executes(&unit, 1 << 20), "stops at the first Sync");
        let exec = [
            frame(b'B', b"\0s0\0\0\0\0\0\0\0"),
            frame(b'E', b"\0\0\0\0\0"),
            frame(b'S', b""),
        ]
        .concat();
        assert!(unit_executes(&exec, 1 << 20));
        assert!(unit_executes(&frame(b'Q', b"SELECT 1\0"), 1 << 20));
        assert!(
            unit_executes(&frame(b'P', b"s0\0SELECT 1\0\0\0"), 1 << 20),
            "incomplete: may execute"
        );
    }
}
