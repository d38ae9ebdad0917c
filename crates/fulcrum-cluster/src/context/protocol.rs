//! What the core asks of the protocol context that holds it
//! ([`ProtocolContext`]: open a server connection for a pool, the health
//! loop's server operations, a database's functions and relations), and
//! what it does with that: start the health loop, `min_pool_size` upkeep,
//! the function and relation catalogs' lookups and (by default, none) the
//! cache's change streams, and answer the admin console
//! ([`ClusterAdmin`], for every protocol context).

use std::future::Future;
use std::sync::Arc;

use fulcrum_config::Cluster;
use fulcrum_pool::{BackendId, Poolable, Router};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{ClusterCore, PoolScope};
use crate::admin::{ClusterAdmin, ListenerRow, PoolRow};
use crate::function_catalog::{self, Functions, Wanted};
use crate::relation_catalog::{self, Relations};
use crate::{ClusterView, MonitorHandle, ServerOps};

/// A protocol's cluster context: its protocol-neutral core, and the few
/// things only the protocol can do for it.
pub trait ProtocolContext: Send + Sync + Sized + 'static {
    /// A server connection.
    type Conn: Poolable;
    /// A replication position (causal reads).
    type Position: Clone + Send + Sync + 'static;
    /// What besides (backend, user) tells pools apart.
    type Scope: PoolScope;
    /// The health loop's operations on this protocol's servers.
    type Ops: ServerOps;
    /// Why a server connection could not be opened.
    type OpenError: std::fmt::Display + Send;

    fn core(&self) -> &ClusterCore<Self::Conn, Self::Position, Self::Scope>;

    /// The health loop's server operations for this cluster.
    fn server_ops(&self) -> Self::Ops;

    /// Opens a server connection for the pool of (backend, user, scope).
    fn open_pooled(
        &self,
        backend: BackendId,
        user: &Arc<str>,
        scope: &Self::Scope,
    ) -> impl Future<Output = Result<Self::Conn, Self::OpenError>> + Send;

    /// Pools kept at `min_pool_size` besides those in use (PostgreSQL:
    /// each configured user with each listed database).
    fn configured_pools(&self) -> Vec<(Arc<str>, Self::Scope)> {
        Vec::new()
    }

    /// Reads the functions of `wanted`'s database on the primary (`None`:
    /// the lookup failed).
    fn read_functions(&self, wanted: &Wanted) -> impl Future<Output = Option<Functions>> + Send;

    /// Reads the relations of `wanted`'s database on the primary, for the
    /// result cache (`None`: the lookup failed, or the protocol does not
    /// read them: nothing of the database is then kept).
    fn read_relations(&self, wanted: &Wanted) -> impl Future<Output = Option<Relations>> + Send {
        let _ = wanted;
        std::future::ready(None)
    }

    /// The prepared statements this cluster's clients hold, where the
    /// protocol counts them (a gauge).
    fn prepared_statements(&self) -> Option<usize> {
        None
    }

    /// The listening connections of LISTEN/NOTIFY, where the protocol has
    /// them (SHOW LISTENERS).
    fn listeners(&self) -> Vec<ListenerRow> {
        Vec::new()
    }

    /// Sets this cluster's figures for a metrics scrape.
    fn refresh_metrics(&self, metrics: &fulcrum_metrics::Metrics) {
        self.core()
            .refresh_metrics(metrics, self.prepared_statements());
    }

    /// Starts the cluster's health loop (probes, lag, failover) until
    /// `shutdown` turns true.
    fn start_health(&self, shutdown: watch::Receiver<bool>) -> JoinHandle<()> {
        let core = self.core();
        core.health.start(
            &core.config,
            Arc::new(self.server_ops()),
            core.router.clone(),
            core.view.clone(),
            shutdown,
        )
    }

    /// `min_pool_size`: tops up, on every backend in service, the pools in
    /// use anywhere and the [`configured_pools`](Self::configured_pools).
    /// Runs until the health loop stops (start that first).
    fn start_pool_upkeep(self: &Arc<Self>) -> Option<JoinHandle<()>> {
        let shutdown = self.core().health.stopped()?;
        let weak = Arc::downgrade(self);
        crate::pool_upkeep::start_upkeep(&self.core().config, shutdown, move || {
            let ctx = weak.upgrade();
            async move {
                if let Some(ctx) = ctx {
                    let open = |b, user: Arc<str>, scope: Self::Scope| {
                        let ctx = &ctx;
                        async move { ctx.open_pooled(b, &user, &scope).await }
                    };
                    ctx.core().top_up_pools(ctx.configured_pools(), open).await;
                }
            }
        })
    }

    /// Runs the function catalog's lookups on the primary until the health
    /// loop stops (start that first); nothing when `function_catalog` is off.
    fn start_function_lookups(self: &Arc<Self>) -> Option<JoinHandle<()>> {
        let core = self.core();
        core.config.function_catalog?;
        let stop = core.health.stopped()?;
        let weak = Arc::downgrade(self);
        let databases = core.server_databases();
        let router = core.router.clone();
        Some(function_catalog::start_lookups(
            core.functions.clone(),
            core.config.name.clone(),
            stop,
            databases,
            move || router.primary(),
            move |w| {
                let ctx = weak.upgrade();
                async move {
                    let ctx = ctx?;
                    let found = ctx.read_functions(&w).await;
                    ctx.core().metrics.function_lookup(found.is_some());
                    found
                }
            },
        ))
    }

    /// Runs the relation catalog's lookups on the primary until the health
    /// loop stops (start that first); nothing without a result cache.
    fn start_relation_lookups(self: &Arc<Self>) -> Option<JoinHandle<()>> {
        let core = self.core();
        core.cache.as_ref()?;
        let stop = core.health.stopped()?;
        let weak = Arc::downgrade(self);
        let databases = core.server_databases();
        let router = core.router.clone();
        Some(relation_catalog::start_lookups(
            core.relations.clone(),
            core.config.name.clone(),
            stop,
            databases,
            move || router.primary(),
            move |w| {
                let ctx = weak.upgrade();
                async move {
                    let ctx = ctx?;
                    let found = ctx.read_relations(&w).await;
                    ctx.core().metrics.relation_lookup(found.is_some());
                    found
                }
            },
        ))
    }

    /// Starts the result cache's change streams (`[cluster.cache]
    /// invalidation = "stream"`), until the health loop stops (start that
    /// first). This default is a protocol without one: the cache falls
    /// back to Fulcrum's own writes, as with `invalidation = "proxy"`, and
    /// says so once. PostgreSQL (logical decoding) and MySQL (the binlog)
    /// override it.
    fn start_change_streams(self: &Arc<Self>) -> Option<JoinHandle<()>> {
        let cache = self.core().cache.as_ref()?;
        if cache.uses_streams() {
            tracing::warn!(cluster = %self.core().name(), "cache invalidation = \"stream\": this protocol has no change stream; the cache is invalidated by the writes that pass through Fulcrum only, as with invalidation = \"proxy\"");
            cache.without_stream();
        }
        None
    }
}

impl<X: ProtocolContext> ClusterAdmin for X {
    fn config(&self) -> &Cluster {
        &self.core().config
    }
    fn router(&self) -> &Arc<Router> {
        &self.core().router
    }
    fn view(&self) -> &Arc<ClusterView> {
        &self.core().view
    }
    fn pools(&self) -> Vec<PoolRow> {
        self.core().pool_rows()
    }
    fn clients(&self) -> i64 {
        self.core().metrics.clients.get()
    }
    fn reconnect(&self, database: Option<&str>) -> usize {
        self.core().reconnect(database)
    }
    fn retiring(&self, database: Option<&str>) -> usize {
        self.core().retiring(database)
    }
    fn digests(&self) -> Arc<fulcrum_metrics::DigestTable> {
        self.core().digest_table().clone()
    }
    fn monitor(&self) -> Option<MonitorHandle> {
        self.core().health.handle()
    }
    fn listeners(&self) -> Vec<ListenerRow> {
        ProtocolContext::listeners(self)
    }
    fn mirrors(&self) -> Vec<Arc<fulcrum_metrics::MirrorStats>> {
        self.core().mirrors.stats()
    }
    fn cache(&self) -> Option<fulcrum_cache::Cache> {
        self.core().cache.clone()
    }
}
