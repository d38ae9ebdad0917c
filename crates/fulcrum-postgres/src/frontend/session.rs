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
use fulcrum_cluster::clients::Interrupt;
use fulcrum_config::PoolMode;
use fulcrum_net::Connection;
use fulcrum_pool::{BackendId, Checkout, Pool, PoolError, Route};
use fulcrum_session::txn::{self, Deferral};
use fulcrum_session::{
    decide, Engine, Event, Facts, Owed, Phase, Routing, Status, Txn as RouteTxn,
};
use fulcrum_sql::statements::{first_word, is_single_statement};
use fulcrum_sql::{Classified, Decision, Effect, Effects};
use fulcrum_tls::ClientStream;

mod actions;
mod attach;
mod cache;
mod checkout;
mod cleanup;
mod client;
mod client_frame;
mod extended;
mod failure;
mod forward;
mod handover;
mod idle;
mod io;
mod local;
mod look;
mod lost;
mod notify;
mod query_timeout;
mod rare_map;
mod reads;
mod replay;
mod resolve;
mod server;
mod signal;
mod statement_mode;
mod text;
mod token;
mod txn_log;

use actions::{Carried, NotAtOnce};
pub(crate) use handover::HandedOver;
use idle::IdleKind;
use io::{poll_io, Io};
use rare_map::RareMap;

use super::cancel::CancelSlot;
use super::context::ClusterContext;
use super::error::SessionError;
use super::expect::{Expect, Expectations, Step};
use super::login::{fatal, Login};
use super::statements::ClientStatement;
use super::unit_route::unit_decision;
use crate::backend::conn::{SessionParams, Settings};
use crate::backend::internal::InternalError;
use crate::backend::{ConnectError, ServerConn};
use crate::codec::backend_msg::{
    self, command_tag, parse_error_fields, parse_parameter_status, sqlstate,
};
use crate::codec::frame::check_frame;
use crate::codec::frontend_msg::{
    bind_msg, parse_msg, put_bind, put_execute, put_query, put_sync, put_target, query_text,
    target_msg,
};
use cleanup::{reset_clears_session, run_reset, sync_params};
use text::*;

/// Server frames of these types larger than this are streamed through, not buffered whole.
const STREAM_THRESHOLD: usize = 64 * 1024;
/// Bytes waiting for one side above which the other side is not read.
const FORWARD_WINDOW: usize = 256 * 1024;
/// How long cleaning a server connection for reuse may take before it is closed instead.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Session {
    ctx: Arc<ClusterContext>,
    /// Who the client is: its login, cancel key and `SHOW CLIENTS` row.
    id: ClientId,
    /// The client's socket, what it sent and not yet handled (`read_buf`)
    /// and the answers queued for it (`write_buf`).
    client: Connection<ClientStream>,
    to_server: BytesMut,
    /// Session parameters: at startup, as the client has set them, and
    /// those set in the open transaction.
    params: Params,
    /// The client's prepared statements and portals, as Fulcrum maps them.
    stmts: Statements,
    server: Option<Checkout<ServerConn>>,
    backend: BackendId,
    pool: Option<(BackendId, Pool<ServerConn>)>,
    /// What the attached server still owes the client.
    owed: Owing,
    /// `query_timeout`: since when the server has owed an answer.
    timer: QueryTimer,
    /// The client's state between units (idle, deferred transaction, busy,
    /// in a transaction, pinned, lost, replaying) and the unit in flight:
    /// `fulcrum_session::Engine`.
    engine: Engine,
    /// The classifier's decision for the Query being routed, reused when it is handled.
    query_unit: Option<Arc<Classified>>,
    /// The result cache's classification of the unnamed statement's Parse
    /// at the front, reused by routing and by the Parse's handling.
    parse_unit: Option<Arc<Classified>>,
    /// How Fulcrum answers the transaction (or batch) lost with its server
    /// while the engine is `Lost` (whether there is one is the engine's
    /// phase, `Engine::is_lost`: this is written whenever it enters it).
    /// Why Fulcrum gave the connection up is the engine's
    /// (`Engine::take_lost_because`).
    lost: lost::Lost,
    /// Read consistency: the session's mode, the unit's hint, the position
    /// its reads must not be older than.
    reads: fulcrum_session::Reads<reads::Lsn>,
    /// DDL ran in the open transaction (the schema generation moves again
    /// when it ends).
    ddl_in_txn: bool,
    /// This client's pool mode: its user's (`[[cluster.user]]`
    /// `pool_mode`), else the cluster's.
    pool_mode: PoolMode,
    /// `transaction_replay`: a replay under way.
    txn: TxnReplay,
    /// LISTEN answered by Fulcrum (transaction pooling): the client's
    /// subscription and the notifications queued for it. Boxed: most
    /// clients never listen.
    listen: Option<Box<notify::ClientListen>>,
    /// `[[cluster.mirror]]`: this client's units on their way to the
    /// mirror targets (`None`: not mirrored, the usual case).
    mirror: Option<Box<crate::mirror::ClientMirror>>,
    /// `[cluster.cache]`: the answer of a read that missed, being kept.
    cache_fill: Option<Box<cache::Capture>>,
    /// `[cluster.cache]`: what the client's writes in flight (or in its
    /// open transaction) may have changed.
    cache_written: Option<Box<cache::Written>>,
}

/// Who the client is.
struct ClientId {
    user: Arc<str>,
    /// Whose pools serve it: `user`, or the server login its database
    /// forces (`[[cluster.database]]` `server_user`), shared by all.
    pool_user: Arc<str>,
    database: Arc<str>,
    cancel: Arc<CancelSlot>,
    /// Session pooling: the client is known by its server's cancel key.
    server_key: Option<super::cancel::Alias>,
    /// This client's row in `SHOW CLIENTS`.
    entry: fulcrum_cluster::clients::ClientHandle,
}

/// The client's session parameters, replayed on each server connection.
struct Params {
    startup: SessionParams,
    /// As the client has set them.
    desired: Settings,
    /// Session ops done inside the open transaction (applied at COMMIT).
    txn_ops: Vec<Effect>,
    txn_committed: Option<bool>,
}

impl Params {
    /// The open transaction is over for the settings (rolled back, lost,
    /// or replayed from its start): what it set is forgotten.
    fn txn_forgotten(&mut self) {
        self.txn_ops.clear();
        self.txn_committed = None;
    }
}

/// The client's extended-protocol statements and portals.
struct Statements {
    map: HashMap<Vec<u8>, Arc<ClientStatement>>,
    /// At least the bytes `map` holds (names and Parse frames): added to at
    /// each Parse, recounted only when it reaches `max_client_prepared_bytes`.
    bytes: usize,
    /// Statement names are rewritten per server connection (transaction pooling).
    rewrite: bool,
    /// Routing decision of the client's last unnamed Parse.
    unnamed_decision: Decision,
    /// Transaction pooling: the client's last unnamed Parse (empty: none),
    /// prepared again ahead of a Bind or Describe of the unnamed statement
    /// on a connection it was not sent to since the last Sync.
    unnamed: Vec<u8>,
    /// It was sent on the attached connection since the last Sync.
    unnamed_sent: bool,
    /// What it may change, for the result cache (`cache_bind_writes`).
    unnamed_writes: fulcrum_sql::Writes,
    /// Session-state statements prepared through the extended protocol
    /// (statement name -> ops) and the portals bound to them, so a SET sent
    /// with Parse/Bind/Execute is replayed like one sent as a simple query.
    /// These maps and the three below are made on their first insert: most
    /// clients never fill them, and each would be 48 bytes of every idle
    /// client's task.
    ops: RareMap<Vec<u8>, Vec<Effect>>,
    portal_ops: RareMap<Vec<u8>, Vec<Effect>>,
    /// Statements that are `pg_terminate_backend($1)` (true) or
    /// `pg_cancel_backend($1)` (false), by client name (`signal.rs`).
    signals: RareMap<Vec<u8>, bool>,
    /// Digest statistics: the digest of each prepared statement (by client
    /// name) and of each portal bound from one.
    digests: RareMap<Vec<u8>, Arc<fulcrum_metrics::Digest>>,
    portal_digests: RareMap<Vec<u8>, Arc<fulcrum_metrics::Digest>>,
    /// The digest of the last statement looked up: the next of the same
    /// fingerprint skips the digest table's lock.
    last_digest: fulcrum_metrics::DigestMemo,
}

/// What the attached server still owes, in PostgreSQL's terms.
#[derive(Default)]
struct Owing {
    /// The answers expected, in order.
    expect: Expectations,
    /// Sync/Query/FunctionCall sent and not yet answered with ReadyForQuery.
    ready: usize,
    /// Extended-protocol messages sent since the last Sync.
    unsynced: bool,
    /// Bytes of a large server frame still to pass through unread.
    stream_left: usize,
}

/// `query_timeout`: since when the server has owed an answer, and whether
/// the cancel for it went out.
#[derive(Default)]
struct QueryTimer {
    busy_since: Option<tokio::time::Instant>,
    cancelled: bool,
}

/// `transaction_replay`: a replay of the open transaction under way on a
/// new server connection (its log is the engine's).
struct TxnReplay {
    /// Boxed: rare, and every client's session would carry its size.
    run: Option<Box<replay::Run>>,
    /// The unit being queued may write: the transaction's id is asked
    /// behind it (`resolve.rs`).
    unit_writes: bool,
    /// Fulcrum's own statement asking it, once the client has asked.
    commit_id_statement: Option<Arc<ClientStatement>>,
}

impl Session {
    pub fn new(
        ctx: Arc<ClusterContext>,
        client: Connection<ClientStream>,
        login: Login,
        cancel: Arc<CancelSlot>,
        client_entry: fulcrum_cluster::clients::ClientHandle,
    ) -> Session {
        // Statement pooling is transaction pooling that also refuses
        // transaction blocks (`statement_mode.rs`).
        let pool_mode = ctx.config.pool_mode_of(&login.user);
        let transaction_mode = pool_mode != PoolMode::Session;
        let mirror = crate::mirror::ClientMirror::for_client(
            &ctx,
            &login.user,
            &login.database,
            &login.startup,
        );
        let ctx_consistency = ctx.config.consistency;
        let txn_log = fulcrum_session::TxnLog::new(
            ctx.config.transaction_replay.map(|r| r.max_size),
            fulcrum_session::Framing::Postgres,
        )
        .with_debug(ctx.config.transaction_replay.is_some_and(|r| r.debug));
        Session {
            backend: ctx.router.primary().unwrap_or(0),
            ctx,
            id: ClientId {
                pool_user: login.pool_user,
                user: login.user,
                database: login.database,
                cancel,
                server_key: None,
                entry: client_entry,
            },
            client,
            to_server: BytesMut::new(),
            params: Params {
                desired: Settings::new(login.startup.clone()),
                startup: login.startup,
                txn_ops: Vec::new(),
                txn_committed: None,
            },
            stmts: Statements {
                map: HashMap::new(),
                bytes: 0,
                rewrite: transaction_mode,
                unnamed_decision: Decision::Write,
                unnamed: Vec::new(),
                unnamed_sent: false,
                unnamed_writes: fulcrum_sql::Writes::Everything,
                ops: RareMap::default(),
                portal_ops: RareMap::default(),
                signals: RareMap::default(),
                digests: RareMap::default(),
                portal_digests: RareMap::default(),
                last_digest: Default::default(),
            },
            server: None,
            pool: None,
            owed: Owing::default(),
            timer: QueryTimer::default(),
            engine: Engine::new(if transaction_mode {
                None
            } else {
                Some("session pool mode")
            })
            .with_txn_log(txn_log),
            query_unit: None,
            parse_unit: None,
            lost: lost::Lost::default(),
            reads: fulcrum_session::Reads::new(ctx_consistency),
            ddl_in_txn: false,
            pool_mode,
            txn: TxnReplay {
                run: None,
                unit_writes: false,
                commit_id_statement: None,
            },
            listen: None,
            mirror,
            cache_fill: None,
            cache_written: None,
        }
    }

    /// Finishes login (first server contact validates the database and the
    /// startup parameters), then forwards until the client leaves.
    /// (By reference: an `async fn` taking `self` by value would keep the
    /// session twice in its state, a copy per idle client.)
    ///
    /// The start and the cleanup run once a session, boxed: their states
    /// (a first attach, a rollback or reset with its timeout) would
    /// otherwise be carried by every client's task while it idles in
    /// `forward` (issue 44, memory per idle client).
    pub async fn run(&mut self) -> Result<(), SessionError> {
        let result = Box::pin(self.start()).await;
        let result = match result {
            Ok(()) => self.forward().await,
            Err(e) => Err(e),
        };
        Box::pin(self.cleanup()).await;
        match result {
            Err(SessionError::ClientGone) => Ok(()),
            r => r,
        }
    }

    async fn start(&mut self) -> Result<(), SessionError> {
        let backend = self.ctx.router.primary().unwrap_or(self.backend);
        let cached = if self.engine.pinned().is_none() {
            self.ctx.cached_welcome(
                backend,
                &self.id.pool_user,
                &self.id.database,
                &self.params.startup,
            )
        } else {
            None
        };
        let reported = match cached {
            Some(r) => r,
            None => {
                // First client with these parameters: a server validates the
                // database and the startup parameters, and tells their values:
                // the primary, or while there is none (a failover, a
                // coordinator cut off) a replica, so that reads go on.
                let route = if self.ctx.router.primary().is_some() {
                    Route::Primary
                } else {
                    Route::Replica
                };
                self.attach(route).await?;
                let server = self.server.as_ref().expect("attached");
                self.ctx.cache_welcome(
                    self.backend,
                    &self.id.pool_user,
                    &self.id.database,
                    &self.params.startup,
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
        // Session pooling: the server connection is the client's for the
        // whole session, so it gets that server's pid and key (what
        // pg_stat_activity, pg_terminate_backend and notifications show);
        // a cancel with them still comes through Fulcrum.
        let mut key = (self.id.cancel.process_id, self.id.cancel.secret_key);
        if self.pool_mode == PoolMode::Session {
            if let Some(server) = &self.server {
                let server_key = server.cancel.clone();
                self.id.server_key = self.ctx.cancels.alias(&server_key, &self.id.cancel);
                if self.id.server_key.is_some() {
                    key = (server_key.process_id, server_key.secret_key);
                }
            }
        }
        backend_msg::backend_key_data(&mut out, key.0, key.1);
        backend_msg::ready_for_query(&mut out, b'I');
        self.client.send(&out).await?;
        if self.engine.pinned().is_none() {
            // The login's probe connection goes back (transaction pooling).
            self.detach();
        }
        Ok(())
    }

    /// A client a binary upgrade's old process handed over: its session
    /// taken up from `carried` (no login, no welcome: the client is past
    /// them), then forwarded until the client leaves.
    pub(crate) async fn run_resumed(&mut self, carried: HandedOver) -> Result<(), SessionError> {
        Box::pin(self.resume_from(carried)).await;
        let result = self.forward().await;
        Box::pin(self.cleanup()).await;
        match result {
            Err(SessionError::ClientGone) => Ok(()),
            r => r,
        }
    }

    /// The attached server is gone: answer in its place and take up what
    /// the client sent meanwhile.
    async fn after_server_lost(&mut self) -> Result<(), SessionError> {
        self.server_lost().await?;
        if self.server.is_none() {
            self.flush_client().await?;
        }
        if !self.client.read_buf.is_empty() {
            self.on_client_input().await?;
        }
        Ok(())
    }

    /// The client is told transaction status `byte` (ReadyForQuery's).
    pub(super) fn set_status(&mut self, byte: u8) {
        self.engine.told(match byte {
            b'I' => Status::Idle,
            b'E' => Status::Failed,
            _ => Status::InTransaction,
        });
    }

    /// Writes what is queued for the client, then ends the session with a
    /// FATAL error. Boxed: it ends a session, and its writes' state would
    /// otherwise be part of every client's task wherever it is awaited.
    pub(super) async fn fatal_client(&mut self, code: &str, msg: &str) -> SessionError {
        Box::pin(self.write_fatal(code, msg)).await
    }

    async fn write_fatal(&mut self, code: &str, msg: &str) -> SessionError {
        let _ = self.client.flush().await;
        fatal(self.client.stream_mut(), code, msg).await
    }
}

/// A transaction status as ReadyForQuery writes it.
pub(super) fn status_byte(status: Status) -> u8 {
    match status {
        Status::Idle => b'I',
        Status::InTransaction => b'T',
        Status::Failed => b'E',
    }
}
