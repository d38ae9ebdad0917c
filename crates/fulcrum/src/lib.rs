//! The daemon's wiring: from a validated config to running listeners (one
//! per address; clusters sharing one are picked by the client's database),
//! each cluster's context with its health loop and background tasks, the
//! metrics endpoint and the admin console, until shutdown; and reloading
//! the config (SIGHUP or the console's `RELOAD`) without dropping clients.
//! It picks a protocol crate per cluster and never knows a wire protocol:
//! the accept loop is `fulcrum_cluster::serve`'s, logins and sessions are
//! the protocol crates'.

#![forbid(unsafe_code)]

pub mod connect_check;
pub mod descriptors;
pub mod import;
mod listeners;
pub mod log_filter;
mod reload;
pub mod systemd;
pub mod upgrade;

use std::sync::{Arc, Mutex};

use fulcrum_cluster::{ClusterAdmin, ProtocolContext};
use fulcrum_config::{Cluster, Config, Protocol};
use fulcrum_metrics::Metrics;
use fulcrum_net::ClientListener;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

pub use listeners::{bind_listener, LISTEN_BACKLOG};

#[derive(Debug, Error)]
pub enum DaemonError {
    #[error("cluster \"{cluster}\": cannot listen on {address}: {source}")]
    Listen {
        cluster: String,
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cluster \"{cluster}\": cannot listen on the Unix socket {}: {source}", path.display())]
    UnixSocket {
        cluster: String,
        path: std::path::PathBuf,
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

/// A cluster's current context, as its listener takes it for each new client.
enum Current {
    Postgres(watch::Sender<Arc<fulcrum_postgres::frontend::ClusterContext>>),
    Mysql(watch::Sender<Arc<fulcrum_mysql::frontend::MyClusterContext>>),
}

impl Current {
    fn postgres(&self) -> Option<&watch::Sender<Arc<fulcrum_postgres::frontend::ClusterContext>>> {
        match self {
            Current::Postgres(tx) => Some(tx),
            Current::Mysql(_) => None,
        }
    }

    fn mysql(&self) -> Option<&watch::Sender<Arc<fulcrum_mysql::frontend::MyClusterContext>>> {
        match self {
            Current::Mysql(tx) => Some(tx),
            Current::Postgres(_) => None,
        }
    }

    /// New clients take `next`'s context from now on (a reload's, or an
    /// upgrade's fresh one); `next` is of the same protocol.
    fn replace_with(&self, next: Current) {
        match (self, next) {
            (Current::Postgres(tx), Current::Postgres(n)) => {
                tx.send_replace(n.borrow().clone());
            }
            (Current::Mysql(tx), Current::Mysql(n)) => {
                tx.send_replace(n.borrow().clone());
            }
            _ => unreachable!("same protocol"),
        }
    }
}

/// What a reload works on.
struct Live {
    /// The configuration in effect: the file's, except the settings only a
    /// restart changes, which keep their values from the start.
    config: Config,
    /// `SET log` and a reload's new `log`.
    set_log: fulcrum_admin::SetLog,
    clusters: Vec<(Cluster, Current)>,
    admin_list: Arc<Mutex<Vec<Arc<dyn ClusterAdmin>>>>,
    admin_config: Arc<Mutex<Config>>,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
    /// Each listener's `client_login_timeout` at start, by its first
    /// cluster: its sparing of logins at `max_pending_logins` keeps it.
    login_timeouts: Vec<(String, std::time::Duration)>,
    /// Turns the daemon's shutdown on (after an upgrade's hand-over).
    stop: watch::Sender<bool>,
    /// The listening sockets an upgrade hands over.
    sockets: upgrade::Sockets,
    /// An upgrade handed them over: this process no longer accepts.
    handed_over: bool,
    /// SHOW UPGRADE's rows.
    upgrades: fulcrum_admin::UpgradeLog,
}

/// A new context for `cluster` with its health loop running; registered
/// with metrics. Returns it for the admin console and the listener.
/// A cluster's context; `earlier`, the running one a reload replaces, hands
/// over first (its health loop stops before this one's starts: one health
/// loop per cluster, and its clients follow the new one's routing state).
fn context(
    cluster: Cluster,
    config: &Config,
    metrics: &Arc<Metrics>,
    shutdown: &watch::Receiver<bool>,
    earlier: Option<&Current>,
) -> (Arc<dyn ClusterAdmin>, Current) {
    let slow = config.fulcrum.slow_query_threshold;
    match cluster.protocol {
        Protocol::Postgres => {
            let earlier_ctx = earlier
                .and_then(Current::postgres)
                .map(|tx| tx.borrow().clone());
            let ctx = fulcrum_postgres::frontend::ClusterContext::after(
                cluster,
                metrics.clone(),
                slow,
                earlier_ctx.as_deref(),
            );
            let tx = start(
                ctx.clone(),
                earlier.and_then(Current::postgres),
                metrics,
                shutdown,
            );
            (ctx, Current::Postgres(tx))
        }
        Protocol::Mysql => {
            let earlier_ctx = earlier
                .and_then(Current::mysql)
                .map(|tx| tx.borrow().clone());
            let ctx = fulcrum_mysql::frontend::MyClusterContext::after(
                cluster,
                metrics.clone(),
                slow,
                earlier_ctx.as_deref(),
            );
            let tx = start(
                ctx.clone(),
                earlier.and_then(Current::mysql),
                metrics,
                shutdown,
            );
            (ctx, Current::Mysql(tx))
        }
    }
}

/// Starts `ctx`, a cluster's new context: `earlier` (the one a reload
/// replaces) hands over first, then it is registered with metrics and its
/// health loop, pool upkeep, function and relation lookups and the cache's
/// change streams start. Returns the channel its listener takes it from.
fn start<X: ProtocolContext + fulcrum_metrics::Source>(
    ctx: Arc<X>,
    earlier: Option<&watch::Sender<Arc<X>>>,
    metrics: &Arc<Metrics>,
    shutdown: &watch::Receiver<bool>,
) -> watch::Sender<Arc<X>> {
    if let Some(tx) = earlier {
        ctx.core().take_over(tx.borrow().core());
    }
    metrics.set_source(&ctx.core().config.name, ctx.clone());
    ctx.start_health(shutdown.clone());
    ctx.start_pool_upkeep();
    ctx.start_function_lookups();
    ctx.start_relation_lookups();
    ctx.start_change_streams();
    watch::channel(ctx).0
}

/// Serves `listener` for the clusters `on` it (those `pick` finds: config
/// validation keeps one protocol per address) until shutdown.
fn listen<X: fulcrum_cluster::serve::Frontend>(
    on: &[&Current],
    pick: impl Fn(&Current) -> Option<&watch::Sender<Arc<X>>>,
    listener: ClientListener,
    shutdown: &watch::Receiver<bool>,
    drain: std::time::Duration,
) -> tokio::task::JoinHandle<()> {
    let current: Vec<_> = on
        .iter()
        .filter_map(|c| pick(c))
        .map(|tx| tx.subscribe())
        .collect();
    // Before the listener runs: a client handed over at once is kept.
    let names: Vec<String> = current
        .iter()
        .map(|c| c.borrow().core().config.name.clone())
        .collect();
    let arrivals = fulcrum_cluster::handover::inbox(&names);
    tokio::spawn(fulcrum_cluster::serve::serve(
        current,
        listener,
        arrivals,
        shutdown.clone(),
        drain,
    ))
}

/// A backend reached over a network (not loopback, not a Unix socket)
/// whose certificate is not verified: whoever sits in between could be the
/// server, so say so at start (passwords still only go over verified links,
/// see `server_cleartext`).
fn warn_unverified_backends(config: &Config) {
    for cluster in &config.clusters {
        for b in &cluster.backends {
            if !fulcrum_config::local_link(&b.address) && !b.tls.mode.verifies() {
                tracing::warn!(
                    cluster = %cluster.name,
                    backend = %b.address,
                    server_tls = ?b.tls.mode,
                    "a backend over the network whose certificate is not verified: set server_tls = \"verify-ca\" or \"verify-full\""
                );
            }
        }
    }
}

/// [`run_logging`] for a process whose log filter is the file's `log`.
pub async fn run(
    config: Config,
    outside: watch::Receiver<bool>,
    set_log: fulcrum_admin::SetLog,
) -> Result<(), DaemonError> {
    let running = config.fulcrum.log.clone();
    run_logging(config, outside, set_log, running).await
}

/// Binds every listener and serves until `outside` (or the console's
/// SHUTDOWN) turns true. `set_log` changes the log filter (`SET log`, a
/// reload's new `log`); `log` is the filter the process started with
/// (`FULCRUM_LOG`'s when set), which SHOW CONFIG shows until it changes.
pub async fn run_logging(
    config: Config,
    outside: watch::Receiver<bool>,
    set_log: fulcrum_admin::SetLog,
    log: String,
) -> Result<(), DaemonError> {
    fulcrum_net::dns::set_max_ttl(config.fulcrum.dns_max_ttl);
    // The daemon's own shutdown: turned on by the caller's (signals) or by
    // the console's SHUTDOWN.
    let (stop, shutdown) = watch::channel(false);
    {
        let (stop, mut outside) = (stop.clone(), outside);
        tokio::spawn(async move {
            loop {
                if *outside.borrow() {
                    let _ = stop.send(true);
                    return;
                }
                if outside.changed().await.is_err() {
                    return;
                }
            }
        });
    }
    // Every listener is bound before any cluster's: once a client can
    // connect, the console and /metrics are there too.
    let admin_listener = match config.fulcrum.admin {
        Some(address) => Some(
            control_listener(address, upgrade::successor::admin(address))
                .await
                .map_err(|source| DaemonError::Admin { address, source })?,
        ),
        None => None,
    };
    let metrics_listener = match config.fulcrum.metrics {
        Some(address) => Some(
            control_listener(address, upgrade::successor::metrics(address))
                .await
                .map_err(|source| DaemonError::Metrics { address, source })?,
        ),
        None => None,
    };
    // One listener per address (and its Unix socket): clusters sharing
    // one are served by it, the client's database picking the cluster.
    let listeners = listeners::bind_all(&config)?;
    let mut sockets = listeners::handed_sockets(&config, &listeners);
    for (socket, listener, address) in [
        (
            upgrade::wire::Socket::Admin as fn(_) -> _,
            &admin_listener,
            config.fulcrum.admin,
        ),
        (
            upgrade::wire::Socket::Metrics,
            &metrics_listener,
            config.fulcrum.metrics,
        ),
    ] {
        if let (Some(l), Some(a)) = (listener, address) {
            if let Ok(fd) = std::os::fd::AsFd::as_fd(l).try_clone_to_owned() {
                sockets.push((socket(a), fd));
            }
        }
    }
    warn_unverified_backends(&config);
    let metrics = Arc::new(Metrics::new());
    // `fulcrum_clients{cluster,user,state}` from the client registry, at scrape time.
    metrics.set_source("\0clients", Arc::new(ClientsByUser));
    let mut tasks = Vec::new();
    // Filled below as the clusters start; /ready reads it.
    let admin_list: Arc<Mutex<Vec<Arc<dyn ClusterAdmin>>>> = Arc::default();
    // The console's data: served on its own listener (when `admin` is
    // set) and, as JSON and the status page, on the metrics port.
    // Its `fulcrum.log` is the filter running now: `set_log` records each
    // change there (SHOW CONFIG reads it).
    let admin_config = Arc::new(Mutex::new(Config {
        fulcrum: fulcrum_config::Global {
            log,
            ..config.fulcrum.clone()
        },
        ..config.clone()
    }));
    let set_log = log_filter::recording(set_log, admin_config.clone());
    let (reload_tx, reload_rx) = mpsc::channel(4);
    let (upgrade_tx, upgrade_rx) = mpsc::channel(1);
    let upgrades = fulcrum_admin::UpgradeLog::default();
    let admin = Arc::new(fulcrum_admin::Admin {
        config: admin_config.clone(),
        clusters: admin_list.clone(),
        metrics: metrics.clone(),
        set_log: set_log.clone(),
        reload: Some(reload_tx.clone()),
        upgrade: Some(upgrade_tx.clone()),
        upgrades: upgrades.clone(),
        shutdown: Some(stop.clone()),
    });
    if let Some(listener) = metrics_listener {
        tracing::info!(listen = ?config.fulcrum.metrics, "serving /metrics, /healthz, /ready");
        let readiness = Arc::new(Readiness {
            clusters: admin_list.clone(),
            shutdown: shutdown.clone(),
        });
        tasks.push(tokio::spawn(fulcrum_metrics::http::serve(
            listener,
            metrics.clone(),
            readiness,
            Some(Arc::new(StatusPage(admin.clone()))),
            shutdown.clone(),
        )));
    }
    let mut admin_clusters: Vec<Arc<dyn ClusterAdmin>> = Vec::new();
    let mut live_clusters = Vec::new();
    for cluster in &config.clusters {
        tracing::info!(
            cluster = %cluster.name,
            listen = %cluster.listen,
            backends = cluster.backends.len(),
            pool_mode = ?cluster.pool_mode,
            databases = cluster.databases.len(),
            "listening"
        );
        let (admin, current) = context(cluster.clone(), &config, &metrics, &shutdown, None);
        admin_clusters.push(admin);
        live_clusters.push((cluster.clone(), current));
    }
    let drain = config.fulcrum.shutdown_timeout;
    let login_timeouts = listeners
        .iter()
        .map(|(members, _)| {
            let first = &config.clusters[members[0]];
            (first.name.clone(), first.client_login_timeout)
        })
        .collect();
    for (members, listener) in listeners {
        let on: Vec<&Current> = members.iter().map(|&i| &live_clusters[i].1).collect();
        // Config validation keeps one protocol per address.
        let task = match on[0] {
            Current::Postgres(_) => listen(&on, Current::postgres, listener, &shutdown, drain),
            Current::Mysql(_) => listen(&on, Current::mysql, listener, &shutdown, drain),
        };
        tasks.push(task);
    }
    *admin_list.lock().unwrap_or_else(|e| e.into_inner()) = admin_clusters;
    if config.fulcrum.metrics.is_some() {
        // The status page's charts: each cluster's totals sampled every
        // 5 s (the first now, its series all made), the last 10 minutes
        // kept in a fixed ring per cluster.
        tokio::spawn(fulcrum_metrics::history::sample_every(
            metrics.clone(),
            shutdown.clone(),
        ));
    }
    if let Some(listener) = admin_listener {
        tracing::info!(listen = ?config.fulcrum.admin, "admin console");
        tokio::spawn(fulcrum_admin::serve(listener, admin, shutdown.clone()));
    }
    let upgrade_metrics = metrics.clone();
    let live = Live {
        config,
        set_log,
        clusters: live_clusters,
        admin_list,
        admin_config,
        metrics,
        shutdown: shutdown.clone(),
        login_timeouts,
        stop: stop.clone(),
        sockets,
        handed_over: false,
        upgrades: upgrades.clone(),
    };
    let cluster_count = live.clusters.len();
    use tokio::signal::unix::{signal, SignalKind};
    let signals = reload::Signals {
        hup: signal(SignalKind::hangup()).ok(),
        usr2: signal(SignalKind::user_defined2()).ok(),
    };
    tokio::spawn(reload::reloads(
        live,
        reload::Requests {
            reload: reload_rx,
            upgrade: upgrade_rx,
            _keep: (reload_tx, upgrade_tx),
        },
        signals,
    ));
    // Every listener is open and serving: tell systemd (Type=notify), and
    // tell it again when draining starts.
    systemd::notify(&format!(
        "READY=1\nSTATUS=serving {cluster_count} cluster(s)"
    ));
    // An upgrade's new process: the old one stops accepting now.
    upgrade::successor::ready(&upgrades, &upgrade_metrics);
    let mut draining = shutdown.clone();
    tokio::spawn(async move {
        while draining.changed().await.is_ok() {
            if *draining.borrow() {
                systemd::notify(
                    "STOPPING=1\nSTATUS=draining: waiting for transactions in progress",
                );
                return;
            }
        }
    });
    for t in tasks {
        let _ = t.await;
    }
    Ok(())
}

/// The console's or metrics' listener on `address`: the one an upgrade
/// handed over (`inherited`), else a new one.
async fn control_listener(
    address: std::net::SocketAddr,
    inherited: Option<std::net::TcpListener>,
) -> std::io::Result<TcpListener> {
    match inherited {
        Some(l) => {
            l.set_nonblocking(true)?;
            TcpListener::from_std(l)
        }
        None => TcpListener::bind(address).await,
    }
}

/// The status page and `/api/v1` over the console's tables, behind
/// `[fulcrum] status_key` (read at each request: a reload applies it).
struct StatusPage(Arc<fulcrum_admin::Admin>);

impl fulcrum_metrics::http::Status for StatusPage {
    fn key(&self) -> Option<String> {
        let config = self.0.config.lock().unwrap_or_else(|e| e.into_inner());
        config.fulcrum.status_key.as_ref().map(|k| k.0.clone())
    }
    fn page(&self) -> &'static str {
        fulcrum_admin::STATUS_PAGE
    }
    fn api(&self, table: &str) -> Option<String> {
        self.0.api_json(table)
    }
}

/// `/ready`: every cluster has a write target, and Fulcrum is not draining
/// for shutdown (a load balancer in front of several Fulcrums stops sending
/// new clients here first).
struct Readiness {
    clusters: Arc<Mutex<Vec<Arc<dyn ClusterAdmin>>>>,
    shutdown: watch::Receiver<bool>,
}

impl fulcrum_metrics::http::Readiness for Readiness {
    fn not_ready(&self) -> Option<String> {
        if *self.shutdown.borrow() {
            return Some("shutting down".into());
        }
        let clusters = self.clusters.lock().unwrap_or_else(|e| e.into_inner());
        if clusters.is_empty() {
            return Some("starting".into());
        }
        let missing: Vec<String> = clusters
            .iter()
            .filter(|c| c.router().primary().is_none())
            .map(|c| {
                let cut_off = if c.router().primary_expired() {
                    " (cut off from its coordinator)"
                } else {
                    ""
                };
                format!(
                    "cluster \"{}\" has no write target{cut_off}",
                    c.config().name
                )
            })
            .collect();
        (!missing.is_empty()).then(|| missing.join("; "))
    }
}

/// Fills `fulcrum_clients` from the process-wide client registry when
/// Prometheus scrapes (nothing on the data path).
struct ClientsByUser;

impl fulcrum_metrics::Source for ClientsByUser {
    fn refresh(&self, metrics: &Metrics) {
        let mut counts: std::collections::HashMap<(Arc<str>, Arc<str>, &'static str), i64> =
            std::collections::HashMap::new();
        for c in fulcrum_cluster::clients::registry().snapshot() {
            *counts
                .entry((c.cluster.clone(), c.user.clone(), c.state().as_str()))
                .or_insert(0) += 1;
        }
        for ((cluster, user, state), n) in counts {
            metrics
                .clients_by_user
                .with_label_values(&[&*cluster, &*user, state])
                .set(n);
        }
    }
}
