//! The protocol-neutral core of a cluster's context: what the PostgreSQL
//! and MySQL contexts share. It owns the cluster's config, its metrics
//! handles, the health loop's handle, the router and health view, the
//! classifier, the statement digests, the function and relation catalogs, the
//! causal-read positions and the server connection pools (`pools`); it is
//! generic over the protocol's server connection (`C`), its replication
//! position (`P`: PostgreSQL's LSN, MariaDB's GTID list) and what besides
//! (backend, user) tells its pools apart (`S`, a [`PoolScope`]).
//!
//! The protocol's context holds one and dereferences to it; what the core
//! needs of the protocol (opening a server connection, its health
//! operations, reading a database's functions) is the [`ProtocolContext`]
//! trait (`protocol`), which also starts the core's background tasks.

mod figures;
mod pools;
mod protocol;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fulcrum_config::{BalancePolicy, Cluster, Role};
use fulcrum_pool::{BackendId, Balance, Budgets, Coalesced, Pool, Router, UserPositions};
use fulcrum_sql::{Classified, Classifier, ClassifierConfig, Decision, Dialect};

use crate::function_catalog::FunctionCatalog;
use crate::relation_catalog::RelationCatalog;
use crate::{ClusterView, DigestSlot, HealthLoop};

pub use pools::PoolScope;
pub use protocol::ProtocolContext;

/// The pools of one cluster: (backend, user, scope) to the pool.
type PoolMap<C, S> = HashMap<(BackendId, Arc<str>, S), Pool<C>>;

pub struct ClusterCore<C, P, S> {
    pub config: Cluster,
    /// This cluster's handles on the Prometheus families.
    pub metrics: Arc<fulcrum_metrics::ClusterMetrics>,
    /// The health loop (probes, lag, failover), once started.
    health: HealthLoop,
    /// Statement digest statistics (SHOW QUERIES).
    pub digests: DigestSlot,
    /// Units of work slower than this are logged (`[fulcrum] slow_query_threshold`).
    pub slow_query_threshold: Option<Duration>,
    pub router: Arc<Router>,
    /// The health loop's picture of the cluster.
    pub view: Arc<ClusterView>,
    pub classifier: Classifier,
    /// The backends' addresses, in config order.
    pub backends: Vec<Arc<str>>,
    pools: Mutex<PoolMap<C, S>>,
    /// `max_db_connections`, and each user's `max_user_connections`.
    budgets: Budgets,
    /// `consistency = "strong"`: the primary's position, one fetch shared
    /// by the reads that ask at the same time.
    pub primary_position: Coalesced<P>,
    /// `consistency = "user"`: each (user, database)'s newest commit position.
    pub user_positions: UserPositions<P>,
    /// `function_catalog`: what the server says of functions no list decides.
    pub functions: Arc<FunctionCatalog>,
    /// With a result cache: which relations its reads may be kept of, and
    /// which writes invalidate the whole database.
    pub relations: Arc<RelationCatalog>,
    /// `[[cluster.mirror]]`: the targets and their diffs.
    pub mirrors: crate::mirror::Targets,
    /// `[cluster.cache]`: the result cache, when its mode is not `off`.
    pub cache: Option<fulcrum_cache::Cache>,
}

impl<C, P: Clone, S> ClusterCore<C, P, S> {
    /// The core of `config`'s cluster, its statements classified in `dialect`.
    pub fn new(
        config: Cluster,
        metrics: Arc<fulcrum_metrics::Metrics>,
        slow_query_threshold: Option<Duration>,
        dialect: Dialect,
    ) -> ClusterCore<C, P, S> {
        let addresses: Vec<String> = config.backends.iter().map(|b| b.address.clone()).collect();
        ClusterCore {
            cache: result_cache(&config, &metrics),
            mirrors: crate::mirror::Targets::new(&config, &metrics),
            metrics: Arc::new(fulcrum_metrics::ClusterMetrics::new(
                metrics,
                &config.name,
                &addresses,
            )),
            health: HealthLoop::default(),
            digests: DigestSlot::default(),
            slow_query_threshold,
            router: Arc::new(router(&config)),
            view: Arc::new(ClusterView::new(&addresses)),
            classifier: Classifier::new(
                dialect,
                &ClassifierConfig {
                    cache_size: config.classifier_cache_size as usize,
                    write_functions: config.write_functions.clone(),
                    read_only_functions: config.read_only_functions.clone(),
                    session_free_functions: config.session_free_functions.clone(),
                    max_classify_bytes: usize::try_from(config.max_classify_bytes)
                        .unwrap_or(usize::MAX),
                },
            ),
            backends: addresses.iter().map(|a| a.as_str().into()).collect(),
            pools: Mutex::new(HashMap::new()),
            budgets: Budgets::new(config.budgets.max_db_connections),
            primary_position: Coalesced::new(),
            user_positions: UserPositions::default(),
            functions: Arc::new(FunctionCatalog::new(
                config
                    .function_catalog
                    .unwrap_or(fulcrum_config::defaults::FUNCTION_CATALOG_TTL),
            )),
            relations: Arc::new(RelationCatalog::new(
                config
                    .function_catalog
                    .unwrap_or(fulcrum_config::defaults::FUNCTION_CATALOG_TTL),
            )),
            config,
        }
    }
}

/// `[cluster.cache]`'s cache with its counters, unless `mode = "off"`.
fn result_cache(
    config: &Cluster,
    metrics: &fulcrum_metrics::Metrics,
) -> Option<fulcrum_cache::Cache> {
    let c = &config.cache;
    if !c.enabled() {
        return None;
    }
    let name = config.name.as_str();
    let counters = fulcrum_cache::CacheMetrics {
        hits: metrics.cache_hits.with_label_values(&[name]),
        misses: metrics.cache_misses.with_label_values(&[name]),
        invalidations: fulcrum_cache::Source::ALL.map(|s| {
            metrics
                .cache_invalidations
                .with_label_values(&[name, s.label()])
        }),
        bytes: metrics.cache_bytes.with_label_values(&[name]),
    };
    let limits = fulcrum_cache::Limits {
        max_memory: c.max_memory,
        max_result: c.max_result,
        needs_stream: c.invalidation == fulcrum_config::CacheInvalidation::Stream,
    };
    Some(fulcrum_cache::Cache::new(limits, counters))
}

impl<C, P, S> ClusterCore<C, P, S> {
    /// The configured databases (`[[cluster.database]]`) by their names on
    /// the servers: the catalogs read each at start.
    pub fn server_databases(&self) -> Vec<Arc<str>> {
        self.config
            .databases
            .iter()
            .map(|d| Arc::<str>::from(d.server_database.as_str()))
            .collect()
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The address of `backend`.
    pub fn address(&self, backend: BackendId) -> &str {
        &self.backends[backend]
    }

    /// What a session's read-consistency steps read of the cluster, for
    /// `user` on `database` (MariaDB: schema).
    pub fn reads<'a>(
        &'a self,
        user: &'a Arc<str>,
        database: &'a Arc<str>,
    ) -> fulcrum_session::reads::Shared<'a, P> {
        fulcrum_session::reads::Shared {
            config: &self.config,
            router: &self.router,
            metrics: &self.metrics,
            user_positions: &self.user_positions,
            user,
            database,
        }
    }

    /// The metrics route label of `backend` now: writes on the primary,
    /// reads elsewhere.
    pub fn route_label(&self, backend: BackendId) -> fulcrum_metrics::RouteLabel {
        if self.router.is_primary(backend) {
            fulcrum_metrics::RouteLabel::Write
        } else {
            fulcrum_metrics::RouteLabel::Read
        }
    }

    /// A unit of work of `user` on `database` (MariaDB: schema) held a
    /// connection of `backend` for `took`: its latency (the balancing
    /// policies read it), the unit metrics by route, and the slow-unit log
    /// (`slow_query_threshold`; no statement text, it would carry the
    /// query's parameters).
    pub fn unit_done(&self, backend: BackendId, took: Duration, user: &str, database: &str) {
        self.router.record_latency(backend, took);
        self.metrics.unit(backend, self.route_label(backend), took);
        if self.slow_query_threshold.is_some_and(|t| took >= t) {
            tracing::info!(
                cluster = %self.name(),
                user,
                database,
                server = %self.address(backend),
                took_ms = took.as_millis() as u64,
                "slow unit of work"
            );
        }
    }

    /// Takes over from `earlier`, this cluster's context before a reload:
    /// its health loop stops (this one's, started next, is the only one),
    /// its digest table carries over, and its router follows this one's
    /// when the backends are the same, so clients connected before the
    /// reload route by the same health state.
    pub fn take_over(&self, earlier: &ClusterCore<C, P, S>) {
        earlier.health.stop();
        self.digests
            .take_over(&earlier.digests, self.config.digests.max_entries);
        if !self.router.adopt(&earlier.router) {
            tracing::warn!(cluster = %self.config.name, "backends changed by the reload: clients connected before it keep the routing state of the old list until they reconnect");
        }
    }

    /// Stops the health loop and waits (up to `within`) for its last round
    /// to end: an upgrade hands the cluster to the next process, whose
    /// loop must be the only one. False if it did not end in time.
    pub async fn stop_health(&self, within: std::time::Duration) -> bool {
        self.health.stop_and_wait(within).await
    }

    /// Turns true when the health loop stops (`None` before it started):
    /// the cluster's other background tasks (a protocol's change streams)
    /// end with it.
    pub fn health_stopped(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        self.health.stopped()
    }

    /// The digest table (made on first use).
    pub fn digest_table(&self) -> &Arc<fulcrum_metrics::DigestTable> {
        self.digests.table(self.config.digests.max_entries)
    }

    /// The digest entry of `sql`, whose classifier fingerprint is `key` (0
    /// when the classifier gave none: the text is fingerprinted here), seen
    /// at `at`: without the table's lock when `memo` (the session's) holds
    /// it. `None` when digests are off.
    pub fn digest_entry_of(
        &self,
        key: u64,
        sql: &[u8],
        at: std::time::Instant,
        memo: &mut fulcrum_metrics::DigestMemo,
    ) -> Option<std::sync::Arc<fulcrum_metrics::Digest>> {
        let (max, dialect) = (self.config.digests.max_entries, self.classifier.dialect());
        if key == 0 {
            return std::str::from_utf8(sql)
                .ok()
                .and_then(|t| self.digests.entry(max, t, dialect));
        }
        self.digests
            .entry_remembered(max, memo, key, sql, dialect, at)
    }

    /// A digest stamp for one execution, starting `at`, of `sql` on
    /// `backend`, which the classifier has read (`unit`): its fingerprint is
    /// not computed again.
    pub fn digest_stamp_of(
        &self,
        unit: &Classified,
        sql: &[u8],
        backend: BackendId,
        at: std::time::Instant,
        memo: &mut fulcrum_metrics::DigestMemo,
    ) -> Option<fulcrum_metrics::Stamp> {
        let digest = self.digest_entry_of(unit.key, sql, at, memo)?;
        let primary = self.router.is_primary(backend);
        Some(fulcrum_metrics::Stamp::new(digest, at, primary))
    }

    /// `user`'s stored secret for a client at `peer`, from `cache` or
    /// by `auth_query` on the primary (`fetch`: the protocol's query, given
    /// the primary and an idle auth connection to it), the outcome counted
    /// in `fulcrum_auth_query_lookups_total`. No secret without `auth_user`.
    pub async fn auth_lookup<Secret, Proof, Conn, F, Fut>(
        &self,
        cache: &crate::AuthCache<Secret, Proof, Conn>,
        user: &str,
        peer: Option<std::net::IpAddr>,
        fetch: F,
    ) -> Result<crate::Looked<Secret>, crate::AuthQueryError>
    where
        Secret: Clone,
        Proof: Clone,
        F: FnOnce(BackendId, Option<Conn>) -> Fut,
        Fut: std::future::Future<
            Output = (Result<Option<Secret>, crate::AuthQueryError>, Option<Conn>),
        >,
    {
        let Some(aq) = &self.config.auth_query else {
            return Ok(crate::Looked::none());
        };
        let primary = crate::auth_query_backend(&self.router, &self.config)?;
        let looked = cache
            .lookup(user, aq.cache_ttl, peer, primary, |conn| {
                fetch(primary, conn)
            })
            .await;
        self.metrics.auth_lookup(match &looked {
            Ok(l) => l.outcome.label(),
            Err(_) => "failed",
        });
        looked
    }

    /// A client of `user` (with its protocol `options`) logged in to
    /// `database`: when the function catalog has not read that database yet,
    /// ask for it and wait up to `function_catalog_wait`, so the client's
    /// first reads are routed by the catalog, not sent to the primary.
    /// With a result cache, the relation catalog likewise (in the same
    /// wait), so the first reads may be kept.
    pub async fn catalog_at_login(&self, user: &Arc<str>, options: (u32, u8), database: &str) {
        let deadline = tokio::time::Instant::now() + self.config.function_catalog_wait;
        let relations = self.cache.is_some();
        if relations && !self.relations.knows(database) {
            // Asked first, so both lookups run during the one wait.
            self.relations.want(user, options, database);
        }
        if self.config.function_catalog.is_some() {
            self.functions
                .known_by(user, options, database, deadline)
                .await;
        }
        if relations {
            self.relations
                .known_by(user, options, database, deadline)
                .await;
        }
    }

    /// The decision for `unit`, of `user` (with its protocol `options`) on
    /// `database`: a read calling functions no list decides goes to the
    /// primary unless the function catalog knows them all to be reads
    /// (`function_catalog`; without it, the classifier's decision).
    pub fn decide_with_catalog(
        &self,
        unit: &Classified,
        user: &Arc<str>,
        options: (u32, u8),
        database: &str,
    ) -> Decision {
        if let Some(reason) = self.unproven_pin(unit, user, options, database) {
            return Decision::Pin(reason);
        }
        if self.config.function_catalog.is_none() {
            return unit.decision;
        }
        self.functions.decide(unit, user, options, database)
    }

    /// Default-deny for calls: a unit calling functions not known to leave
    /// no session state pins its client unless the function catalog shows
    /// each is a built-in (with the catalog off, or before it has read the
    /// database, it pins). `session_free_functions` lifts it per name.
    pub fn unproven_pin(
        &self,
        unit: &Classified,
        user: &Arc<str>,
        options: (u32, u8),
        database: &str,
    ) -> Option<fulcrum_sql::PinReason> {
        let names = unit.unproven.as_deref()?;
        let builtin = self.config.function_catalog.is_some()
            && self.functions.all_builtin(user, options, database, names);
        (!builtin).then_some(UNPROVEN_CALL)
    }
}

/// Why a unit calling a function not known to leave no session state pins.
pub const UNPROVEN_CALL: fulcrum_sql::PinReason =
    "call of a function not known to leave no session state";

/// The router of `config`'s backends: the first `primary` (else the first
/// `auto`, else the first) starts as the write target; the others that are
/// not `primary` serve reads, by the `balance` policy.
fn router(config: &Cluster) -> Router {
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
    Router::with_policy(
        primary,
        &weights,
        &replicas,
        config.reads_on_primary,
        balance,
    )
}
