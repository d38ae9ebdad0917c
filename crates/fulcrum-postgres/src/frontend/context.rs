//! Everything the PostgreSQL sessions of one cluster share: the
//! protocol-neutral `fulcrum_cluster::ClusterCore` (config, router, health,
//! pools keyed by (backend, user, database), positions as LSNs, ...), which
//! it dereferences to, and what is PostgreSQL's own: the users' SCRAM
//! verifiers (and the keys their clients proved, for users given by a
//! verifier), the statement registry, the cancel keys and the cached
//! welcome messages.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use fulcrum_cluster::function_catalog::{FunctionKind, Functions, Wanted};
use fulcrum_cluster::relation_catalog::Relations;
use fulcrum_cluster::{ClusterCore, ProtocolContext};
use fulcrum_config::Cluster;
use fulcrum_pool::BackendId;
use fulcrum_sql::{Decision, Dialect};

use super::cancel::CancelRegistry;
use super::statements::StatementRegistry;
use crate::auth::scram::{Verifier, ITERATIONS};
use crate::auth::secret::StoredSecret;
use crate::backend::conn::SessionParams;
use crate::backend::health::PgServerOps;
use crate::backend::{connect, ConnectError, Credential, ServerConn, ServerTarget};

pub struct UserAuth {
    pub password: String,
    pub verifier: Verifier,
    /// The login on the servers (`server_user`, `server_password`, else the same).
    pub server_user: String,
    pub server_password: String,
    /// The password given as PostgreSQL stores it (a SCRAM verifier, whose
    /// `verifier` this is, or an md5 hash): clients are checked against it
    /// alone (`stored_login`).
    pub stored: Option<StoredSecret>,
    /// `stored` logs in to the servers too (the server login is the
    /// user's own): with the hash, or the key a client proved.
    pub passes_through: bool,
    /// The SCRAM ClientKey the first client of `stored` proved.
    pub proven: OnceLock<[u8; 32]>,
}

impl UserAuth {
    fn of(u: &fulcrum_config::User) -> UserAuth {
        let stored = u.hash.clone().map(StoredSecret::from);
        let verifier = match &stored {
            Some(StoredSecret::Scram(v)) => v.clone(),
            // Never asked: an md5 hash is checked by md5 alone.
            Some(_) => Verifier::unmatchable(&rand::random::<[u8; 16]>(), &u.name),
            None => Verifier::new(&u.password, &rand::random::<[u8; 16]>(), ITERATIONS),
        };
        UserAuth {
            password: u.password.clone(),
            verifier,
            server_user: u.server_user().to_owned(),
            server_password: u.server_password().to_owned(),
            stored,
            passes_through: u.server_hash().is_some(),
            proven: OnceLock::new(),
        }
    }
}

type WelcomeKey = (BackendId, Arc<str>, Arc<str>, SessionParams);

/// Most cached welcome messages kept; the cache is emptied when it fills.
const WELCOME_CACHE_MAX: usize = 1024;

/// The core of a PostgreSQL cluster: server connections, positions as
/// LSNs, a pool per database.
pub type PgCore = ClusterCore<ServerConn, u64, Arc<str>>;

pub struct ClusterContext {
    core: PgCore,
    pub users: HashMap<String, UserAuth>,
    /// `auth_query` users: their fetched secrets and what their clients proved.
    pub auth: super::auth_query::AuthCache,
    pub statements: StatementRegistry,
    pub cancels: Arc<CancelRegistry>,
    /// LISTEN/NOTIFY in transaction pooling: the listening connections.
    pub notifications: crate::notify::Registry,
    /// Secret mixed into mock SCRAM salts for unknown users.
    pub mock_secret: [u8; 16],
    /// The ParameterStatus values a server reported after taking a client's
    /// startup parameters, so the next client with the same ones logs in
    /// without waiting for a server connection (as PgBouncer does).
    welcome: Mutex<HashMap<WelcomeKey, Arc<BTreeMap<String, String>>>>,
    /// Fingerprints of unparsable statements already logged.
    unparsed_logged: Mutex<HashSet<u64>>,
}

/// Distinct unparsable statements logged at most.
const UNPARSED_LOG_MAX: usize = 1000;

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

impl std::ops::Deref for ClusterContext {
    type Target = PgCore;
    fn deref(&self) -> &PgCore {
        &self.core
    }
}

impl ClusterContext {
    /// A context whose metrics go nowhere (tests, tools).
    pub fn new(config: Cluster) -> Arc<ClusterContext> {
        Self::with_metrics(config, Arc::new(fulcrum_metrics::Metrics::new()), None)
    }

    pub fn with_metrics(
        config: Cluster,
        metrics: Arc<fulcrum_metrics::Metrics>,
        slow_query_threshold: Option<std::time::Duration>,
    ) -> Arc<ClusterContext> {
        Self::after(config, metrics, slow_query_threshold, None)
    }

    /// `with_metrics`, for the context that replaces `earlier` (a reload,
    /// an upgrade's observing loops): the cancel keys stay one registry, so
    /// a CancelRequest (which the listener hands to the context current
    /// when it connects) reaches a client that logged in before.
    pub fn after(
        config: Cluster,
        metrics: Arc<fulcrum_metrics::Metrics>,
        slow_query_threshold: Option<std::time::Duration>,
        earlier: Option<&ClusterContext>,
    ) -> Arc<ClusterContext> {
        let cancels = earlier.map_or_else(Default::default, |e| e.cancels.clone());
        let users = config
            .users
            .iter()
            .map(|u| (u.name.clone(), UserAuth::of(u)))
            .collect();
        Arc::new(ClusterContext {
            auth: super::auth_query::AuthCache::new(fulcrum_cluster::AuthLimits::of(&config)),
            core: ClusterCore::new(config, metrics, slow_query_threshold, Dialect::Postgres),
            users,
            statements: StatementRegistry::default(),
            cancels,
            notifications: Default::default(),
            mock_secret: rand::random(),
            welcome: Mutex::new(HashMap::new()),
            unparsed_logged: Mutex::new(HashSet::new()),
        })
    }

    pub fn cached_welcome(
        &self,
        backend: BackendId,
        user: &Arc<str>,
        database: &Arc<str>,
        startup: &SessionParams,
    ) -> Option<Arc<BTreeMap<String, String>>> {
        let cache = self.welcome.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .get(&(backend, user.clone(), database.clone(), startup.clone()))
            .cloned()
    }

    pub fn cache_welcome(
        &self,
        backend: BackendId,
        user: &Arc<str>,
        database: &Arc<str>,
        startup: &SessionParams,
        reported: &BTreeMap<String, String>,
    ) {
        let mut cache = self.welcome.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= WELCOME_CACHE_MAX {
            cache.clear();
        }
        cache.insert(
            (backend, user.clone(), database.clone(), startup.clone()),
            Arc::new(reported.clone()),
        );
    }

    /// The decision for a unit of `user` on `database`: a read calling
    /// functions no list decides goes to the primary unless the function
    /// catalog knows them all to be reads (`function_catalog`).
    pub fn catalog_decision(
        &self,
        unit: &fulcrum_sql::Classified,
        user: &Arc<str>,
        database: &Arc<str>,
    ) -> Decision {
        self.decide_with_catalog(unit, user, (0, 0), database)
    }

    /// Classifies `sql`; a statement the parser cannot parse is logged once
    /// (at debug level) per distinct fingerprint.
    pub fn classify(&self, sql: &str) -> Decision {
        self.classify_shared(sql).decision
    }

    /// `classify`, with what each statement does to the session.
    #[inline]
    pub fn classify_unit(&self, sql: &str) -> fulcrum_sql::Classified {
        Arc::unwrap_or_clone(self.classify_shared(sql))
    }

    /// `sql` was not parsed: logged once (at debug level) per distinct
    /// fingerprint. Out of line, so `classify_shared` is small enough to be
    /// inlined into routing (about 20 instructions a unit).
    #[cold]
    #[inline(never)]
    fn unparsed(&self, sql: &str) {
        let key = fulcrum_sql::fingerprint(sql, Dialect::Postgres);
        let mut seen = self
            .unparsed_logged
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if seen.len() < UNPARSED_LOG_MAX && seen.insert(key) {
            tracing::debug!(cluster = %self.config.name, statement = %truncate(sql, 200), "statement not parsed; routed by default_route");
        }
    }

    /// `classify_unit`, shared with the classifier's cache: a hit is a
    /// reference count, not a copy (`Classifier::classify_shared`).
    #[inline]
    pub fn classify_shared(&self, sql: &str) -> Arc<fulcrum_sql::Classified> {
        let unit = self.classifier.classify_shared(sql);
        if unit.decision == Decision::Unknown {
            self.unparsed(sql);
        }
        unit
    }

    /// `classify_shared` of text that may not be UTF-8
    /// (`Classifier::classify_bytes`).
    #[inline]
    pub fn classify_bytes(&self, text: &[u8]) -> Arc<fulcrum_sql::Classified> {
        let unit = self.classifier.classify_bytes(text);
        if unit.decision == Decision::Unknown {
            self.unparsed(&fulcrum_sql::encoding::statement_text(text));
        }
        unit
    }

    /// Opens a new server connection for a pool: logs in (as the login the
    /// database forces, else the user's) and runs `connect_query`.
    pub async fn open(
        &self,
        backend: BackendId,
        user: &str,
        database: &str,
    ) -> Result<ServerConn, ConnectError> {
        let mut conn = self.log_in(backend, user, database).await?;
        if let Some(sql) = self.config.connect_query(Some(database), user) {
            // Boxed, as the login: rare, and large for every checkout's future.
            let (address, timeout) = (&self.backends[backend], self.config.connect_timeout);
            Box::pin(crate::backend::run_connect_query(
                &mut conn, sql, address, timeout,
            ))
            .await?;
        }
        Ok(conn)
    }

    /// A new server connection, logged in, for `user`'s pool on `database`.
    async fn log_in(
        &self,
        backend: BackendId,
        user: &str,
        database: &str,
    ) -> Result<ServerConn, ConnectError> {
        let forced = self.config.forced_login(database, user);
        let (server_user, credential) = match (forced, self.users.get(user)) {
            // `[[cluster.database]]` with server_user: whoever the client is.
            (Some(l), _) => (l.user.clone(), Credential::Password(l.password.clone())),
            (None, Some(u)) => (
                u.server_user.clone(),
                super::stored_login::server_credential(u, user).map_err(|reason| {
                    ConnectError::Auth {
                        address: self.backends[backend].clone(),
                        reason,
                    }
                })?,
            ),
            (None, None) => (
                user.to_owned(),
                self.auth
                    .proof(user)
                    .unwrap_or_else(|| Credential::Password(String::new())),
            ),
        };
        let target = ServerTarget {
            address: self.backends[backend].clone(),
            user: server_user,
            credential,
            database: database.to_owned(),
            allow_cleartext: self.config.server_cleartext,
            tls: self
                .config
                .backends
                .get(backend)
                .and_then(|b| crate::backend::connect::ServerTlsTarget::from_config(&b.tls)),
        };
        // Boxed: a login's state (handshake, authentication, TLS) is large
        // and rarely alive, and every future awaiting a pool checkout would
        // otherwise carry its size, idle clients' sessions included.
        Box::pin(connect(&target, self.config.connect_timeout)).await
    }
}

impl ProtocolContext for ClusterContext {
    type Conn = ServerConn;
    type Position = u64;
    type Scope = Arc<str>;
    type Ops = PgServerOps;
    type OpenError = ConnectError;

    fn core(&self) -> &PgCore {
        &self.core
    }

    fn server_ops(&self) -> PgServerOps {
        PgServerOps::new(&self.config)
    }

    async fn open_pooled(
        &self,
        backend: BackendId,
        user: &Arc<str>,
        database: &Arc<str>,
    ) -> Result<ServerConn, ConnectError> {
        self.open(backend, user, database).await
    }

    /// Each configured user with each listed database (a database forcing
    /// a server login: that login's one pool), besides the pools in use.
    fn configured_pools(&self) -> Vec<(Arc<str>, Arc<str>)> {
        let mut out: Vec<(Arc<str>, Arc<str>)> = Vec::new();
        for d in &self.config.databases {
            let database: Arc<str> = d.server_database.as_str().into();
            for u in &self.config.users {
                let user = self.config.pool_user(&u.name, &d.name);
                if !out.iter().any(|(o, db)| **o == *user && *db == database) {
                    out.push((user.into(), database.clone()));
                }
            }
        }
        out
    }

    /// The user functions of a database (outside pg_catalog and
    /// information_schema): volatile in any overload is a write; stable or
    /// immutable a read. Read with the login of the client that asked
    /// (`pg_proc` shows every user the same), or, at start and after a
    /// failover (no client asked), as the health user.
    async fn read_functions(&self, w: &Wanted) -> Option<Functions> {
        let mut conn = self.catalog_conn(w).await?;
        let rows = conn
            .query_rows(
                "SELECT p.proname::text, bool_or(p.provolatile = 'v')::text, \
                 bool_and(p.provolatile = 'i')::text FROM pg_proc p \
                 JOIN pg_namespace n ON n.oid = p.pronamespace \
                 WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') GROUP BY p.proname",
            )
            .await
            .ok()?;
        let mut functions = Functions::new();
        for row in rows {
            if let (Some(Some(name)), Some(Some(volatile))) = (row.first(), row.get(1)) {
                let immutable = matches!(row.get(2), Some(Some(v)) if v == "true");
                let kind = if volatile == "true" {
                    FunctionKind::Write
                } else if immutable {
                    FunctionKind::Immutable
                } else {
                    FunctionKind::Read
                };
                functions.insert(name.to_ascii_lowercase().into(), kind);
            }
        }
        Some(functions)
    }

    /// The database's relations, for the result cache (`relations`).
    async fn read_relations(&self, w: &Wanted) -> Option<Relations> {
        self.relations_of(w).await
    }

    fn prepared_statements(&self) -> Option<usize> {
        Some(self.statements.len())
    }

    /// One logical decoding stream per database the cache serves
    /// (`crate::change_stream`).
    fn start_change_streams(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        crate::change_stream::start(self)
    }

    fn listeners(&self) -> Vec<fulcrum_cluster::ListenerRow> {
        self.notifications
            .listing()
            .into_iter()
            .map(|l| fulcrum_cluster::ListenerRow {
                database: l.database.to_string(),
                user: l.user.to_string(),
                channels: l.channels,
                clients: l.clients,
                subscriptions: l.subscriptions,
                backend: l.backend.map(|b| self.backends[b].to_string()),
                reconnects: l.reconnects,
            })
            .collect()
    }
}

impl fulcrum_metrics::Source for ClusterContext {
    fn refresh(&self, metrics: &fulcrum_metrics::Metrics) {
        self.refresh_metrics(metrics);
    }
}
