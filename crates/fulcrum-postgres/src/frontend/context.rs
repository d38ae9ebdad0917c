//! Everything the sessions of one cluster share: its config, the router, the
//! server connection pools keyed by (backend, user, database), the users'
//! SCRAM verifiers, the statement registry and the cancel keys.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use fulcrum_cluster::ClusterView;
use fulcrum_config::{BalancePolicy, Cluster, Role};
use fulcrum_pool::{BackendId, Balance, Pool, Router};
use fulcrum_sql::{Classifier, ClassifierConfig, Decision, Dialect};
use tokio::sync::watch;

use super::cancel::CancelRegistry;
use super::statements::StatementRegistry;
use crate::auth::scram::{Verifier, ITERATIONS};
use crate::backend::conn::SessionParams;
use crate::backend::health::PgServerOps;
use crate::backend::{connect, ConnectError, Credential, ServerConn, ServerTarget};

pub struct UserAuth {
    pub password: String,
    pub verifier: Verifier,
    /// The login on the servers (`server_user`, `server_password`, else the same).
    pub server_user: String,
    pub server_password: String,
}

type PoolKey = (BackendId, Arc<str>, Arc<str>);
type WelcomeKey = (BackendId, Arc<str>, Arc<str>, SessionParams);

/// Most cached welcome messages kept; the cache is emptied when it fills.
const WELCOME_CACHE_MAX: usize = 1024;

pub struct ClusterContext {
    pub config: Cluster,
    /// This cluster's handles on the Prometheus families.
    pub metrics: Arc<fulcrum_metrics::ClusterMetrics>,
    /// The health loop (probes, lag, failover), once started.
    health: fulcrum_cluster::HealthLoop,
    /// Statement digest statistics (SHOW QUERIES).
    pub digests: fulcrum_cluster::DigestSlot,
    /// Units of work slower than this are logged (`[fulcrum] slow_query_threshold`).
    pub slow_query_threshold: Option<std::time::Duration>,
    pub router: Arc<Router>,
    /// The health loop's picture of the cluster.
    pub view: Arc<ClusterView>,
    pub classifier: Classifier,
    pub backends: Vec<Arc<str>>,
    pub users: HashMap<String, UserAuth>,
    /// `auth_query` users: their fetched secrets and what their clients proved.
    pub auth: super::auth_query::AuthCache,
    pub statements: StatementRegistry,
    pub cancels: Arc<CancelRegistry>,
    /// Secret mixed into mock SCRAM salts for unknown users.
    pub mock_secret: [u8; 16],
    pools: Mutex<HashMap<PoolKey, Pool<ServerConn>>>,
    /// `max_db_connections`, `max_user_connections`.
    budgets: fulcrum_pool::Budgets,
    /// The ParameterStatus values a server reported after taking a client's
    /// startup parameters, so the next client with the same ones logs in
    /// without waiting for a server connection (as PgBouncer does).
    welcome: Mutex<HashMap<WelcomeKey, Arc<BTreeMap<String, String>>>>,
    /// Fingerprints of unparsable statements already logged.
    unparsed_logged: Mutex<HashSet<u64>>,
    /// `consistency = "strong"`: the primary's WAL position, one fetch shared
    /// by the reads that ask at the same time.
    pub primary_position: fulcrum_pool::Coalesced<u64>,
    /// `consistency = "user"`: each (user, database)'s newest commit position.
    pub user_positions: fulcrum_pool::UserPositions<u64>,
    /// `function_catalog`: what the server says of functions no list decides.
    pub functions: Arc<fulcrum_cluster::function_catalog::FunctionCatalog>,
}

/// Distinct unparsable statements logged at most.
const UNPARSED_LOG_MAX: usize = 1000;

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
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
        let primary = config
            .backends
            .iter()
            .position(|b| b.role == Role::Primary)
            .or_else(|| config.backends.iter().position(|b| b.role == Role::Auto))
            .unwrap_or(0);
        let users = config
            .users
            .iter()
            .map(|u| {
                let salt: [u8; 16] = rand::random();
                let auth = UserAuth {
                    password: u.password.clone(),
                    verifier: Verifier::new(&u.password, &salt, ITERATIONS),
                    server_user: u.server_user().to_owned(),
                    server_password: u.server_password().to_owned(),
                };
                (u.name.clone(), auth)
            })
            .collect();
        let addresses: Vec<String> = config.backends.iter().map(|b| b.address.clone()).collect();
        Arc::new(ClusterContext {
            primary_position: fulcrum_pool::Coalesced::new(),
            user_positions: Default::default(),
            functions: Arc::new(fulcrum_cluster::function_catalog::FunctionCatalog::new(
                config
                    .function_catalog
                    .unwrap_or(fulcrum_config::defaults::FUNCTION_CATALOG_TTL),
            )),
            slow_query_threshold,
            health: fulcrum_cluster::HealthLoop::default(),
            digests: Default::default(),
            metrics: Arc::new(fulcrum_metrics::ClusterMetrics::new(
                metrics,
                &config.name,
                &addresses,
            )),
            view: Arc::new(ClusterView::new(
                &config
                    .backends
                    .iter()
                    .map(|b| b.address.clone())
                    .collect::<Vec<_>>(),
            )),
            router: Arc::new(Router::with_policy(
                primary,
                &config.backends.iter().map(|b| b.weight).collect::<Vec<_>>(),
                &config
                    .backends
                    .iter()
                    .enumerate()
                    .filter(|(i, b)| *i != primary && b.role != Role::Primary)
                    .map(|(i, _)| i)
                    .collect::<Vec<_>>(),
                config.reads_on_primary,
                match config.balance {
                    BalancePolicy::RoundRobin => Balance::RoundRobin,
                    BalancePolicy::Weighted => Balance::Weighted,
                    BalancePolicy::LeastConnections => Balance::LeastConnections,
                    BalancePolicy::Random => Balance::Random,
                    BalancePolicy::P2c => Balance::P2c,
                },
            )),
            classifier: Classifier::new(
                Dialect::Postgres,
                &ClassifierConfig {
                    cache_size: config.classifier_cache_size as usize,
                    write_functions: config.write_functions.clone(),
                    read_only_functions: config.read_only_functions.clone(),
                    max_classify_bytes: usize::try_from(config.max_classify_bytes)
                        .unwrap_or(usize::MAX),
                },
            ),
            backends: config
                .backends
                .iter()
                .map(|b| b.address.as_str().into())
                .collect(),
            users,
            auth: Default::default(),
            statements: StatementRegistry::default(),
            cancels: Arc::new(CancelRegistry::default()),
            mock_secret: rand::random(),
            pools: Mutex::new(HashMap::new()),
            budgets: fulcrum_pool::Budgets::new(
                config.budgets.max_db_connections,
                config.budgets.max_user_connections,
            ),
            welcome: Mutex::new(HashMap::new()),
            unparsed_logged: Mutex::new(HashSet::new()),
            config,
        })
    }

    /// Starts the cluster's health loop (probes, lag, failover) until
    /// `shutdown` turns true.
    /// Takes over from `earlier`, this cluster's context before a reload:
    /// its health loop stops (this one's, started next, is the only one),
    /// and its router follows this one's when the backends are the same, so
    /// clients connected before the reload route by the same health state.
    pub fn take_over(&self, earlier: &ClusterContext) {
        earlier.health.stop();
        self.digests
            .take_over(&earlier.digests, self.config.digests.max_entries);
        if !self.router.adopt(&earlier.router) {
            tracing::warn!(cluster = %self.config.name, "backends changed by the reload: clients connected before it keep the routing state of the old list until they reconnect");
        }
    }

    pub fn start_health(&self, shutdown: watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
        self.health.start(
            &self.config,
            Arc::new(PgServerOps::new(&self.config)),
            self.router.clone(),
            self.view.clone(),
            shutdown,
        )
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The pool for (backend, user, database), created on first use.
    pub fn pool(
        &self,
        backend: BackendId,
        user: &Arc<str>,
        database: &Arc<str>,
    ) -> Pool<ServerConn> {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools
            .entry((backend, user.clone(), database.clone()))
            .or_insert_with(|| {
                Pool::configured(
                    fulcrum_cluster::pool_upkeep::pool_settings(&self.config),
                    self.router.load_counter(backend),
                    self.budgets.for_pool(backend, user, Some(database)),
                    Some(self.metrics.server_check_hook()),
                )
            })
            .clone()
    }

    /// `min_pool_size`: tops up, on every backend in service, the pools of
    /// each (user, database) in use anywhere, and of each configured user
    /// with each listed database.
    /// Runs until the health loop stops (start that first).
    pub fn start_pool_upkeep(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        let shutdown = self.health.stopped()?;
        let weak = Arc::downgrade(self);
        fulcrum_cluster::pool_upkeep::start_upkeep(&self.config, shutdown, move || {
            let ctx = weak.upgrade();
            async move {
                if let Some(ctx) = ctx {
                    ctx.top_up_pools().await;
                }
            }
        })
    }

    async fn top_up_pools(&self) {
        let mut keys: HashSet<(Arc<str>, Arc<str>)> = self
            .pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .map(|(_, u, d)| (u.clone(), d.clone()))
            .collect();
        for u in &self.config.users {
            for d in &self.config.databases {
                keys.insert((u.name.as_str().into(), d.server_database.as_str().into()));
            }
        }
        for b in 0..self.backends.len() {
            if !fulcrum_cluster::pool_upkeep::in_service(&self.router, &self.view, b) {
                continue;
            }
            for (user, database) in &keys {
                let pool = self.pool(b, user, database);
                if let Err(e) = pool.fill(|| self.open(b, user, database)).await {
                    tracing::debug!(cluster = %self.config.name, backend = %self.backends[b], %user, %database, error = %e, "min_pool_size: opening a connection failed");
                }
            }
        }
    }

    /// Removes the pool for (backend, user, database) when it holds no
    /// connection, after a server refused a login there: a database name a
    /// client made up (3D000) must not leave an entry per name tried.
    pub fn forget_pool_if_empty(&self, backend: BackendId, user: &Arc<str>, database: &Arc<str>) {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        let key = (backend, user.clone(), database.clone());
        if pools.get(&key).is_some_and(|p| {
            let s = p.stats();
            s.idle == 0 && s.in_use == 0
        }) {
            pools.remove(&key);
        }
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
        if self.config.function_catalog.is_none() {
            return unit.decision;
        }
        self.functions.decide(unit, user, (0, 0), database)
    }

    /// Runs the function catalog's lookups on the primary until the health
    /// loop stops (start that first); nothing when `function_catalog` is off.
    pub fn start_function_lookups(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        self.config.function_catalog?;
        let stop = self.health.stopped()?;
        let weak = Arc::downgrade(self);
        Some(fulcrum_cluster::function_catalog::start_lookups(
            self.functions.clone(),
            stop,
            move |w| {
                let ctx = weak.upgrade();
                async move {
                    if let Some(ctx) = ctx {
                        ctx.look_up_function(w).await;
                    }
                }
            },
        ))
    }

    /// The user functions of a database (outside pg_catalog and
    /// information_schema): volatile in any overload is a write; stable or
    /// immutable a read.
    async fn look_up_function(&self, w: fulcrum_cluster::function_catalog::Wanted) {
        use fulcrum_cluster::function_catalog::{FunctionKind, Functions};
        let found = async {
            let primary = self.router.primary()?;
            let mut conn = self.open(primary, &w.user, &w.database).await.ok()?;
            let rows = conn
                .query_rows(
                    "SELECT p.proname::text, bool_or(p.provolatile = 'v')::text FROM pg_proc p \
                     JOIN pg_namespace n ON n.oid = p.pronamespace \
                     WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') GROUP BY p.proname",
                )
                .await
                .ok()?;
            let mut functions = Functions::new();
            for row in rows {
                if let (Some(Some(name)), Some(Some(volatile))) = (row.first(), row.get(1)) {
                    let kind = if volatile == "true" {
                        FunctionKind::Write
                    } else {
                        FunctionKind::Read
                    };
                    functions.insert(name.to_ascii_lowercase().into(), kind);
                }
            }
            Some(functions)
        }
        .await;
        self.metrics.function_lookup(found.is_some());
        self.functions.settle(&self.config.name, w.database, found);
    }

    /// Classifies `sql`; a statement the parser cannot parse is logged once
    /// (at debug level) per distinct fingerprint.
    pub fn classify(&self, sql: &str) -> Decision {
        self.classify_unit(sql).decision
    }

    /// `classify`, with what each statement does to the session.
    pub fn classify_unit(&self, sql: &str) -> fulcrum_sql::Classified {
        let unit = self.classifier.classify_unit(sql);
        if unit.decision == Decision::Unknown {
            let key = fulcrum_sql::fingerprint(sql, Dialect::Postgres);
            let mut seen = self
                .unparsed_logged
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if seen.len() < UNPARSED_LOG_MAX && seen.insert(key) {
                tracing::debug!(cluster = %self.config.name, statement = %truncate(sql, 200), "statement not parsed; routed by default_route");
            }
        }
        unit
    }

    /// Opens a new server connection for a pool.
    pub async fn open(
        &self,
        backend: BackendId,
        user: &str,
        database: &str,
    ) -> Result<ServerConn, ConnectError> {
        let (server_user, credential) = match self.users.get(user) {
            Some(u) => (
                u.server_user.clone(),
                Credential::Password(u.server_password.clone()),
            ),
            None => (
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
        connect(&target, self.config.connect_timeout).await
    }

    /// The digest table (made on first use).
    pub fn digest_table(&self) -> &Arc<fulcrum_metrics::DigestTable> {
        self.digests.table(self.config.digests.max_entries)
    }

    /// A digest stamp for one execution of `sql` on `backend`, starting now.
    pub fn digest_stamp(&self, sql: &str, backend: BackendId) -> Option<fulcrum_metrics::Stamp> {
        self.digests.stamp(
            self.config.digests.max_entries,
            sql,
            self.classifier.dialect(),
            self.router.is_primary(backend),
        )
    }

    /// This cluster's figures for a metrics scrape.
    pub fn refresh_metrics(&self, metrics: &fulcrum_metrics::Metrics) {
        let mut active = vec![0usize; self.backends.len()];
        let mut idle = vec![0usize; self.backends.len()];
        for (b, _, _, s) in self.pool_stats() {
            active[b] += s.in_use;
            idle[b] += s.idle;
        }
        let view = self.view.backends();
        let c = self.classifier.stats();
        metrics.set_cluster(&fulcrum_metrics::ClusterFigures {
            cluster: &self.config.name,
            backends: view
                .iter()
                .enumerate()
                .map(|(b, v)| fulcrum_metrics::BackendFigures {
                    address: &v.address,
                    state: v.state.as_str(),
                    primary: self.router.is_primary(b),
                    lag_bytes: v.lag_bytes,
                    lag_time: v.lag_time,
                    active: active[b],
                    idle: idle[b],
                    probe_login_refused: v.probe_login_refused,
                })
                .collect(),
            failovers: self.view.failovers(),
            failover_blocked: self.view.failover_blocked().is_some(),
            classifier_hits: c.hits,
            classifier_misses: c.misses,
            unparsed: c.unparsed,
            oversized: c.oversized,
            digests: match self.config.digests.metrics_top {
                0 => Vec::new(),
                n => self.digest_table().top(n as usize),
            },
            prepared_statements: Some(self.statements.len()),
        });
    }

    /// Pool counters for every (backend, user, database), for tests and stats.
    pub fn pool_stats(&self) -> Vec<(BackendId, String, String, fulcrum_pool::PoolStats)> {
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools
            .iter()
            .map(|((b, u, d), p)| (*b, u.to_string(), d.to_string(), p.stats()))
            .collect()
    }
}

impl fulcrum_metrics::Source for ClusterContext {
    fn refresh(&self, metrics: &fulcrum_metrics::Metrics) {
        self.refresh_metrics(metrics);
    }
}

impl fulcrum_cluster::ClusterAdmin for ClusterContext {
    fn config(&self) -> &Cluster {
        &self.config
    }
    fn router(&self) -> &Arc<Router> {
        &self.router
    }
    fn view(&self) -> &Arc<ClusterView> {
        &self.view
    }
    fn pools(&self) -> Vec<fulcrum_cluster::PoolRow> {
        self.pool_stats()
            .into_iter()
            .map(|(b, user, database, s)| fulcrum_cluster::PoolRow {
                backend: self.backends[b].to_string(),
                user,
                database,
                active: s.in_use,
                idle: s.idle,
                reserve: s.reserve,
                opened: s.opened,
                closed: s.closed,
                waits: s.waits,
            })
            .collect()
    }
    fn clients(&self) -> i64 {
        self.metrics.clients.get()
    }
    fn reconnect(&self, database: Option<&str>) -> usize {
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        let mut n = 0;
        for ((_, _, d), pool) in pools.iter() {
            if database.is_none_or(|db| **d == *db) {
                pool.retire();
                n += 1;
            }
        }
        n
    }
    fn retiring(&self, database: Option<&str>) -> usize {
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools
            .iter()
            .filter(|((_, _, d), _)| database.is_none_or(|db| **d == *db))
            .map(|(_, p)| p.retiring())
            .sum()
    }
    fn digests(&self) -> Arc<fulcrum_metrics::DigestTable> {
        self.digest_table().clone()
    }
    fn monitor(&self) -> Option<fulcrum_cluster::MonitorHandle> {
        self.health.handle()
    }
}
