//! One MySQL client's session after login: read a command, pick a server
//! (transaction pooling: a server connection only while the client is in a
//! transaction, pinned, or right after an insert whose id it may ask for),
//! forward the command's packets unchanged, and forward the answer's packets
//! unchanged up to its end (`reply.rs`), which says whether the client is
//! now in a transaction (server status flags, never guessed from text).
//!
//! An adapter of `fulcrum_session`: `route_unit` asks `decide` where a
//! command goes, and the `Engine` holds the client's phase (idle, busy, in a
//! transaction, pinned): the adapter reports each attach and each answer's
//! status, and detaches, retries or ends the session as the engine says.
//!
//! Session state, the same principle as for PostgreSQL: `SET` statements are
//! replayed on every server connection the client uses (COM_RESET_CONNECTION
//! and the client's statements when the connection's differ); the default
//! schema (COM_INIT_DB, `USE`) is set where it differs; state that cannot be
//! replayed (user variables, temporary tables, GET_LOCK, LOCK TABLES,
//! prepared statements, ...) pins the client to its connection.

mod actions;
mod attach;
mod cache;
mod checkout;
mod commands;
mod failure;
mod forward;
mod handover;
mod identity;
mod idle;
mod options;
mod prepared;
mod query;
mod reads;
mod replay;
mod route;
mod token;
mod txn_log;

use actions::Carried;
pub(crate) use handover::HandedOver;
use identity::{kill_target, process_kill_target};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use fulcrum_cluster::clients::Interrupt;
use fulcrum_net::Connection;
use fulcrum_pool::{BackendId, Checkout, PoolError, Route};
use fulcrum_session::{Engine, Event, Loss, Owed, Routing, Status, Target};
use fulcrum_sql::Decision;

use fulcrum_tls::ClientStream;
use mysql_common::constants::{CapabilityFlags as C, StatusFlags};

use super::context::MyClusterContext;
use super::error::SessionError;
use super::login::Login;
use super::reply::{Reply, Shape};
use super::wire::{poll_client_message, put_err, put_error, put_ok, refuse_message};
use crate::backend::conn::InternalError;
use crate::backend::ServerConn;
use crate::codec::capabilities::WIRE_FORMAT;
use crate::codec::command::{command, init_db_schema, query_text, Command};
use crate::codec::err::codes;
use crate::codec::packet::{scan_message, write_packet, HEADER_LEN, MAX_PAYLOAD};

/// Answer bytes buffered before they are written to the client.
const FLUSH_AT: usize = 64 * 1024;
/// Most replayed SET statements kept; past that the client is pinned.
const MAX_SETS: usize = 64;

pub struct Session {
    ctx: Arc<MyClusterContext>,
    /// The client's socket, the command being read (`read_buf`) and the
    /// answers queued for it (`write_buf`).
    client: Connection<ClientStream>,
    user: Arc<str>,
    /// What the handshake settled: capabilities, character set, scramble,
    /// the id the client was given.
    hello: Handshake,
    schema: Option<String>,
    /// The client's SET statements, replayed in order.
    desired: Vec<String>,
    /// The client's own `SET wait_timeout`: it is closed as the server
    /// would close it, after that long idle.
    wait_timeout: Option<Duration>,
    server: Option<Checkout<ServerConn>>,
    backend: BackendId,
    /// The client's state between commands (idle, busy, in a transaction,
    /// pinned, replaying) and the unit in flight: `fulcrum_session::Engine`.
    engine: Engine,
    /// Digest statistics: the digest of the statement about to be
    /// forwarded, and the last one looked up.
    digests: Digests,
    /// The admin console's KILL, the drain on SIGTERM and an upgrade's
    /// hand-over (the session ends, or moves, at its next transaction
    /// boundary), watched on the client's entry.
    interrupts: fulcrum_cluster::clients::Watcher,
    /// The idle timeout's timer, made the first time it is armed (a
    /// cluster that sets no idle timeout makes none) and reset in place.
    idle_timer: fulcrum_net::SessionTimer,
    /// Status flags of the last answer (in a transaction, autocommit).
    status: StatusFlags,
    /// The client's prepared statements, by the ids Fulcrum gave it.
    prepared: Prepared,
    /// Read consistency: the session's mode, the statement's hint, the
    /// GTID the client's reads must not be older than.
    reads: fulcrum_session::Reads<reads::Gtid>,
    /// The classified route of the command being forwarded.
    unit_routing: Routing,
    /// This client's row in `SHOW CLIENTS`.
    client_entry: fulcrum_cluster::clients::ClientHandle,
    /// Its entry for `KILL <id>` and the process list (set at login):
    /// what it runs on is stored there as it attaches and detaches.
    running: Option<Arc<super::context::Running>>,
    /// The pool of the backend last used, kept: no map lookup per unit
    /// (forgotten when the user or character set changes).
    pool: Option<(BackendId, fulcrum_pool::Pool<ServerConn>)>,
    /// `transaction_replay`: the open transaction's log, a replay under way.
    txn: TxnReplay,
    /// The result cache: the opt-out, a fill under way, what was written.
    cache: cache::SessionCache,
}

/// What the client's handshake settled.
struct Handshake {
    caps: C,
    /// The capabilities Fulcrum's server connections must match.
    wire_format: C,
    /// The client allows several statements in one COM_QUERY.
    multi_statements: bool,
    charset: u8,
    scramble: [u8; 20],
    /// The id this client was given (what `KILL QUERY` names).
    connection_id: u32,
}

/// The client's prepared statements.
struct Prepared {
    map: HashMap<u32, super::statements::ClientStmt, foldhash::fast::RandomState>,
    next: u32,
    last: Option<u32>,
}

/// `transaction_replay` for this client (the open transaction's log is the
/// engine's).
struct TxnReplay {
    /// A replay of it under way on a new server connection. Boxed: rare,
    /// and every client's session would carry its size.
    run: Option<Box<replay::Run>>,
    /// The sequence id of the answer to the command whose server was lost.
    lost_seq: u8,
}

/// What a command needs besides forwarding.
#[derive(Default, Clone)]
struct Effects {
    set: Option<String>,
    schema: Option<String>,
    /// Keep the server connection for the next command.
    keep_next: bool,
    /// It reads the process list: its thread ids become clients' ids.
    thread_ids: bool,
    /// It calls `CONNECTION_ID()`: the call is sent as the client's id.
    own_id: bool,
}

/// What is recorded of the session's commands besides their answers:
/// digest statistics, and the mirror.
#[derive(Default)]
struct Digests {
    /// The digest of the statement about to be forwarded.
    pending: Option<Arc<fulcrum_metrics::Digest>>,
    /// The last one looked up: the next of the same fingerprint skips the
    /// digest table's lock.
    last: fulcrum_metrics::DigestMemo,
    /// `[[cluster.mirror]]`: this client's commands on their way to the
    /// mirror targets (`None`: not mirrored, the usual case).
    mirror: Option<Box<crate::mirror::ClientMirror>>,
}

impl Session {
    pub fn new(
        ctx: Arc<MyClusterContext>,
        client: Connection<ClientStream>,
        login: Login,
        client_entry: fulcrum_cluster::clients::ClientHandle,
    ) -> Session {
        let ctx_consistency = ctx.config.consistency;
        let ctx_replay = ctx.config.transaction_replay;
        let engine = Engine::new(None)
            .with_txn_log(
                fulcrum_session::TxnLog::new(
                    ctx_replay.map(|r| r.max_size),
                    fulcrum_session::Framing::Whole,
                )
                .with_debug(ctx_replay.is_some_and(|r| r.debug)),
            )
            .with_may_write(false);
        let mirror = crate::mirror::ClientMirror::for_client(
            &ctx,
            &login.user,
            login.schema.as_deref(),
            login.caps & WIRE_FORMAT,
            login.charset,
        );
        Session {
            backend: ctx.router.primary().unwrap_or(0),
            ctx,
            client,
            user: login.user,
            hello: Handshake {
                caps: login.caps,
                wire_format: login.caps & WIRE_FORMAT,
                multi_statements: login.caps.contains(C::CLIENT_MULTI_STATEMENTS),
                charset: login.charset,
                scramble: login.scramble,
                connection_id: login.connection_id,
            },
            schema: login.schema,
            desired: Vec::new(),
            wait_timeout: None,
            server: None,
            engine,
            digests: Digests {
                mirror,
                ..Default::default()
            },
            interrupts: client_entry.watcher(),
            idle_timer: Default::default(),
            status: StatusFlags::SERVER_STATUS_AUTOCOMMIT,
            prepared: Prepared {
                map: HashMap::default(),
                next: 1,
                last: None,
            },
            reads: fulcrum_session::Reads::new(ctx_consistency),
            unit_routing: Routing {
                target: Target::Go(Route::Primary),
                pin: None,
                may_write: false,
                consistency: fulcrum_config::Consistency::Eventual,
            },
            client_entry,
            running: None,
            pool: None,
            txn: TxnReplay {
                run: None,
                lost_seq: 1,
            },
            cache: Default::default(),
        }
    }

    /// Completes the login (the schema asked for is checked on a server),
    /// then serves commands until the client quits.
    /// (By reference: an `async fn` taking `self` by value would keep the
    /// session twice in its state, a copy per idle client.)
    pub async fn run(&mut self, login_seq: u8) -> Result<(), SessionError> {
        // Boxed: the greeting's state (a schema check, the catalog's
        // wait) is freed before the commands are served, not kept in every
        // client's task beside them.
        Box::pin(self.greet(login_seq)).await?;
        self.serve_logged_in().await
    }

    /// The login's end: the schema asked for checked, its functions'
    /// catalog read (`function_catalog_wait` at most), then the OK.
    async fn greet(&mut self, login_seq: u8) -> Result<(), SessionError> {
        if let Some(schema) = self.schema.clone() {
            if let Err(e) = self.check_schema(&schema, login_seq).await {
                let _ = self.flush().await;
                return Err(e);
            }
        }
        if let Some(schema) = &self.schema {
            // Before the OK: the client's first reads find the schema's
            // functions read (function_catalog_wait at most).
            let options = (self.hello.wire_format.bits(), self.hello.charset);
            self.ctx.catalog_at_login(&self.user, options, schema).await;
        }
        put_ok(
            &mut self.client.write_buf,
            login_seq,
            self.hello.caps,
            self.status,
        );
        self.flush().await
    }

    /// A client past its login (or handed over past it): registered for
    /// `KILL` and the process list under its connection id, pinned in
    /// session pooling, then served until it leaves.
    pub(super) async fn serve_logged_in(&mut self) -> Result<(), SessionError> {
        let entry = self.client_entry.clone_entry();
        let id = self.hello.connection_id;
        self.running = Some(self.ctx.register_client(id, self.user.clone(), entry));
        if self.ctx.config.pool_mode_of(&self.user) == fulcrum_config::PoolMode::Session {
            self.pin(fulcrum_session::SESSION_POOL);
        }
        let r = self.serve().await;
        self.cleanup().await;
        match r {
            Err(SessionError::ClientGone) => Ok(()),
            r => r,
        }
    }

    async fn check_schema(&mut self, schema: &str, seq: u8) -> Result<(), SessionError> {
        let routing = self.route_unit(Decision::Primary);
        self.attach(routing, seq).await?;
        let server = self.server.as_mut().expect("attached");
        match server.use_schema(schema).await {
            Ok(()) => {
                self.maybe_detach();
                Ok(())
            }
            Err(InternalError::Server {
                payload, message, ..
            }) => {
                write_packet(&mut self.client.write_buf, seq, &payload);
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
                Err(SessionError::Replay) => Box::pin(self.replay_transaction()).await?,
                Err(e) => return Err(e),
            }
            self.log_answered();
            self.flush().await?;
        }
    }

    /// Reads and handles one command; false on COM_QUIT.
    async fn one_command(&mut self) -> Result<bool, SessionError> {
        let max = self.ctx.config.max_message_size.min(usize::MAX as u64) as usize;
        {
            let span = loop {
                // A drain or an upgrade's hand-over (`handover.rs`): one
                // load while neither is raised.
                if self.client_entry.leaving() && self.leave_now().await? {
                    return Ok(false);
                }
                let idle = self.idle_timeout();
                if let Some((limit, _)) = idle {
                    self.idle_timer.arm(tokio::time::Instant::now() + limit);
                }
                // With transaction_replay, a client idle in its transaction
                // watches its server: one that goes away (a SWITCHOVER
                // ends it, a crash) is let go at once, and the transaction
                // is replayed when the client sends its next command.
                let watch_server = self.engine.replayable_log() && self.server.is_some();
                // One future polling each source in turn, an interrupt
                // first (an atomic load): what a biased `select!` did,
                // without building its branches for every command.
                let wake = std::future::poll_fn(|cx| {
                    use std::task::Poll::Ready;
                    if let Ready(i) = self.interrupts.poll(cx) {
                        return Ready(Ok(Wake::Interrupt(i)));
                    }
                    if let Ready(m) = poll_client_message(&mut self.client, cx, max) {
                        return Ready(m.map(Wake::Message));
                    }
                    if let Some(server) = self.server.as_mut().filter(|_| watch_server) {
                        if server.io.poll_read_more(cx).is_ready() {
                            return Ready(Ok(Wake::ServerGone));
                        }
                    }
                    if idle.is_some() && self.idle_timer.poll_fired(cx) {
                        return Ready(Ok(Wake::Idle));
                    }
                    std::task::Poll::Pending
                })
                .await?;
                match wake {
                    Wake::Message(Ok(span)) => break span,
                    Wake::Message(Err(e)) => return Err(refuse_message(&mut self.client, e).await),
                    Wake::Interrupt(Interrupt::HandOver) => {
                        // The check at the top of the loop moves it, now
                        // or at its next boundary.
                        continue;
                    }
                    Wake::Interrupt(Interrupt::Drain) => {
                        // Close(Drained), now or at the next boundary: the
                        // boundary check at the top of the loop performs it.
                        let actions = self.engine.step(Event::Drain);
                        let carried = self.carry_out_now(actions);
                        debug_assert_eq!(carried, Carried::Done, "Drain answers nothing");
                        continue;
                    }
                    Wake::Interrupt(Interrupt::Killed) => {
                        let msg = "fulcrum: connection killed by an administrator (KILL)";
                        put_error(&mut self.client.write_buf, 1, codes::CONNECTION_KILLED, msg);
                        let _ = self.client.flush().await;
                        return Err(SessionError::Refused(msg.into()));
                    }
                    Wake::ServerGone => {
                        self.let_server_go();
                        continue;
                    }
                    Wake::Idle => {
                        let kind = idle.map_or("client_idle", |(_, k)| k);
                        if kind == "wait_timeout" {
                            // As the server ends it: the connection is
                            // reset, with no message (the client reports
                            // it lost, 2006 / 2013).
                            self.ctx.metrics.timeout(kind);
                            if let Some(tcp) = self.client.stream().tcp() {
                                let _ = tcp.set_zero_linger();
                            }
                            return Err(SessionError::ClientGone);
                        }
                        return Err(self.idle_too_long(kind).await);
                    }
                }
            };
            let msg = self.client.read_buf.split_to(span.total);
            self.ctx.metrics.bytes_in.inc_by(span.total as u64);
            self.client_entry.counts.received(span.total as u64);
            // A new command: the stamps made handling it share one clock read.
            self.engine.new_wake();
            self.dispatch(msg, span).await
        }
    }

    /// Handles one client message (read from the client, or sent again by
    /// a transaction replay); false on COM_QUIT.
    // A function returning its future, not an `async fn`: an `async fn`
    // keeps its arguments twice in its state (as passed and as moved in),
    // bytes every idle client's task carries (issue 44).
    #[allow(clippy::manual_async_fn)] // on purpose: the note above
    fn dispatch<'a>(
        &'a mut self,
        msg: BytesMut,
        span: crate::codec::packet::MessageSpan,
    ) -> impl std::future::Future<Output = Result<bool, SessionError>> + 'a {
        async move {
            {
                let seq = span.last_seq.wrapping_add(1);
                let first = &msg[HEADER_LEN..HEADER_LEN + span.payload_len.min(MAX_PAYLOAD)];
                let cmd = match command(first) {
                    Ok(c) => c,
                    Err(_) => {
                        put_error(
                            &mut self.client.write_buf,
                            seq,
                            codes::UNKNOWN_COM,
                            "fulcrum: empty command",
                        );
                        return Ok(true);
                    }
                };
                self.log_command(cmd, first, &msg);
                if cmd != Command::Quit {
                    self.server_gone_before(seq).await?;
                }
                // Commands a unit's steady state does not take (a schema
                // change, a prepare, a reset, a KILL, ...) have their futures
                // boxed: allocated when they run, not carried by every idle
                // client's task (issue 44, memory per idle client).
                match cmd {
                    Command::Quit => return Ok(false),
                    Command::Ping => put_ok(
                        &mut self.client.write_buf,
                        seq,
                        self.hello.caps,
                        self.status,
                    ),
                    Command::SetOption => self.set_option(first, seq),
                    Command::ResetConnection => Box::pin(self.reset_connection(seq)).await?,
                    Command::InitDb => Box::pin(self.init_db(first, &msg, seq)).await?,
                    Command::Query => self.query(first, &msg, seq).await?,
                    Command::StmtPrepare => Box::pin(self.stmt_prepare(first, seq)).await?,
                    Command::StmtExecute | Command::StmtFetch | Command::StmtBulkExecute => {
                        let payload = crate::codec::packet::payload_of(&msg, &span);
                        self.note_execute_commit(cmd, &payload);
                        let executed = self.stmt_execute(&payload, seq).await;
                        // Not answered by a server (refused, none could be
                        // had): nothing to keep.
                        self.cache_spoil();
                        executed?
                    }
                    Command::StmtReset => Box::pin(self.stmt_reset(first, seq)).await?,
                    Command::StmtClose => self.stmt_close(first),
                    Command::StmtSendLongData => {
                        let payload = crate::codec::packet::payload_of(&msg, &span);
                        Box::pin(self.stmt_long_data(&payload, seq)).await?
                    }
                    Command::FieldList => {
                        let routing = self.route_unit(Decision::Primary);
                        self.forward(&msg, seq, Shape::FieldList, routing, Effects::default())
                            .await?
                    }
                    Command::Statistics => {
                        let routing = self.route_unit(Decision::Primary);
                        self.forward(&msg, seq, Shape::OnePacket, routing, Effects::default())
                            .await?
                    }
                    Command::ChangeUser => {
                        let payload = crate::codec::packet::payload_of(&msg, &span);
                        Box::pin(self.change_user(&payload, seq)).await?
                    }
                    Command::ProcessKill => match process_kill_target(first) {
                        Some(target) => Box::pin(self.kill(target, seq)).await?,
                        None => put_error(
                            &mut self.client.write_buf,
                            seq,
                            codes::MALFORMED_PACKET,
                            "fulcrum: COM_PROCESS_KILL without an id",
                        ),
                    },
                    Command::Unknown(_) => put_error(
                        &mut self.client.write_buf,
                        seq,
                        codes::NOT_SUPPORTED_YET,
                        "fulcrum: unknown command",
                    ),
                }
                Ok(true)
            }
        }
    }
}

/// Resolves when the idle server connection is closed by the server (or
/// sends anything: nothing is owed between commands, so it is a goodbye
/// such as the ERR before a KILL).
/// What ended a wait for the client's next command.
enum Wake {
    Interrupt(Interrupt),
    Message(Result<crate::codec::packet::MessageSpan, crate::codec::packet::PacketError>),
    /// The server of a transaction the client is idle in went away.
    ServerGone,
    Idle,
}

impl Drop for Session {
    /// The client's entry for `KILL` goes with the session on every path
    /// (a refused schema at login, an error, a panic): a stale entry would
    /// point a later `KILL <id>` at a server connection another client uses.
    fn drop(&mut self) {
        self.ctx.forget_client(self.hello.connection_id);
    }
}
