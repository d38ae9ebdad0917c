//! One MySQL client's session after login: read a command, pick a server
//! (transaction pooling: a server connection only while the client is in a
//! transaction, pinned, or right after an insert whose id it may ask for),
//! forward the command's packets unchanged, and forward the answer's packets
//! unchanged up to its end (`reply.rs`), which says whether the client is
//! now in a transaction (server status flags, never guessed from text).
//!
//! Session state, the same principle as for PostgreSQL: `SET` statements are
//! replayed on every server connection the client uses (COM_RESET_CONNECTION
//! and the client's statements when the connection's differ); the default
//! schema (COM_INIT_DB, `USE`) is set where it differs; state that cannot be
//! replayed (user variables, temporary tables, GET_LOCK, LOCK TABLES,
//! prepared statements, ...) pins the client to its connection.

mod causal;
mod prepared;
mod route;

use std::collections::HashMap;
use std::sync::Arc;

use bytes::BytesMut;
use fulcrum_pool::{BackendId, Checkout, PoolError, Route};
use fulcrum_sql::Decision;
use mysql_common::constants::{CapabilityFlags as C, StatusFlags};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::context::MyClusterContext;
use super::error::SessionError;
use super::login::Login;
use super::reply::{Reply, Shape};
use super::wire::{put_err, put_error, put_ok, read_client_message};
use crate::backend::conn::InternalError;
use crate::backend::ServerConn;
use crate::codec::capabilities::WIRE_FORMAT;
use crate::codec::command::{command, init_db_schema, query_text, Command};
use crate::codec::err::codes;
use crate::codec::packet::{scan_message, write_packet, HEADER_LEN, MAX_PAYLOAD};
use crate::codec::response::build_eof;

/// Answer bytes buffered before they are written to the client.
const FLUSH_AT: usize = 64 * 1024;
/// Most replayed SET statements kept; past that the client is pinned.
const MAX_SETS: usize = 64;

pub struct Session {
    ctx: Arc<MyClusterContext>,
    client: TcpStream,
    cbuf: BytesMut,
    out: BytesMut,
    user: Arc<str>,
    caps: C,
    wire_format: C,
    charset: u8,
    schema: Option<String>,
    /// The client's SET statements, replayed in order.
    desired: Vec<String>,
    server: Option<Checkout<ServerConn>>,
    backend: BackendId,
    pinned: Option<&'static str>,
    /// Keep the connection for the next command (LAST_INSERT_ID()).
    keep_for_next: bool,
    /// The command in flight may be sent again if its server dies before
    /// answering (a read on a replica, outside a transaction).
    retryable: bool,
    /// Bytes of the current command's answer already went to the client.
    answered: bool,
    /// The id this client was given (what `KILL QUERY` names).
    connection_id: u32,
    /// When the current server connection was attached (metrics).
    attached_at: Option<std::time::Instant>,
    /// Turns true on SIGTERM: the session ends at its next transaction boundary.
    shutdown: tokio::sync::watch::Receiver<bool>,
    scramble: [u8; 20],
    /// Status flags of the last answer (in a transaction, autocommit).
    status: StatusFlags,
    /// The client's prepared statements, by the ids Fulcrum gave it.
    stmts: HashMap<u32, super::statements::ClientStmt>,
    next_stmt: u32,
    last_prepared: Option<u32>,
    /// Read consistency of this session (`SET fulcrum.consistency`).
    consistency: fulcrum_config::Consistency,
    /// The hint of the statement being routed, if it has one.
    unit_consistency: Option<fulcrum_config::Consistency>,
    /// The GTID the client's reads must not be older than.
    causal: fulcrum_pool::Causal<String>,
    /// The classified route of the command being forwarded.
    unit_route: Route,
    /// This client's row in `SHOW CLIENTS`.
    client_entry: fulcrum_cluster::clients::ClientHandle,
    /// When the command that started the current unit of work arrived.
    unit_started: Option<std::time::Instant>,
}

/// What a command needs besides forwarding.
#[derive(Default, Clone)]
struct Effects {
    set: Option<String>,
    schema: Option<String>,
    /// Keep the server connection for the next command.
    keep_next: bool,
}

impl Session {
    pub fn new(
        ctx: Arc<MyClusterContext>,
        client: TcpStream,
        cbuf: BytesMut,
        login: Login,
        shutdown: tokio::sync::watch::Receiver<bool>,
        client_entry: fulcrum_cluster::clients::ClientHandle,
    ) -> Session {
        let ctx_consistency = ctx.config.consistency;
        Session {
            backend: ctx.router.primary().unwrap_or(0),
            ctx,
            client,
            cbuf,
            // Allocated at first use and kept (memory per idle client).
            out: BytesMut::new(),
            user: login.user,
            wire_format: login.caps & WIRE_FORMAT,
            caps: login.caps,
            charset: login.charset,
            schema: login.schema,
            desired: Vec::new(),
            server: None,
            pinned: None,
            keep_for_next: false,
            retryable: false,
            answered: false,
            connection_id: login.connection_id,
            attached_at: None,
            shutdown,
            scramble: login.scramble,
            status: StatusFlags::SERVER_STATUS_AUTOCOMMIT,
            stmts: HashMap::new(),
            next_stmt: 1,
            last_prepared: None,
            consistency: ctx_consistency,
            unit_consistency: None,
            causal: fulcrum_pool::Causal::default(),
            unit_route: Route::Primary,
            client_entry,
            unit_started: None,
        }
    }

    /// Completes the login (the schema asked for is checked on a server),
    /// then serves commands until the client quits.
    pub async fn run(mut self, login_seq: u8) -> Result<(), SessionError> {
        if let Some(schema) = self.schema.clone() {
            if let Err(e) = self.check_schema(&schema, login_seq).await {
                let _ = self.flush().await;
                return Err(e);
            }
        }
        put_ok(&mut self.out, login_seq, self.caps, self.status);
        self.flush().await?;
        self.ctx.set_running(self.connection_id, None);
        if self.ctx.config.pool_mode == fulcrum_config::PoolMode::Session {
            self.pin("session pool mode");
        }
        let r = self.serve().await;
        self.cleanup().await;
        self.ctx.forget_client(self.connection_id);
        match r {
            Err(SessionError::ClientGone) => Ok(()),
            r => r,
        }
    }

    async fn check_schema(&mut self, schema: &str, seq: u8) -> Result<(), SessionError> {
        self.attach(Route::Primary, seq).await?;
        let server = self.server.as_mut().expect("attached");
        match server.use_schema(schema).await {
            Ok(()) => {
                self.maybe_detach();
                Ok(())
            }
            Err(InternalError::Server {
                payload, message, ..
            }) => {
                write_packet(&mut self.out, seq, &payload);
                Err(SessionError::Refused(message))
            }
            Err(e) => Err(self.lost(seq, &e.to_string()).await),
        }
    }

    async fn serve(&mut self) -> Result<(), SessionError> {
        loop {
            match self.one_command().await {
                Ok(true) => {}
                Ok(false) => return Ok(()),
                Err(SessionError::Recoverable) => {}
                Err(e) => return Err(e),
            }
            self.flush().await?;
        }
    }

    /// Reads and handles one command; false on COM_QUIT.
    async fn one_command(&mut self) -> Result<bool, SessionError> {
        let max = self.ctx.config.max_message_size.min(usize::MAX as u64) as usize;
        {
            let span = loop {
                let draining = *self.shutdown.borrow();
                if draining && self.at_boundary() {
                    return Ok(false);
                }
                tokio::select! {
                    r = read_client_message(&mut self.client, &mut self.cbuf, max) => break r?,
                    _ = self.shutdown.changed(), if !draining => continue,
                }
            };
            let msg = self.cbuf.split_to(span.total);
            self.ctx.metrics.bytes_in.inc_by(span.total as u64);
            let seq = span.last_seq.wrapping_add(1);
            let first = &msg[HEADER_LEN..HEADER_LEN + span.payload_len.min(MAX_PAYLOAD)];
            let cmd = match command(first) {
                Ok(c) => c,
                Err(_) => {
                    put_error(
                        &mut self.out,
                        seq,
                        codes::UNKNOWN_COM,
                        "fulcrum: empty command",
                    );
                    return Ok(true);
                }
            };
            match cmd {
                Command::Quit => return Ok(false),
                Command::Ping => put_ok(&mut self.out, seq, self.caps, self.status),
                Command::SetOption => {
                    // Server connections always allow multi-statements.
                    if self.caps.contains(C::CLIENT_DEPRECATE_EOF) {
                        put_ok(&mut self.out, seq, self.caps, self.status);
                    } else {
                        write_packet(&mut self.out, seq, &build_eof(0, self.status));
                    }
                }
                Command::ResetConnection => self.reset_connection(seq).await?,
                Command::InitDb => {
                    let schema =
                        init_db_schema(first).map(|s| String::from_utf8_lossy(s).into_owned());
                    let effects = Effects {
                        schema,
                        ..Default::default()
                    };
                    self.forward(&msg, seq, Shape::Results, Route::Primary, effects)
                        .await?;
                }
                Command::Query => {
                    let text = query_text(first)
                        .and_then(|t| std::str::from_utf8(t).ok())
                        .unwrap_or("");
                    if let Some(target) = kill_target(text) {
                        self.kill(target, seq).await;
                        return Ok(true);
                    }
                    if self.try_answer_setting(text, seq) {
                        return Ok(true);
                    }
                    self.note_hint(text);
                    let (route, effects) = self.route_query(text);
                    self.forward(&msg, seq, Shape::Results, route, effects)
                        .await?;
                }
                Command::StmtPrepare => self.stmt_prepare(first, seq).await?,
                Command::StmtExecute | Command::StmtFetch | Command::StmtBulkExecute => {
                    let payload = reassembled(&msg, &span);
                    self.stmt_execute(&payload, seq).await?
                }
                Command::StmtReset => self.stmt_reset(first, seq).await?,
                Command::StmtClose => self.stmt_close(first),
                Command::StmtSendLongData => {
                    let payload = reassembled(&msg, &span);
                    self.stmt_long_data(&payload, seq).await?
                }
                Command::FieldList => {
                    self.forward(
                        &msg,
                        seq,
                        Shape::FieldList,
                        Route::Primary,
                        Effects::default(),
                    )
                    .await?
                }
                Command::Statistics => {
                    self.forward(
                        &msg,
                        seq,
                        Shape::OnePacket,
                        Route::Primary,
                        Effects::default(),
                    )
                    .await?
                }
                Command::ChangeUser => {
                    let payload = reassembled(&msg, &span);
                    self.change_user(&payload, seq).await?
                }
                Command::ProcessKill | Command::Unknown(_) => {
                    let what = match cmd {
                        Command::ProcessKill => {
                            "COM_PROCESS_KILL is not supported through Fulcrum; use KILL QUERY <id>"
                        }
                        _ => "unknown command",
                    };
                    put_error(
                        &mut self.out,
                        seq,
                        codes::NOT_SUPPORTED_YET,
                        &format!("fulcrum: {what}"),
                    );
                }
            }
            Ok(true)
        }
    }

    /// Where a COM_QUERY goes, and what it changes in the session.
    fn route_query(&mut self, text: &str) -> (Route, Effects) {
        let mut effects = Effects::default();
        let decision = self.ctx.classify(text);
        let first = text
            .trim_start()
            .split(|c: char| c.is_whitespace() || c == ';')
            .next()
            .unwrap_or("");
        if first.eq_ignore_ascii_case("use") {
            let name = text.trim_start()[first.len()..]
                .trim()
                .trim_end_matches(';')
                .trim()
                .trim_matches('`');
            effects.schema = Some(name.to_owned());
        } else if decision == Decision::Set {
            if self.desired.len() >= MAX_SETS {
                self.pin("many session settings");
            } else {
                effects.set = Some(text.trim().trim_end_matches(';').to_owned());
            }
        }
        // FOUND_ROWS() must run where SQL_CALC_FOUND_ROWS did: keep the
        // connection for the next command.
        effects.keep_next = contains_ignore_case(text, "sql_calc_found_rows");
        (self.route_unit(decision), effects)
    }

    /// `KILL QUERY <id>` (and `KILL [CONNECTION] <id>`, which stops the
    /// query too but leaves the client connected) where `id` is the
    /// connection id Fulcrum gave a client: the query running for that client
    /// is killed on its server, as the killer's user, and nothing else.
    async fn kill(&mut self, (_query_only, id): (bool, u32), seq: u8) {
        match self.ctx.running_on(id) {
            None => put_err(
                &mut self.out,
                seq,
                1094,
                *b"HY000",
                &format!("Unknown thread id: {id}"),
            ),
            Some(None) => put_ok(&mut self.out, seq, self.caps, self.status),
            Some(Some((backend, thread))) => {
                let conn = self
                    .ctx
                    .open(backend, &self.user, self.wire_format, self.charset)
                    .await;
                let result = match conn {
                    Ok(mut conn) => conn
                        .run_simple(Command::Query, format!("KILL QUERY {thread}").as_bytes())
                        .await
                        .map_err(|e| match e {
                            InternalError::Server { payload, .. } => Ok(payload),
                            other => Err(other.to_string()),
                        }),
                    Err(e) => Err(Err(e.to_string())),
                };
                match result {
                    Ok(()) => put_ok(&mut self.out, seq, self.caps, self.status),
                    Err(Ok(payload)) => {
                        write_packet(&mut self.out, seq, &payload);
                    }
                    Err(Err(e)) => put_error(
                        &mut self.out,
                        seq,
                        codes::UNKNOWN,
                        &format!("fulcrum: could not kill the query of connection {id}: {e}"),
                    ),
                }
            }
        }
    }

    /// COM_CHANGE_USER: the new user's password is checked against the
    /// login's scramble; the session then starts afresh as that user (no
    /// settings, statements or pins; its server connection goes back).
    async fn change_user(&mut self, payload: &[u8], seq: u8) -> Result<(), SessionError> {
        let c = match crate::codec::change_user::parse_change_user(payload, self.caps) {
            Ok(c) => c,
            Err(e) => {
                put_error(
                    &mut self.out,
                    seq,
                    codes::HANDSHAKE,
                    &format!("fulcrum: bad COM_CHANGE_USER: {e}"),
                );
                return Ok(());
            }
        };
        let plugin = c
            .auth_plugin
            .as_deref()
            .unwrap_or(crate::auth::native::PLUGIN);
        let password = self.ctx.passwords.get(&c.user).cloned();
        let trust = self.ctx.config.client_auth == fulcrum_config::ClientAuth::Trust;
        let ok = password.as_ref().is_some_and(|p| {
            trust || super::login::password_ok(plugin, p, &self.scramble, &c.auth_response)
        });
        if !ok {
            let m = format!(
                "Access denied for user '{}' (using password: {})",
                c.user,
                if c.auth_response.is_empty() {
                    "NO"
                } else {
                    "YES"
                }
            );
            put_error(&mut self.out, seq, codes::ACCESS_DENIED, &m);
            // MySQL closes the connection after a failed change of user.
            let _ = self.flush().await;
            return Err(SessionError::Refused(m));
        }
        // Forget everything of the old user; a clean connection goes back.
        self.pinned = None;
        self.keep_for_next = false;
        self.cleanup().await;
        self.desired.clear();
        self.stmts.clear();
        self.last_prepared = None;
        self.status = StatusFlags::SERVER_STATUS_AUTOCOMMIT;
        self.user = c.user.as_str().into();
        if let Some(cs) = c.charset {
            self.charset = cs;
        }
        self.schema = None;
        if let Some(schema) = c.schema {
            self.schema = Some(schema.clone());
            self.check_schema(&schema, seq).await?;
        }
        if self.ctx.config.pool_mode == fulcrum_config::PoolMode::Session {
            self.pin("session pool mode");
        }
        put_ok(&mut self.out, seq, self.caps, self.status);
        Ok(())
    }

    /// Between transactions with nothing in flight (a SIGTERM drain may end
    /// the session here): not in a transaction, no command half-read.
    fn at_boundary(&self) -> bool {
        let in_txn = self.status.contains(StatusFlags::SERVER_STATUS_IN_TRANS)
            || !self.status.contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT);
        !in_txn && self.cbuf.is_empty()
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

    /// COM_RESET_CONNECTION: the client's session state is forgotten; a
    /// pinned connection is reset on the server too and unpinned.
    async fn reset_connection(&mut self, seq: u8) -> Result<(), SessionError> {
        self.desired.clear();
        self.keep_for_next = false;
        if let Some(server) = self.server.as_mut() {
            match server.reset().await {
                Ok(()) => {}
                Err(e) => return Err(self.lost(seq, &e.to_string()).await),
            }
        }
        self.pinned = None;
        self.status = StatusFlags::SERVER_STATUS_AUTOCOMMIT;
        put_ok(&mut self.out, seq, self.caps, self.status);
        self.maybe_detach();
        Ok(())
    }

    /// Sends the client's command to its server and its answer back.
    async fn forward(
        &mut self,
        msg: &[u8],
        seq: u8,
        shape: Shape,
        route: Route,
        effects: Effects,
    ) -> Result<(), SessionError> {
        let fresh = self.server.is_none();
        if !self.ensure_attached(route, seq).await? {
            return Ok(());
        }
        self.retryable = fresh
            && route == Route::Replica
            && self.pinned.is_none()
            && !self.ctx.router.is_primary(self.backend);
        self.answered = false;
        let first = self.backend;
        let again = effects.clone();
        match self.forward_bytes(msg, seq, shape, effects).await {
            Err(SessionError::Retry) => {
                self.retryable = false;
                tracing::info!(replica = %self.ctx.address(first), "replica lost before it answered; the read goes to another backend");
                // The dead replica is suspect now: the router will not pick it.
                self.attach(route, seq).await?;
                if self.backend == first {
                    self.maybe_detach();
                    self.attach(Route::Primary, seq).await?;
                }
                match self.prepare_server(seq).await {
                    Ok(()) => {}
                    Err(Ok(())) => {
                        self.maybe_detach();
                        return Ok(());
                    }
                    Err(Err(e)) => return Err(e),
                }
                self.forward_bytes(msg, seq, shape, again).await
            }
            r => {
                self.retryable = false;
                r
            }
        }
    }

    /// Attaches a server for `route` if none is attached, with the client's
    /// schema and settings; false when that failed and an ERR was queued.
    async fn ensure_attached(&mut self, route: Route, seq: u8) -> Result<bool, SessionError> {
        self.unit_route = route;
        if self.server.is_none() {
            self.unit_started = Some(std::time::Instant::now());
        }
        if self.server.is_some() {
            return Ok(true);
        }
        // Admin PAUSE (and SWITCHOVER) holds new units of work here; the
        // admission is counted until the server connection is checked out.
        let admission = self.ctx.router.admit().await;
        self.attach(route, seq).await?;
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
    async fn forward_bytes(
        &mut self,
        msg: &[u8],
        seq: u8,
        shape: Shape,
        effects: Effects,
    ) -> Result<(), SessionError> {
        if matches!(msg.get(HEADER_LEN), Some(&0x03) | Some(&0x17)) {
            self.ctx
                .metrics
                .queries(self.backend, self.route_label(), 1);
        }
        let keep_was = std::mem::take(&mut self.keep_for_next);
        let server = self.server.as_mut().expect("attached");
        if server.stream.write_all(msg).await.is_err() {
            return Err(self.lost(seq, "writing to the server failed").await);
        }
        if let Some(t) = self.unit_started.take() {
            self.ctx.metrics.proxy.observe(t.elapsed().as_secs_f64());
        }
        let mut reply = Reply::new(shape, server.caps);
        let max = self.ctx.config.max_message_size as usize;
        while !reply.is_done() {
            let frame = self.next_server_message(seq, max).await?;
            let first =
                &frame[HEADER_LEN..HEADER_LEN + (frame.len() - HEADER_LEN).min(MAX_PAYLOAD)];
            if let Err(e) = reply.on_message(first) {
                return Err(self.lost(seq, &e.0).await);
            }
            self.ctx.metrics.bytes_out.inc_by(frame.len() as u64);
            self.out.extend_from_slice(&frame);
            if reply.wants_file() {
                self.flush().await?;
                self.send_file(seq).await?;
                reply.file_sent();
            } else if self.out.len() >= FLUSH_AT {
                self.flush().await?;
            }
        }
        if let Some(status) = reply.status {
            self.status = status;
        }
        if !reply.error || reply.last_gtid.is_some() {
            self.after_primary_answer(reply.last_gtid.take(), self.unit_route)
                .await?;
        }
        if let Some(code) = reply.error_code {
            self.ctx.metrics.error(&code.to_string());
        }
        if !reply.error {
            let server = self.server.as_mut().expect("attached");
            if let Some(set) = effects.set {
                self.desired.push(set);
                server.applied = self.desired.clone();
            }
            if let Some(schema) = effects.schema {
                server.schema = Some(schema.clone());
                self.schema = Some(schema);
            }
        }
        // An insert's id may be asked for next (LAST_INSERT_ID()): same connection.
        self.keep_for_next = (reply.last_insert_id != 0 || effects.keep_next) && !keep_was;
        if !reply.holds_connection() {
            self.maybe_detach();
        }
        Ok(())
    }

    /// LOAD DATA LOCAL INFILE: the client's packets go to the server as they
    /// come, up to the empty packet that ends the file.
    async fn send_file(&mut self, seq: u8) -> Result<(), SessionError> {
        loop {
            let header = loop {
                match crate::codec::packet::check_packet(&self.cbuf, MAX_PAYLOAD) {
                    Ok(Some(h)) if self.cbuf.len() >= HEADER_LEN + h.len => break h,
                    Ok(_) => {
                        if self.cbuf.capacity() - self.cbuf.len() < 4096 {
                            self.cbuf.reserve(64 * 1024);
                        }
                        if self.client.read_buf(&mut self.cbuf).await? == 0 {
                            return Err(SessionError::ClientGone);
                        }
                    }
                    Err(e) => return Err(SessionError::Refused(format!("bad file packet: {e}"))),
                }
            };
            let packet = self.cbuf.split_to(HEADER_LEN + header.len);
            let server = self.server.as_mut().expect("attached");
            if server.stream.write_all(&packet).await.is_err() {
                return Err(self.lost(seq, "writing to the server failed").await);
            }
            if header.len == 0 {
                return Ok(());
            }
        }
    }

    /// The next whole message from the attached server.
    async fn next_server_message(&mut self, seq: u8, max: usize) -> Result<BytesMut, SessionError> {
        let server: &mut ServerConn = self.server.as_mut().expect("attached");
        let span = loop {
            match scan_message(&server.read_buf, max.max(MAX_PAYLOAD)) {
                Ok(Some(span)) => break span,
                Ok(None) => {
                    if server.read_buf.capacity() - server.read_buf.len() < 4096 {
                        server.read_buf.reserve(16 * 1024);
                    }
                    match server.stream.read_buf(&mut server.read_buf).await {
                        Ok(n) if n > 0 => {}
                        _ => return Err(self.lost(seq, "the server closed the connection").await),
                    }
                }
                Err(e) => return Err(self.lost(seq, &e.to_string()).await),
            }
        };
        Ok(server.read_buf.split_to(span.total))
    }

    /// Gives the attached server the client's schema and session settings.
    async fn prepare_server(&mut self, seq: u8) -> Result<(), Result<(), SessionError>> {
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
                write_packet(&mut self.out, seq, &payload);
                Err(Ok(()))
            }
            Err(e) => Err(Err(self.lost(seq, &e.to_string()).await)),
        }
    }

    /// Attaches a server connection for `route`: a replica (the primary if
    /// none can be had), or the primary, waiting up to `pool_timeout` for
    /// one during a failover.
    async fn attach(&mut self, route: Route, seq: u8) -> Result<(), SessionError> {
        if let Some(b) = self.ctx.router.pick(route) {
            if !self.ctx.router.is_primary(b) && self.try_attach(b).await {
                return Ok(());
            }
        }
        let wait = self.ctx.config.pool_timeout;
        let deadline = tokio::time::Instant::now() + wait;
        let mut why = format!(
            "the primary {} is down",
            self.ctx.address(self.ctx.router.last_primary())
        );
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let primary = match self.ctx.router.primary() {
                Some(p) => Some(p),
                None => self.ctx.router.wait_primary(None, left).await,
            };
            let Some(primary) = primary else { break };
            match self.checkout(primary).await {
                Ok(server) => {
                    self.client_entry.set_active(primary);
                    self.backend = primary;
                    self.ctx
                        .set_running(self.connection_id, Some((primary, server.connection_id)));
                    self.server = Some(server);
                    self.attached_at = Some(std::time::Instant::now());
                    return Ok(());
                }
                Err(PoolError::Connect(e)) if e.is_backend_down() => {
                    self.ctx.router.suspect(primary);
                    why = e.to_string();
                }
                Err(PoolError::Connect(crate::backend::ConnectError::Server {
                    payload,
                    message,
                    ..
                })) => {
                    write_packet(&mut self.out, seq, &payload);
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
                    put_error(&mut self.out, seq, codes::CON_COUNT, &msg);
                    let _ = self.flush().await;
                    return Err(SessionError::Refused(msg));
                }
            }
            if deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .is_zero()
            {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let msg = format!(
            "fulcrum: {why}; cluster \"{}\" has no primary to take this work; waited {wait:?}, try again",
            self.ctx.name()
        );
        put_error(&mut self.out, seq, codes::SERVER_SHUTDOWN, &msg);
        let _ = self.flush().await;
        Err(SessionError::Refused(msg))
    }

    /// A replica's connection, or false when it cannot be had (the replica
    /// is then reported suspect and the work goes to the primary).
    async fn try_attach(&mut self, backend: BackendId) -> bool {
        match self.checkout(backend).await {
            Ok(mut server) => {
                if !self.causal_ok(backend, &mut server).await {
                    if server.read_buf.is_empty() {
                        server.release();
                    } else {
                        server.discard();
                    }
                    return false;
                }
                self.client_entry.set_active(backend);
                self.backend = backend;
                self.ctx
                    .set_running(self.connection_id, Some((backend, server.connection_id)));
                self.server = Some(server);
                self.attached_at = Some(std::time::Instant::now());
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

    async fn checkout(
        &self,
        backend: BackendId,
    ) -> Result<Checkout<ServerConn>, PoolError<crate::backend::ConnectError>> {
        let pool = self
            .ctx
            .pool(backend, &self.user, self.wire_format, self.charset);
        let ctx = self.ctx.clone();
        let (user, wire, charset) = (self.user.clone(), self.wire_format, self.charset);
        pool.get(|| async move { ctx.open(backend, &user, wire, charset).await })
            .await
    }

    /// Returns the server connection to the pool unless the client needs it.
    fn maybe_detach(&mut self) {
        if self.pinned.is_some() || self.keep_for_next {
            return;
        }
        if let Some(server) = self.server.take() {
            self.ctx.set_running(self.connection_id, None);
            self.client_entry.set_idle();
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
                        schema = ?self.schema,
                        server = %self.ctx.address(self.backend),
                        took_ms = took.as_millis() as u64,
                        "slow unit of work"
                    );
                }
            }
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

    /// The server connection died under the client: ERR for the command in
    /// flight; a client that was in a transaction or pinned is disconnected
    /// (its state is gone, and it must not go on as if it were not).
    async fn lost(&mut self, seq: u8, why: &str) -> SessionError {
        let backend = self.backend;
        if let Some(s) = self.server.take() {
            s.discard();
        }
        self.ctx.set_running(self.connection_id, None);
        self.ctx.router.suspect(backend);
        let in_txn = self.status.contains(StatusFlags::SERVER_STATUS_IN_TRANS)
            || !self.status.contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT);
        let msg = format!(
            "fulcrum: lost the connection to server {} of cluster \"{}\" ({why}); {}",
            self.ctx.address(backend),
            self.ctx.name(),
            if in_txn || self.pinned.is_some() {
                "the transaction or session state was lost: reconnect"
            } else {
                "the statement may or may not have completed"
            }
        );
        tracing::warn!(server = %self.ctx.address(backend), "server connection lost during a client's work");
        if self.retryable && !self.answered {
            self.retryable = false;
            self.out.clear();
            return SessionError::Retry;
        }
        // ER_CONNECTION_KILLED-like: 2013 is client-side, so use 1927 (MariaDB).
        put_err(&mut self.out, seq, 1927, *b"70100", &msg);
        let _ = self.flush().await;
        self.status = StatusFlags::SERVER_STATUS_AUTOCOMMIT;
        self.keep_for_next = false;
        if in_txn || self.pinned.is_some() {
            SessionError::Refused(msg)
        } else {
            SessionError::Recoverable
        }
    }

    async fn flush(&mut self) -> Result<(), SessionError> {
        if !self.out.is_empty() {
            self.answered = true;
            self.client.write_all(&self.out).await?;
            self.out.clear();
        }
        Ok(())
    }

    /// The client is gone: a connection in a transaction or pinned is closed
    /// (the server rolls back and forgets); otherwise it goes back.
    async fn cleanup(&mut self) {
        if let Some(server) = self.server.take() {
            let dirty = self.pinned.is_some()
                || self.status.contains(StatusFlags::SERVER_STATUS_IN_TRANS)
                || !self.status.contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT);
            if dirty || !server.read_buf.is_empty() {
                server.discard();
            } else {
                server.release();
            }
        }
    }
}

/// The payload of a whole client message (its packets joined).
fn reassembled(msg: &[u8], span: &crate::codec::packet::MessageSpan) -> Vec<u8> {
    match crate::codec::packet::reassemble(msg, usize::MAX) {
        Ok(Some(m)) => m.payload.into_owned(),
        _ => msg[HEADER_LEN..HEADER_LEN + span.payload_len.min(msg.len() - HEADER_LEN)].to_vec(),
    }
}

fn contains_ignore_case(text: &str, needle: &str) -> bool {
    text.len() >= needle.len()
        && text
            .as_bytes()
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// `KILL [QUERY | CONNECTION] <id>`: (query only?, id).
pub fn kill_target(text: &str) -> Option<(bool, u32)> {
    let mut words = text.trim().trim_end_matches(';').split_whitespace();
    if !words.next()?.eq_ignore_ascii_case("kill") {
        return None;
    }
    let mut w = words.next()?;
    let mut query = false;
    if w.eq_ignore_ascii_case("query") {
        query = true;
        w = words.next()?;
    } else if w.eq_ignore_ascii_case("connection") {
        w = words.next()?;
    }
    let id = w.parse().ok()?;
    words.next().is_none().then_some((query, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_statements_name_their_target() {
        assert_eq!(kill_target("KILL QUERY 12"), Some((true, 12)));
        assert_eq!(kill_target("kill 7;"), Some((false, 7)));
        assert_eq!(kill_target("KILL CONNECTION 3"), Some((false, 3)));
        assert_eq!(kill_target("KILL QUERY ID 5"), None);
        assert_eq!(kill_target("SELECT 1"), None);
        assert_eq!(kill_target("KILL QUERY x"), None);
    }

    #[test]
    fn found_rows_needs_are_seen_in_any_case() {
        assert!(contains_ignore_case(
            "SELECT SQL_CALC_FOUND_ROWS * FROM t",
            "sql_calc_found_rows"
        ));
        assert!(!contains_ignore_case("SELECT 1", "sql_calc_found_rows"));
    }
}
