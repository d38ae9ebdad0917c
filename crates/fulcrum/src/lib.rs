//! The daemon's wiring: from a validated config to running listeners, one per
//! cluster, until shutdown. Protocol work lives in the protocol crates.

use std::sync::Arc;

use fulcrum_config::{Config, Protocol};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Debug, Error)]
pub enum DaemonError {
    #[error("cluster \"{cluster}\": cannot listen on {address}: {source}")]
    Listen {
        cluster: String,
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot serve the admin console on {address}: {source}")]
    Admin {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot serve metrics on {address}: {source}")]
    Metrics {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// Binds every cluster's listener (and the metrics and admin listeners),
/// then serves until `shutdown` turns true. `set_log` changes the log filter
/// (the admin console's `SET log`).
pub async fn run(
    config: Config,
    shutdown: watch::Receiver<bool>,
    set_log: fulcrum_admin::SetLog,
) -> Result<(), DaemonError> {
    // Every listener is bound before any cluster's: once a client can
    // connect, the console and /metrics are there too.
    let admin_listener = match config.fulcrum.admin {
        Some(address) => Some(
            TcpListener::bind(address)
                .await
                .map_err(|source| DaemonError::Admin { address, source })?,
        ),
        None => None,
    };
    let metrics_listener = match config.fulcrum.metrics {
        Some(address) => Some(
            TcpListener::bind(address)
                .await
                .map_err(|source| DaemonError::Metrics { address, source })?,
        ),
        None => None,
    };
    let mut listeners = Vec::new();
    for cluster in &config.clusters {
        let listener =
            TcpListener::bind(cluster.listen)
                .await
                .map_err(|source| DaemonError::Listen {
                    cluster: cluster.name.clone(),
                    address: cluster.listen,
                    source,
                })?;
        listeners.push((cluster.clone(), listener));
    }
    let metrics = Arc::new(fulcrum_metrics::Metrics::new());
    let mut tasks = Vec::new();
    if let Some(listener) = metrics_listener {
        tracing::info!(listen = ?config.fulcrum.metrics, "serving /metrics");
        tasks.push(tokio::spawn(fulcrum_metrics::http::serve(
            listener,
            metrics.clone(),
            shutdown.clone(),
        )));
    }
    let mut admin_clusters: Vec<Arc<dyn fulcrum_cluster::ClusterAdmin>> = Vec::new();
    for (cluster, listener) in listeners {
        tracing::info!(
            cluster = %cluster.name,
            listen = %cluster.listen,
            backends = cluster.backends.len(),
            pool_mode = ?cluster.pool_mode,
            "listening"
        );
        match cluster.protocol {
            Protocol::Postgres => {
                let ctx = fulcrum_postgres::frontend::ClusterContext::with_metrics(
                    cluster,
                    metrics.clone(),
                    config.fulcrum.slow_query_threshold,
                );
                metrics.add_source(ctx.clone());
                admin_clusters.push(ctx.clone());
                ctx.start_health(shutdown.clone());
                tasks.push(tokio::spawn(fulcrum_postgres::frontend::serve(
                    Arc::clone(&ctx),
                    listener,
                    shutdown.clone(),
                    config.fulcrum.shutdown_timeout,
                )));
            }
            Protocol::Mysql => {
                let ctx = fulcrum_mysql::frontend::MyClusterContext::with_metrics(
                    cluster,
                    metrics.clone(),
                    config.fulcrum.slow_query_threshold,
                );
                metrics.add_source(ctx.clone());
                admin_clusters.push(ctx.clone());
                ctx.start_health(shutdown.clone());
                tasks.push(tokio::spawn(fulcrum_mysql::frontend::serve(
                    Arc::clone(&ctx),
                    listener,
                    shutdown.clone(),
                    config.fulcrum.shutdown_timeout,
                )));
            }
        }
    }
    if let Some(listener) = admin_listener {
        tracing::info!(listen = ?config.fulcrum.admin, "admin console");
        let admin = Arc::new(fulcrum_admin::Admin {
            config: config.clone(),
            clusters: admin_clusters,
            metrics: metrics.clone(),
            set_log,
        });
        tokio::spawn(fulcrum_admin::serve(listener, admin, shutdown.clone()));
    }
    for t in tasks {
        let _ = t.await;
    }
    Ok(())
}
