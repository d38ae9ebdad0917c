//! The admin console: a PostgreSQL-protocol listener (`[fulcrum] admin`), so
//! psql is the client, authenticated by `[[fulcrum.admin_user]]` (SCRAM-SHA-256
//! or md5, `admin_auth`; TLS with `[fulcrum]`'s certificate; a `stats_users`
//! login may only SHOW), any database name accepted. PgBouncer's `SHOW`
//! commands with its column names where the concept is the same, plus
//! operator commands (`PAUSE`, `RESUME`, `DISABLE` and `ENABLE` of a backend
//! or a database, `SWITCHOVER`, `RELOAD`, `UPGRADE`, `RECONNECT`,
//! `WAIT_CLOSE`, `KILL`, `SHUTDOWN`, `FLUSH CACHE`, `SHOW QUERIES RESET`,
//! `SET log`; `SHOW UPGRADE` lists the binary upgrades this process took
//! part in and the clients they moved). The parser (`command.rs`) and the
//! row encoding (`rows.rs`) are pure; `session.rs` owns the socket; `execute.rs` runs a
//! command (`pause.rs`: PAUSE and RESUME of every cluster, one cluster, or
//! one database), `show` builds the SHOW tables (`queries.rs` and `stats.rs` the
//! digest, memory and traffic ones); `api.rs` gives the same tables as JSON
//! (`/api/v1` on the metrics port, read by the status page).
//!
//! It sees clusters through `fulcrum_cluster::ClusterAdmin`, clients
//! through the process's client registry (`fulcrum_cluster::clients`: SHOW
//! CLIENTS, POOLS, STATS and MEM, and the commands that act on a database)
//! and server connections as `fulcrum_pool::servers` lists them:
//! it never knows a cluster's protocol beyond its config, nor a client's
//! session beyond its registry row. Its own protocol is PostgreSQL's,
//! from `fulcrum_postgres` (codecs, the TLS start and the password
//! exchange of a login, SCRAM verifiers).

#![forbid(unsafe_code)]

pub mod api;
pub mod command;
mod execute;
mod pause;
mod queries;
mod reason;
pub mod rows;
mod session;
mod show;
mod stats;
mod verifiers;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fulcrum_cluster::ClusterAdmin;
use fulcrum_config::{Config, User};
use fulcrum_metrics::Metrics;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};

/// Changes the log filter (`SET log = '...'`).
pub type SetLog = std::sync::Arc<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// The status page served at `/` on the metrics port (self-contained:
/// its script reads `/api/v1`).
pub const STATUS_PAGE: &str = include_str!("status.html");

/// One line of SHOW UPGRADE: an upgrade this process took part in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradeEvent {
    /// `took_over` (this process was started by an upgrade) or `upgrade`
    /// (it started one).
    pub event: &'static str,
    pub at_unix_ms: u64,
    /// `handed_over`, `failed`, or `serving` for `took_over`.
    pub outcome: &'static str,
    /// The new process's pid (this process's for `took_over`).
    pub pid: Option<u32>,
    pub took_ms: u64,
    /// Sockets handed over, clients left behind, or why it failed.
    pub detail: String,
}

/// What SHOW UPGRADE lists, written by the daemon's upgrade code.
pub type UpgradeLog = Arc<Mutex<Vec<UpgradeEvent>>>;

/// A reload request: the daemon answers with a summary or the config error.
pub type ReloadRequest = oneshot::Sender<Result<String, String>>;

/// What the console shows and acts on. The config and the cluster list are
/// the daemon's, updated by a reload.
pub struct Admin {
    pub config: Arc<Mutex<Config>>,
    pub clusters: Arc<Mutex<Vec<Arc<dyn ClusterAdmin>>>>,
    pub metrics: Arc<Metrics>,
    pub set_log: SetLog,
    pub reload: Option<mpsc::Sender<ReloadRequest>>,
    /// UPGRADE: answered with the hand-over's outcome.
    pub upgrade: Option<mpsc::Sender<ReloadRequest>>,
    /// SHOW UPGRADE's rows.
    pub upgrades: UpgradeLog,
    /// SHUTDOWN: turns the daemon's shutdown on (a drain, as SIGTERM).
    pub shutdown: Option<tokio::sync::watch::Sender<bool>>,
}

impl Admin {
    fn config(&self) -> Config {
        self.config
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn users(&self) -> Vec<User> {
        self.config().fulcrum.admin_users
    }

    /// The console user `name` (if configured), `admin_auth`, and whether
    /// `name` is a stats user (SHOW only), read under the lock: a login
    /// copies no more of the config than that.
    fn login_user(&self, name: &str) -> (Option<User>, fulcrum_config::ClientAuth, bool) {
        let config = self.config.lock().unwrap_or_else(|e| e.into_inner());
        let user = config
            .fulcrum
            .admin_users
            .iter()
            .find(|u| u.name == name)
            .cloned();
        let stats_only = config.fulcrum.stats_users.iter().any(|s| s == name);
        (user, config.fulcrum.admin_auth, stats_only)
    }

    /// The console's TLS (`[fulcrum]`'s `tls_*` keys), if any.
    fn console_tls(&self) -> Option<fulcrum_config::ClientTls> {
        let config = self.config.lock().unwrap_or_else(|e| e.into_inner());
        config.fulcrum.admin_tls.clone()
    }

    fn clusters(&self) -> Vec<Arc<dyn ClusterAdmin>> {
        self.clusters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn cluster(&self, name: &str) -> Option<Arc<dyn ClusterAdmin>> {
        self.clusters()
            .into_iter()
            .find(|c| c.config().name == name)
    }
}

/// When the daemon started (the first call: `serve` makes it at start), from
/// which SHOW STATS' averages count before a stats period has passed.
pub(crate) fn started() -> std::time::Instant {
    static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *STARTED.get_or_init(std::time::Instant::now)
}

/// Console connections open at once; the next gets FATAL 53300.
pub const MAX_CONNECTIONS: usize = 64;
/// Console connections still logging in at once; a new one closes the
/// oldest of them (as `max_pending_logins` does for clients), so idle
/// sockets cannot lock operators out.
pub const MAX_PENDING_LOGINS: usize = 16;

/// Connections still logging in, oldest first, by number.
type Pending = Arc<Mutex<std::collections::VecDeque<(u64, tokio::task::AbortHandle)>>>;

/// Serves the console on `listener` until `shutdown` turns true.
pub async fn serve(listener: TcpListener, admin: Arc<Admin>, mut shutdown: watch::Receiver<bool>) {
    started();
    if admin.users().is_empty() {
        tracing::warn!(
            "admin console: no [[fulcrum.admin_user]] configured; every login will be refused"
        );
    }
    let limit = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let pending: Pending = Arc::default();
    let mut next = 0u64;
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.changed() => return,
        };
        let Ok((mut stream, peer)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let evicted = {
            let mut p = pending.lock().unwrap_or_else(|e| e.into_inner());
            let oldest = (p.len() >= MAX_PENDING_LOGINS)
                .then(|| p.pop_front())
                .flatten();
            oldest.map(|(_, task)| task.abort()).is_some()
        };
        // An evicted connection's permit comes back as its task ends.
        let wait = if evicted {
            Duration::from_millis(500)
        } else {
            Duration::ZERO
        };
        let permit = match limit.clone().try_acquire_owned() {
            Ok(p) => Ok(p),
            Err(_) if evicted => tokio::time::timeout(wait, limit.clone().acquire_owned())
                .await
                .map_err(|_| ())
                .and_then(|p| p.map_err(|_| ())),
            Err(_) => Err(()),
        };
        let Ok(permit) = permit else {
            tokio::spawn(async move {
                let mut out = bytes::BytesMut::new();
                let msg = format!(
                    "fulcrum admin: too many console connections (at most {MAX_CONNECTIONS})"
                );
                fulcrum_postgres::codec::backend_msg::error_response(
                    &mut out, "FATAL", "53300", &msg,
                );
                let _ = tokio::io::AsyncWriteExt::write_all(&mut stream, &out).await;
            });
            continue;
        };
        let admin = admin.clone();
        let id = next;
        next += 1;
        let done = pending.clone();
        // Held while the task is spawned and listed: its removal at login
        // always finds it listed.
        let mut listed = pending.lock().unwrap_or_else(|e| e.into_inner());
        let task = tokio::spawn(async move {
            let _permit = permit;
            let logged_in = || {
                let mut p = done.lock().unwrap_or_else(|e| e.into_inner());
                p.retain(|(i, _)| *i != id);
            };
            if let Err(e) = session::run(stream, &admin, logged_in).await {
                tracing::debug!(%peer, error = %e, "admin session ended");
            }
            let mut p = done.lock().unwrap_or_else(|e| e.into_inner());
            p.retain(|(i, _)| *i != id);
        });
        listed.push_back((id, task.abort_handle()));
    }
}
