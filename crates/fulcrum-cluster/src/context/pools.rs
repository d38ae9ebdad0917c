//! The core's server connection pools: one per (backend, user, scope),
//! made on first use under the cluster's budgets; `min_pool_size` top-ups
//! of the backends in service; what SHOW POOLS, RECONNECT and a metrics
//! scrape read of them.

use std::collections::HashSet;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use fulcrum_pool::{BackendId, Pool, Poolable};

use super::ClusterCore;
use crate::admin::PoolRow;
use crate::pool_upkeep;

/// What besides (backend, user) tells a protocol's pools apart: the
/// database for PostgreSQL (a server connection serves one); for MySQL,
/// whose connections serve any schema, the client's wire format and
/// character set.
pub trait PoolScope: Clone + Eq + Hash + Send + Sync + 'static {
    /// The database this scope's connections are tied to, if any: its
    /// `max_db_connections` budget applies, SHOW POOLS lists it, and a
    /// RECONNECT of another database leaves them be.
    fn database(&self) -> Option<&Arc<str>>;
}

/// PostgreSQL: a pool per database.
impl PoolScope for Arc<str> {
    fn database(&self) -> Option<&Arc<str>> {
        Some(self)
    }
}

impl<C: Poolable, P, S: PoolScope> ClusterCore<C, P, S> {
    /// The pool for (backend, user, scope), created on first use.
    pub fn pool(&self, backend: BackendId, user: &Arc<str>, scope: &S) -> Pool<C> {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools
            .entry((backend, user.clone(), scope.clone()))
            .or_insert_with(|| {
                // `[[cluster.user]]` `pool_size` and `max_user_connections`
                // over the cluster's.
                let mut settings = pool_upkeep::pool_settings(&self.config);
                settings.size = self.config.pool_size_of(user);
                let max_user = self.config.max_user_connections_of(user);
                Pool::configured(
                    settings,
                    self.router.load_counter(backend),
                    self.budgets
                        .for_pool(backend, user, scope.database(), max_user),
                    Some(self.metrics.server_check_hook()),
                )
                // Listed in SHOW SERVERS under these names.
                .labelled(fulcrum_pool::PoolLabels {
                    cluster: self.config.name.as_str().into(),
                    backend: self.backends[backend].clone(),
                    user: user.clone(),
                    database: scope.database().cloned().unwrap_or_else(|| "".into()),
                })
            })
            .clone()
    }

    /// Removes the pool for (backend, user, scope) when it holds no
    /// connection, after a server refused a login there: a database name a
    /// client made up (3D000) must not leave an entry per name tried.
    pub fn forget_pool_if_empty(&self, backend: BackendId, user: &Arc<str>, scope: &S) {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        let key = (backend, user.clone(), scope.clone());
        if pools.get(&key).is_some_and(|p| {
            let s = p.stats();
            s.idle == 0 && s.in_use == 0
        }) {
            pools.remove(&key);
        }
    }

    /// `min_pool_size`: tops up, on every backend in service, the pools of
    /// each (user, scope) in use anywhere and of each in `configured`,
    /// opening connections with `open`.
    pub(crate) async fn top_up_pools<E, F, Fut>(&self, configured: Vec<(Arc<str>, S)>, open: F)
    where
        E: std::fmt::Display,
        F: Fn(BackendId, Arc<str>, S) -> Fut,
        Fut: Future<Output = Result<C, E>>,
    {
        let mut keys: HashSet<(Arc<str>, S)> = self
            .pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .map(|(_, u, s)| (u.clone(), s.clone()))
            .collect();
        keys.extend(configured);
        for b in 0..self.backends.len() {
            if !pool_upkeep::in_service(&self.router, &self.view, b) {
                continue;
            }
            for (user, scope) in &keys {
                let pool = self.pool(b, user, scope);
                if let Err(e) = pool.fill(|| open(b, user.clone(), scope.clone())).await {
                    let database = scope.database().map_or("", |d| d);
                    tracing::debug!(cluster = %self.config.name, backend = %self.backends[b], %user, %database, error = %e, "min_pool_size: opening a connection failed");
                }
            }
        }
    }

    /// Each pool's counters, with its backend, user and scope.
    fn each_pool<T>(&self, mut f: impl FnMut(BackendId, &Arc<str>, &S, &Pool<C>) -> T) -> Vec<T> {
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools.iter().map(|((b, u, s), p)| f(*b, u, s, p)).collect()
    }

    /// Connections in use and idle, per backend.
    pub fn pool_totals(&self) -> (Vec<usize>, Vec<usize>) {
        let n = self.backends.len();
        let (mut active, mut idle) = (vec![0usize; n], vec![0usize; n]);
        for (b, s) in self.each_pool(|b, _, _, p| (b, p.stats())) {
            active[b] += s.in_use;
            idle[b] += s.idle;
        }
        (active, idle)
    }

    /// SHOW POOLS: a row per pool (the database empty where a pool serves
    /// any).
    pub fn pool_rows(&self) -> Vec<PoolRow> {
        self.each_pool(|b, user, scope, pool| {
            let s = pool.stats();
            PoolRow {
                backend: self.backends[b].to_string(),
                user: user.to_string(),
                database: scope.database().map(|d| d.to_string()).unwrap_or_default(),
                active: s.in_use,
                idle: s.idle,
                used: s.used,
                reserve: s.reserve,
                opened: s.opened,
                closed: s.closed,
                waits: s.waits,
            }
        })
    }

    /// Whether a pool of `scope` serves `database` (`None`: every database;
    /// a pool tied to none serves them all).
    fn serves(scope: &S, database: Option<&str>) -> bool {
        match (database, scope.database()) {
            (Some(db), Some(d)) => **d == *db,
            _ => true,
        }
    }

    /// Admin `RECONNECT`: the pools serving `database` close their server
    /// connections once idle. Returns the pools touched.
    pub fn reconnect(&self, database: Option<&str>) -> usize {
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        let mut n = 0;
        for ((_, _, scope), pool) in pools.iter() {
            if Self::serves(scope, database) {
                pool.retire();
                n += 1;
            }
        }
        n
    }

    /// Connections a RECONNECT of `database` still waits to close.
    pub fn retiring(&self, database: Option<&str>) -> usize {
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools
            .iter()
            .filter(|((_, _, scope), _)| Self::serves(scope, database))
            .map(|(_, p)| p.retiring())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Conn;
    impl Poolable for Conn {
        fn is_usable(&mut self) -> bool {
            true
        }
    }

    /// A scope tied to no database (as MySQL's).
    #[derive(Clone, PartialEq, Eq, Hash)]
    struct Format(u8);
    impl PoolScope for Format {
        fn database(&self) -> Option<&Arc<str>> {
            None
        }
    }

    fn config() -> fulcrum_config::Cluster {
        fulcrum_config::parse(
            "[[cluster]]\nname = \"a\"\nprotocol = \"postgres\"\nlisten = \"127.0.0.1:1\"\n\
             [[cluster.backend]]\naddress = \"127.0.0.1:2\"\nrole = \"primary\"\n\
             [[cluster.backend]]\naddress = \"127.0.0.1:3\"\nrole = \"replica\"\n\
             [[cluster.user]]\nname = \"u\"\npassword = \"p\"\n",
            std::path::Path::new("t.toml"),
        )
        .expect("valid")
        .clusters
        .remove(0)
    }

    fn core<S>() -> ClusterCore<Conn, u64, S> {
        let metrics = Arc::new(fulcrum_metrics::Metrics::new());
        ClusterCore::new(config(), metrics, None, fulcrum_sql::Dialect::Postgres)
    }

    #[tokio::test]
    async fn pools_by_database_are_listed_and_reconnected_per_database() {
        let core = core::<Arc<str>>();
        let (u, a, b): (Arc<str>, Arc<str>, Arc<str>) = ("u".into(), "a".into(), "b".into());
        let pool = core.pool(1, &u, &a);
        let checkout = pool.get(|| async { Ok::<_, String>(Conn) }).await;
        let Ok(checkout) = checkout else {
            panic!("a connection opened")
        };
        checkout.release();
        core.pool(0, &u, &b);
        let mut rows = core.pool_rows();
        rows.sort_by(|x, y| x.database.cmp(&y.database));
        let listed: Vec<_> = rows
            .iter()
            .map(|r| (&*r.backend, &*r.database, r.idle))
            .collect();
        assert_eq!(listed, [("127.0.0.1:3", "a", 1), ("127.0.0.1:2", "b", 0)]);
        assert_eq!(core.pool_totals(), (vec![0, 0], vec![0, 1]));
        core.forget_pool_if_empty(0, &u, &b);
        core.forget_pool_if_empty(1, &u, &a);
        let kept: Vec<_> = core.pool_rows().into_iter().map(|r| r.database).collect();
        assert_eq!(kept, ["a"], "the empty pool is gone, the other kept");
        core.pool(0, &u, &b);
        assert_eq!(core.reconnect(Some("a")), 1, "only database a's pool");
        assert_eq!(core.reconnect(None), 2, "every pool");
    }

    #[test]
    fn pools_tied_to_no_database_serve_every_one() {
        let core = core::<Format>();
        let u: Arc<str> = "u".into();
        core.pool(0, &u, &Format(1));
        core.pool(0, &u, &Format(2));
        assert_eq!(core.reconnect(Some("any")), 2);
        assert!(core.pool_rows().iter().all(|r| r.database.is_empty()));
    }
}
