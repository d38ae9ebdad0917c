//! Everything the MySQL sessions of one cluster share: its config, the
//! router and health view, the classifier (MySQL dialect), the server
//! connection pools keyed by (backend, user, wire format, character set), the
//! users' passwords and the connection ids handed to clients.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use fulcrum_cluster::ClusterView;
use fulcrum_config::{BalancePolicy, Cluster, Role};
use fulcrum_pool::{BackendId, Balance, Pool, Router};
use fulcrum_sql::{Classifier, ClassifierConfig, Decision, Dialect};
use mysql_common::constants::CapabilityFlags as C;
use tokio::sync::watch;

use crate::backend::health::MariaServerOps;
use crate::backend::{connect, ConnectError, ServerConn, ServerTarget};

/// Which server connections can serve a client: the same backend and user,
/// the same result-set format, the same character set.
type PoolKey = (BackendId, Arc<str>, u32, u8);

/// A caching_sha2 fast-path entry: (the stored native hash it was made
/// under, SHA256(SHA256(password))).
type Sha2Entry = ([u8; 20], [u8; 32]);

pub struct MyClusterContext {
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
    pub view: Arc<ClusterView>,
    pub classifier: Classifier,
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
    pools: Mutex<HashMap<PoolKey, Pool<ServerConn>>>,
    /// `max_user_connections` (MySQL connections serve any schema: no
    /// per-database cap).
    budgets: fulcrum_pool::Budgets,
    /// Client connection id -> the server connection serving it now
    /// (backend, server thread id), for `KILL QUERY <id>`.
    running: Mutex<HashMap<u32, Option<(BackendId, u32)>>>,
    /// `consistency = "strong"`: the primary's `@@gtid_binlog_pos`, one
    /// fetch shared by the reads that ask at the same time.
    pub primary_position: fulcrum_pool::Coalesced<String>,
    /// `consistency = "user"`: each (user, schema)'s newest commit GTID.
    pub user_positions: fulcrum_pool::UserPositions<String>,
    /// `function_catalog`: what the server says of functions no list decides.
    pub functions: Arc<fulcrum_cluster::function_catalog::FunctionCatalog>,
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
        let primary = config
            .backends
            .iter()
            .position(|b| b.role == Role::Primary)
            .or_else(|| config.backends.iter().position(|b| b.role == Role::Auto))
            .unwrap_or(0);
        let replicas: Vec<BackendId> = config
            .backends
            .iter()
            .enumerate()
            .filter(|(i, b)| *i != primary && b.role != Role::Primary)
            .map(|(i, _)| i)
            .collect();
        let weights: Vec<u32> = config.backends.iter().map(|b| b.weight).collect();
        let balance = match config.balance {
            BalancePolicy::RoundRobin => Balance::RoundRobin,
            BalancePolicy::Weighted => Balance::Weighted,
            BalancePolicy::LeastConnections => Balance::LeastConnections,
            BalancePolicy::Random => Balance::Random,
            BalancePolicy::P2c => Balance::P2c,
        };
        let addresses: Vec<String> = config.backends.iter().map(|b| b.address.clone()).collect();
        Arc::new(MyClusterContext {
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
            router: Arc::new(Router::with_policy(
                primary,
                &weights,
                &replicas,
                config.reads_on_primary,
                balance,
            )),
            view: Arc::new(ClusterView::new(
                &config
                    .backends
                    .iter()
                    .map(|b| b.address.clone())
                    .collect::<Vec<_>>(),
            )),
            classifier: Classifier::new(
                Dialect::MySql,
                &ClassifierConfig {
                    cache_size: config.classifier_cache_size as usize,
                    write_functions: config.write_functions.clone(),
                    read_only_functions: config.read_only_functions.clone(),
                    max_classify_bytes: usize::try_from(config.max_classify_bytes)
                        .unwrap_or(usize::MAX),
                },
            ),
            passwords: config
                .users
                .iter()
                .map(|u| (u.name.clone(), u.password.clone()))
                .collect(),
            auth: Default::default(),
            sha2_cache: Mutex::new(HashMap::new()),
            server_logins: config
                .users
                .iter()
                .map(|u| {
                    let login = (u.server_user().to_owned(), u.server_password().to_owned());
                    (u.name.clone(), login)
                })
                .collect(),
            pools: Mutex::new(HashMap::new()),
            budgets: fulcrum_pool::Budgets::new(0, config.budgets.max_user_connections),
            running: Mutex::new(HashMap::new()),
            config,
        })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The digest table (made on first use).
    pub fn digest_table(&self) -> &Arc<fulcrum_metrics::DigestTable> {
        self.digests.table(self.config.digests.max_entries)
    }

    /// This cluster's figures for a metrics scrape.
    pub fn refresh_metrics(&self, metrics: &fulcrum_metrics::Metrics) {
        let n = self.config.backends.len();
        let (mut active, mut idle) = (vec![0usize; n], vec![0usize; n]);
        for ((b, ..), pool) in self.pools.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let s = pool.stats();
            active[*b] += s.in_use;
            idle[*b] += s.idle;
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
            prepared_statements: None,
        });
    }

    /// Starts the cluster's health loop until `shutdown` turns true.
    /// Takes over from `earlier`, this cluster's context before a reload:
    /// its health loop stops (this one's, started next, is the only one),
    /// and its router follows this one's when the backends are the same, so
    /// clients connected before the reload route by the same health state.
    pub fn take_over(&self, earlier: &MyClusterContext) {
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
            Arc::new(MariaServerOps::new(&self.config)),
            self.router.clone(),
            self.view.clone(),
            shutdown,
        )
    }

    /// A connection id for a new client (what `CONNECTION_ID()`-aware tools and
    /// `KILL QUERY` see).
    /// A connection id for a new client: one counter for the process, so
    /// clients of clusters sharing a port, or of a context before and after
    /// a reload, never share one (KILL QUERY names a client by it).
    pub fn connection_id(&self) -> u32 {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    }

    /// Records which server connection serves client `id` now (None: none).
    pub fn set_running(&self, id: u32, on: Option<(BackendId, u32)>) {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, on);
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
    pub fn running_on(&self, id: u32) -> Option<Option<(BackendId, u32)>> {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .copied()
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
        let unit = self.classifier.classify_unit(sql);
        if self.config.function_catalog.is_none() {
            return unit.decision;
        }
        self.functions.decide(&unit, user, options, schema)
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

    /// The stored functions of a schema (`information_schema.ROUTINES`):
    /// MODIFIES SQL DATA, or CONTAINS SQL and not deterministic (MariaDB's
    /// default, which it does not enforce), is a write; NO SQL, READS SQL
    /// DATA or deterministic a read.
    async fn look_up_function(&self, w: fulcrum_cluster::function_catalog::Wanted) {
        use fulcrum_cluster::function_catalog::{quote_literal, FunctionKind, Functions};
        let found = async {
            let primary = self.router.primary()?;
            let (format, charset) = w.options;
            let mut conn = self
                .open(primary, &w.user, C::from_bits_truncate(format), charset)
                .await
                .ok()?;
            let sql = format!(
                "SELECT GROUP_CONCAT(CONCAT(LOWER(ROUTINE_NAME), '=', \
                 (SQL_DATA_ACCESS = 'MODIFIES SQL DATA' OR \
                 (SQL_DATA_ACCESS = 'CONTAINS SQL' AND IS_DETERMINISTIC = 'NO'))) SEPARATOR ',') \
                 FROM information_schema.ROUTINES WHERE ROUTINE_TYPE = 'FUNCTION' AND ROUTINE_SCHEMA = {}",
                quote_literal(&w.database)
            );
            // A connection of its own (closed after): the list is one value,
            // which GROUP_CONCAT would cut at 1 kB by default.
            conn.run_simple(
                crate::codec::command::Command::Query,
                b"SET SESSION group_concat_max_len = 16777216",
            )
            .await
            .ok()?;
            let list = conn.query_value(&sql).await.ok()?.unwrap_or_default();
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
        .await;
        self.metrics.function_lookup(found.is_some());
        self.functions.settle(&self.config.name, w.database, found);
    }

    pub fn address(&self, backend: BackendId) -> &str {
        &self.config.backends[backend].address
    }

    /// The pool for a client of `user` with `wire_format` and `charset`.
    pub fn pool(
        &self,
        backend: BackendId,
        user: &Arc<str>,
        wire_format: C,
        charset: u8,
    ) -> Pool<ServerConn> {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools
            .entry((backend, user.clone(), wire_format.bits(), charset))
            .or_insert_with(|| {
                Pool::configured(
                    fulcrum_cluster::pool_upkeep::pool_settings(&self.config),
                    self.router.load_counter(backend),
                    self.budgets.for_pool(backend, user, None),
                    Some(self.metrics.server_check_hook()),
                )
            })
            .clone()
    }

    /// `min_pool_size`: tops up, on every backend in service, the pools of
    /// each (user, result format, character set) in use anywhere.
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
        let keys: std::collections::HashSet<(Arc<str>, u32, u8)> = self
            .pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .map(|(_, u, f, c)| (u.clone(), *f, *c))
            .collect();
        for b in 0..self.config.backends.len() {
            if !fulcrum_cluster::pool_upkeep::in_service(&self.router, &self.view, b) {
                continue;
            }
            for (user, format, charset) in &keys {
                let wire_format = C::from_bits_truncate(*format);
                let pool = self.pool(b, user, wire_format, *charset);
                if let Err(e) = pool
                    .fill(|| self.open(b, user, wire_format, *charset))
                    .await
                {
                    tracing::debug!(cluster = %self.config.name, backend = %self.address(b), %user, error = %e, "min_pool_size: opening a connection failed");
                }
            }
        }
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
        connect(&target, self.config.connect_timeout).await
    }
}

impl fulcrum_metrics::Source for MyClusterContext {
    fn refresh(&self, metrics: &fulcrum_metrics::Metrics) {
        self.refresh_metrics(metrics);
    }
}

impl fulcrum_cluster::ClusterAdmin for MyClusterContext {
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
        self.pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|((b, user, ..), pool)| {
                let s = pool.stats();
                fulcrum_cluster::PoolRow {
                    backend: self.address(*b).to_owned(),
                    user: user.to_string(),
                    database: String::new(),
                    active: s.in_use,
                    idle: s.idle,
                    reserve: s.reserve,
                    opened: s.opened,
                    closed: s.closed,
                    waits: s.waits,
                }
            })
            .collect()
    }
    fn clients(&self) -> i64 {
        self.metrics.clients.get()
    }
    fn reconnect(&self, _database: Option<&str>) -> usize {
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        for pool in pools.values() {
            pool.retire();
        }
        pools.len()
    }
    fn retiring(&self, _database: Option<&str>) -> usize {
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools.values().map(|p| p.retiring()).sum()
    }
    fn digests(&self) -> Arc<fulcrum_metrics::DigestTable> {
        self.digest_table().clone()
    }
    fn monitor(&self) -> Option<fulcrum_cluster::MonitorHandle> {
        self.health.handle()
    }
}
