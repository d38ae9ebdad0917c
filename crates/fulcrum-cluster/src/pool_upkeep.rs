//! What both protocols' contexts share about their pools: the settings a
//! cluster's config gives each pool, and `min_pool_size` upkeep, which
//! tops up the pools of every backend in service once a second (so pools
//! are warm at start, when their (user, database) is known, and on a new
//! primary after a failover).

use std::future::Future;
use std::time::Duration;

use fulcrum_config::Cluster;
use fulcrum_pool::{BackendId, PoolSettings, Router};
use tokio::sync::watch;

use crate::view::ClusterView;

/// How often pools are topped up to `min_pool_size`.
pub const UPKEEP_EVERY: Duration = Duration::from_secs(1);

/// The settings of every pool of `config`'s cluster.
pub fn pool_settings(config: &Cluster) -> PoolSettings {
    PoolSettings {
        size: config.pool_size,
        timeout: config.pool_timeout,
        idle_timeout: config.server_idle_timeout,
        lifetime: config.server_lifetime,
        min_size: config.budgets.min_pool_size,
        reserve_size: config.budgets.reserve_pool_size,
        reserve_timeout: config.budgets.reserve_pool_timeout,
        check_delay: Some(config.budgets.server_check_delay),
    }
}

/// Whether `backend` should be kept warm now: up, and the write target or
/// a reader (not down, not fenced, not disabled by an operator).
pub fn in_service(router: &Router, view: &ClusterView, backend: BackendId) -> bool {
    let up = view.backends().get(backend).is_some_and(|b| {
        !matches!(
            b.state,
            crate::BackendState::Down | crate::BackendState::Stale
        )
    });
    up && !router.is_disabled(backend)
        && (router.is_primary(backend) || router.is_readable(backend))
}

/// Runs `top_up` every [`UPKEEP_EVERY`] until `shutdown` turns true; does
/// nothing when `min_pool_size` is 0.
pub fn start_upkeep<F, Fut>(
    config: &Cluster,
    mut shutdown: watch::Receiver<bool>,
    top_up: F,
) -> Option<tokio::task::JoinHandle<()>>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    if config.budgets.min_pool_size == 0 {
        return None;
    }
    Some(tokio::spawn(async move {
        loop {
            top_up().await;
            tokio::select! {
                _ = tokio::time::sleep(UPKEEP_EVERY) => {}
                _ = shutdown.changed() => {}
            }
            if *shutdown.borrow() {
                return;
            }
        }
    }))
}
