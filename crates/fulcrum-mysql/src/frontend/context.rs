//! Everything the MySQL sessions of one cluster share: the
//! protocol-neutral `fulcrum_cluster::ClusterCore` (config, router, health,
//! classifier in the MySQL dialect, pools keyed by (backend, user, wire
//! format, character set), positions as GTID lists, ...), which it
//! dereferences to, and what is MySQL's own: the users' passwords and
//! server logins, the caching_sha2 fast-path cache, and the connection ids
//! handed to clients.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use fulcrum_cluster::function_catalog::{quote_literal, FunctionKind, Functions, Wanted};
use fulcrum_cluster::{ClusterCore, PoolScope, ProtocolContext};
use fulcrum_config::Cluster;
use fulcrum_pool::{BackendId, Pool};
use fulcrum_sql::{Decision, Dialect};
use mysql_common::constants::CapabilityFlags as C;

use crate::backend::health::MariaServerOps;
use crate::backend::{connect, ConnectError, ServerConn, ServerTarget};

/// Which server connections can serve a client besides its backend and
/// user: the same result-set format, the same character set (a MySQL
/// connection serves any schema).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientFormat {
    /// The client's capability flags that shape results.
    pub wire_format: u32,
    pub charset: u8,
}

impl PoolScope for ClientFormat {
    fn database(&self) -> Option<&Arc<str>> {
        None
    }
}

/// A caching_sha2 fast-path entry: (the stored native hash it was made
/// under, SHA256(SHA256(password))).
type Sha2Entry = ([u8; 20], [u8; 32]);

/// The core of a MariaDB cluster: server connections, positions as
/// `@@gtid_binlog_pos` values, pools per client format.
pub type MyCore = ClusterCore<ServerConn, String, ClientFormat>;

/// A logged-in client, by the connection id Fulcrum gave it. Its session
/// holds it too and tells it what it runs on with an atomic store (twice
/// per unit): no lock, no map lookup.
pub struct Running {
    pub user: Arc<str>,
    /// What it runs on now: backend << 32 | server thread id, or `NONE`.
    on: AtomicU64,
    /// The backends' addresses of the context it logged in to, by
    /// `BackendId`: a context after a reload (which shares this registry)
    /// may number them otherwise.
    backends: Arc<[String]>,
    /// Its registry entry: `KILL CONNECTION <id>` ends it through it.
    pub entry: Arc<fulcrum_cluster::clients::ClientEntry>,
}

impl Running {
    const NONE: u64 = u64::MAX;

    /// The server connection serving the client now and its thread id
    /// (`None`: none).
    pub fn on(&self) -> Option<(BackendId, u32)> {
        let v = self.on.load(Ordering::Relaxed);
        (v != Self::NONE).then_some(((v >> 32) as BackendId, v as u32))
    }

    /// The address of the server serving the client now, and its thread
    /// id (`None`: none): the same in every context, before and after a
    /// reload.
    pub fn on_address(&self) -> Option<(&str, u32)> {
        let (backend, thread) = self.on()?;
        Some((self.backends.get(backend)?.as_str(), thread))
    }

    /// Records which server connection serves the client now.
    pub fn set(&self, on: Option<(BackendId, u32)>) {
        let v = on.map_or(Self::NONE, |(b, t)| ((b as u64) << 32) | u64::from(t));
        self.on.store(v, Ordering::Relaxed);
    }
}

/// The first connection id Fulcrum gives: above the thread ids a server
/// gives for a long time, so a process list's rows of threads serving no
/// client (idle pooled connections, other tools) never show a client's id.
pub const FIRST_CONNECTION_ID: u32 = 1 << 30;

/// The environment variable a binary upgrade starts the new process with:
/// the first connection id it gives ([`successor_connection_ids`]), so its
/// new clients never take the id of a client the old process hands over.
pub const CONNECTION_IDS_ENV: &str = "FULCRUM_MYSQL_CONNECTION_IDS_FROM";

/// Ids the old process may still give between starting its successor and
/// the successor's `READY` (it accepts until then): the successor starts
/// this far past the old process's counter.
pub const SUCCESSOR_RESERVE: u32 = 1 << 20;

/// The process's connection-id counter: from [`FIRST_CONNECTION_ID`], or
/// where the process it replaces said ([`CONNECTION_IDS_ENV`]).
fn connection_ids() -> &'static AtomicU32 {
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    NEXT.get_or_init(|| {
        let from = std::env::var(CONNECTION_IDS_ENV)
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            .filter(|&n| n >= FIRST_CONNECTION_ID);
        AtomicU32::new(from.unwrap_or(FIRST_CONNECTION_ID))
    })
}

/// The first connection id the process replacing this one gives
/// ([`CONNECTION_IDS_ENV`]): past every id this one gave or may give
/// before it serves.
pub fn successor_connection_ids() -> u32 {
    let next = connection_ids()
        .load(Ordering::Relaxed)
        .wrapping_add(SUCCESSOR_RESERVE);
    next.max(FIRST_CONNECTION_ID)
}

pub struct MyClusterContext {
    core: MyCore,
    pub passwords: HashMap<String, String>,
    /// The login each user has on the servers (`server_user`, `server_password`).
    pub server_logins: HashMap<String, (String, String)>,
    /// `auth_query` users: their stored hashes and what their clients proved.
    pub auth: super::auth_query::AuthCache,
    /// `auth_query` users' caching_sha2 fast-path entries
    /// (SHA256(SHA256(password))), filled by a full authentication.
    /// Keyed with the stored hash it was made under: a changed password
    /// (another stored hash) does not use it.
    sha2_cache: Mutex<HashMap<String, Sha2Entry>>,
    /// Client connection id -> the client and the server connection
    /// serving it now, for `KILL <id>` and the ids of a process list. One
    /// map for a cluster's contexts before and after a reload (`after`).
    running: Arc<Mutex<HashMap<u32, Arc<Running>>>>,
    /// The backends' addresses, by `BackendId` (for `Running`).
    backend_addresses: Arc<[String]>,
}

impl std::ops::Deref for MyClusterContext {
    type Target = MyCore;
    fn deref(&self) -> &MyCore {
        &self.core
    }
}

impl MyClusterContext {
    /// A context whose metrics go nowhere (tests, tools).
    pub fn new(config: Cluster) -> Arc<MyClusterContext> {
        Self::with_metrics(config, Arc::new(fulcrum_metrics::Metrics::new()), None)
    }

    pub fn with_metrics(
        config: Cluster,
        metrics: Arc<fulcrum_metrics::Metrics>,
        slow_query_threshold: Option<std::time::Duration>,
    ) -> Arc<MyClusterContext> {
        Self::after(config, metrics, slow_query_threshold, None)
    }

    /// `with_metrics`, for the context that replaces `earlier` (a reload,
    /// an upgrade's observing loops): the clients logged in before stay
    /// known (`KILL <id>` from a client of the new context reaches them,
    /// the process list shows their ids).
    pub fn after(
        config: Cluster,
        metrics: Arc<fulcrum_metrics::Metrics>,
        slow_query_threshold: Option<std::time::Duration>,
        earlier: Option<&MyClusterContext>,
    ) -> Arc<MyClusterContext> {
        let running = earlier.map_or_else(Default::default, |e| e.running.clone());
        let backend_addresses = config.backends.iter().map(|b| b.address.clone()).collect();
        Arc::new(MyClusterContext {
            passwords: config
                .users
                .iter()
                .map(|u| (u.name.clone(), u.password.clone()))
                .collect(),
            server_logins: config
                .users
                .iter()
                .map(|u| {
                    let login = (u.server_user().to_owned(), u.server_password().to_owned());
                    (u.name.clone(), login)
                })
                .collect(),
            auth: super::auth_query::AuthCache::new(fulcrum_cluster::AuthLimits::of(&config)),
            sha2_cache: Mutex::new(HashMap::new()),
            running,
            backend_addresses,
            core: ClusterCore::new(config, metrics, slow_query_threshold, Dialect::MySql),
        })
    }

    /// A connection id for a new client (what `CONNECTION_ID()`-aware tools
    /// and `KILL QUERY` see): one counter for the process, so clients of
    /// clusters sharing a port, or of a context before and after a reload,
    /// never share one (KILL QUERY names a client by it).
    pub fn connection_id(&self) -> u32 {
        let next = connection_ids();
        let id = next.fetch_add(1, Ordering::Relaxed);
        if id == 0 {
            // After four billion logins: 0 means "none" to some clients.
            return next.fetch_add(1, Ordering::Relaxed);
        }
        id
    }

    /// A client handed over by a binary upgrade keeps the id it was given
    /// by the old process: false when a client of this context has it
    /// already (more logins than [`SUCCESSOR_RESERVE`] on the old process
    /// while this one started). Ids given from now on are past it.
    pub fn claim_connection_id(&self, id: u32) -> bool {
        connection_ids().fetch_max(id.wrapping_add(1).max(1), Ordering::Relaxed);
        id != 0
            && !self
                .running
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(&id)
    }

    /// Client `id` is logged in as `user` (again after COM_CHANGE_USER),
    /// with no server connection: its entry, for its session to keep.
    pub fn register_client(
        &self,
        id: u32,
        user: Arc<str>,
        entry: Arc<fulcrum_cluster::clients::ClientEntry>,
    ) -> Arc<Running> {
        let running = Arc::new(Running {
            user,
            on: AtomicU64::new(Running::NONE),
            backends: self.backend_addresses.clone(),
            entry,
        });
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, running.clone());
        running
    }

    /// Server thread id -> the connection id of the client it serves now,
    /// on `backend` (a process list's ids, translated).
    pub fn thread_owners(&self, backend: BackendId) -> HashMap<u32, u32> {
        let Some(address) = self.backend_addresses.get(backend) else {
            return HashMap::new();
        };
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|(&id, r)| match r.on_address() {
                Some((a, thread)) if a == address.as_str() => Some((thread, id)),
                _ => None,
            })
            .collect()
    }

    /// This context's number for the backend at `address`, if it has one.
    pub fn backend_at(&self, address: &str) -> Option<BackendId> {
        self.backend_addresses.iter().position(|a| a == address)
    }

    /// The client is gone.
    pub fn forget_client(&self, id: u32) {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    /// What client `id` runs on: `None` for an unknown id, `Some(None)` for a
    /// client with no server connection now.
    pub fn running_on(&self, id: u32) -> Option<Arc<Running>> {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }

    pub fn classify(&self, sql: &str) -> Decision {
        self.classifier.classify(sql)
    }

    /// The decision for `sql` of a client (`user`, its wire format and
    /// character set, its schema): a read calling functions no list decides
    /// goes to the primary unless the function catalog knows them all to be
    /// reads (`function_catalog`).
    pub fn classify_for(
        &self,
        sql: &str,
        user: &Arc<str>,
        options: (u32, u8),
        schema: &str,
    ) -> Decision {
        self.classify_unit_for(sql, user, options, schema).0
    }

    /// `classify_for`, with the classification itself (its effects,
    /// may-commit, fingerprint and whether the text has comments), shared
    /// with the classifier's cache: a hit is a reference count, not a copy.
    pub fn classify_unit_for(
        &self,
        sql: &str,
        user: &Arc<str>,
        options: (u32, u8),
        schema: &str,
    ) -> (Decision, Arc<fulcrum_sql::Classified>) {
        let unit = self.classifier.classify_shared(sql);
        (self.decide_with_catalog(&unit, user, options, schema), unit)
    }

    /// The pool for a client of `user` with `wire_format` and `charset`.
    pub fn pool(
        &self,
        backend: BackendId,
        user: &Arc<str>,
        wire_format: C,
        charset: u8,
    ) -> Pool<ServerConn> {
        let format = ClientFormat {
            wire_format: wire_format.bits(),
            charset,
        };
        self.core.pool(backend, user, &format)
    }

    /// An `auth_query` user's caching_sha2 fast-path entry, if a full
    /// authentication filled it.
    pub fn sha2_cache(&self, user: &str, stored: &[u8; 20]) -> Option<[u8; 32]> {
        self.sha2_cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(user)
            .filter(|(s, _)| s == stored)
            .map(|(_, h)| *h)
    }

    pub fn set_sha2_cache(&self, user: &str, stored: [u8; 20], hash: [u8; 32]) {
        let mut cache = self.sha2_cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= 10_000 {
            cache.clear();
        }
        cache.insert(user.to_owned(), (stored, hash));
    }

    /// Opens a new server connection for a pool.
    pub async fn open(
        &self,
        backend: BackendId,
        user: &str,
        wire_format: C,
        charset: u8,
    ) -> Result<ServerConn, ConnectError> {
        let target = ServerTarget {
            address: self.address(backend).to_owned(),
            user: self
                .server_logins
                .get(user)
                .map_or_else(|| user.to_owned(), |l| l.0.clone()),
            password: self
                .server_logins
                .get(user)
                .map(|l| l.1.clone())
                .unwrap_or_default(),
            // An auth_query user: what its client proved.
            native_stage1: if self.server_logins.contains_key(user) {
                None
            } else {
                self.auth.proof(user)
            },
            wire_format,
            charset,
            local_infile: self.config.allow_local_infile,
            track_gtid: self.config.consistency != fulcrum_config::Consistency::Eventual,
            tls: self
                .config
                .backends
                .get(backend)
                .and_then(|b| crate::backend::connect::ServerTls::from_config(&b.tls)),
        };
        // Boxed: a login's state (handshake, authentication, TLS) is large
        // and rarely alive, and every future awaiting a pool checkout would
        // otherwise carry its size, idle clients' sessions included.
        let timeout = self.config.connect_timeout;
        let mut conn = Box::pin(connect(&target, timeout)).await?;
        if let Some(sql) = self.config.connect_query(None, user) {
            Box::pin(conn.run_connect_query(sql, timeout)).await?;
        }
        Ok(conn)
    }
}

impl ProtocolContext for MyClusterContext {
    type Conn = ServerConn;
    type Position = String;
    type Scope = ClientFormat;
    type Ops = MariaServerOps;
    type OpenError = ConnectError;

    fn core(&self) -> &MyCore {
        &self.core
    }

    fn server_ops(&self) -> MariaServerOps {
        MariaServerOps::new(&self.config)
    }

    async fn open_pooled(
        &self,
        backend: BackendId,
        user: &Arc<str>,
        format: &ClientFormat,
    ) -> Result<ServerConn, ConnectError> {
        let wire_format = C::from_bits_truncate(format.wire_format);
        self.open(backend, user, wire_format, format.charset).await
    }

    /// The stored functions of a schema (`information_schema.ROUTINES`):
    /// MODIFIES SQL DATA, or CONTAINS SQL and not deterministic (MariaDB's
    /// default, which it does not enforce), is a write; NO SQL, READS SQL
    /// DATA or deterministic a read.
    ///
    /// Read as the health user, so one user's privileges (ROUTINES lists
    /// only the routines a user may see) do not decide every user's
    /// routing; as the client that asked when the health user cannot log in.
    /// The database's tables, for the result cache (`relations.rs`).
    async fn read_relations(
        &self,
        w: &Wanted,
    ) -> Option<fulcrum_cluster::relation_catalog::Relations> {
        self.relations_of(w).await
    }

    fn start_change_streams(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        crate::change_stream::start(self)
    }

    async fn read_functions(&self, w: &Wanted) -> Option<Functions> {
        let primary = self.router.primary()?;
        let sql = format!(
            "SELECT GROUP_CONCAT(CONCAT(LOWER(ROUTINE_NAME), '=', \
             (SQL_DATA_ACCESS = 'MODIFIES SQL DATA' OR \
             (SQL_DATA_ACCESS = 'CONTAINS SQL' AND IS_DETERMINISTIC = 'NO'))) SEPARATOR ',') \
             FROM information_schema.ROUTINES WHERE ROUTINE_TYPE = 'FUNCTION' AND ROUTINE_SCHEMA = {}",
            quote_literal(&w.database)
        );
        let list = match self.read_routines_as_health_user(primary, &sql).await {
            Some(list) => list,
            None if w.user.is_empty() => return None,
            None => {
                let (format, charset) = w.options;
                let mut conn = self
                    .open(primary, &w.user, C::from_bits_truncate(format), charset)
                    .await
                    .ok()?;
                conn.run_simple(
                    crate::codec::command::Command::Query,
                    LONG_GROUP_CONCAT.as_bytes(),
                )
                .await
                .ok()?;
                conn.query_value(&sql).await.ok()?.unwrap_or_default()
            }
        };
        let mut functions = Functions::new();
        for entry in list.split(',').filter(|e| !e.is_empty()) {
            if let Some((name, writes)) = entry.rsplit_once('=') {
                let kind = if writes == "1" {
                    FunctionKind::Write
                } else {
                    FunctionKind::Read
                };
                functions.insert(name.into(), kind);
            }
        }
        Some(functions)
    }
}

/// The function catalog's list is one GROUP_CONCAT value, which MariaDB
/// cuts at 1 kB by default: its connection (of its own, closed after) says
/// this first.
const LONG_GROUP_CONCAT: &str = "SET SESSION group_concat_max_len = 16777216";

impl MyClusterContext {
    /// `sql` (the ROUTINES list, one value) run on `backend` as the health
    /// user; `None` when it cannot log in or the query fails.
    async fn read_routines_as_health_user(&self, backend: BackendId, sql: &str) -> Option<String> {
        use mysql_async::prelude::Queryable;
        let b = self.config.backends.get(backend)?;
        let health = &self.config.health;
        let connect =
            crate::backend::health::connect(&b.address, &b.tls, &health.user, &health.password, "");
        let mut conn = tokio::time::timeout(self.config.connect_timeout, connect)
            .await
            .ok()?
            .map_err(
                |e| tracing::debug!(error = %e, "function catalog: the health user cannot log in"),
            )
            .ok()?;
        // GROUP_CONCAT of no rows is NULL.
        let list: Option<Option<Option<String>>> = async {
            conn.query_drop(LONG_GROUP_CONCAT).await.ok()?;
            conn.query_first(sql).await.ok()
        }
        .await;
        let _ = conn.disconnect().await;
        Some(list?.flatten().unwrap_or_default())
    }
}

impl fulcrum_metrics::Source for MyClusterContext {
    fn refresh(&self, metrics: &fulcrum_metrics::Metrics) {
        self.refresh_metrics(metrics);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> Arc<MyClusterContext> {
        let toml = "[[cluster]]\nname = \"shop\"\nprotocol = \"mysql\"\n\
                    listen = \"127.0.0.1:0\"\n\
                    backend = [{ address = \"127.0.0.1:1\", role = \"primary\" }]\n\
                    user = [{ name = \"app\", password = \"x\" }]\n";
        let config = fulcrum_config::parse(toml, std::path::Path::new("t.toml")).unwrap();
        MyClusterContext::new(config.clusters[0].clone())
    }

    /// A handed-over client keeps its id unless a client here has it,
    /// and ids given after it are past it; a successor starts past every
    /// id given here.
    #[test]
    fn a_handed_over_id_is_kept_when_free_and_never_given_again() {
        let ctx = context();
        let entry = fulcrum_cluster::clients::registry().register(
            "shop",
            "app".into(),
            "".into(),
            fulcrum_net::ClientPeer::Tcp("127.0.0.1:1".parse().unwrap()),
        );
        let mine = ctx.connection_id();
        ctx.register_client(mine, "app".into(), entry.clone_entry());
        assert!(!ctx.claim_connection_id(mine), "taken here");
        assert!(!ctx.claim_connection_id(0), "0 is no id");
        let carried = mine + 1000;
        assert!(ctx.claim_connection_id(carried));
        assert!(ctx.connection_id() > carried, "past the carried id");
        assert!(successor_connection_ids() >= carried + SUCCESSOR_RESERVE);
        ctx.forget_client(mine);
        assert!(ctx.claim_connection_id(mine), "free again");
    }
}
