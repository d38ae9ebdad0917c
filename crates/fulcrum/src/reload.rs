//! Reloading the config (SIGHUP or the console's `RELOAD`): what a reload
//! applies on the spot (each running cluster's new context, the log
//! filter), and what only a restart changes: those keep their running
//! values, and are said in the answer, in a warning and in
//! `fulcrum_reload_pending_restart` until the file and the process agree.
//! The comparison of two configs ([`keep_restart_only`]) is pure.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fulcrum_cluster::ClusterAdmin;
use fulcrum_config::Config;
use tokio::sync::{mpsc, oneshot};

use crate::{context, log_filter, systemd, Current, Live};

/// The console's requests: RELOAD and UPGRADE.
pub(crate) struct Requests {
    pub reload: mpsc::Receiver<fulcrum_admin::ReloadRequest>,
    pub upgrade: mpsc::Receiver<fulcrum_admin::ReloadRequest>,
    /// Senders kept so the channels stay open without a console.
    pub _keep: (
        mpsc::Sender<fulcrum_admin::ReloadRequest>,
        mpsc::Sender<fulcrum_admin::ReloadRequest>,
    ),
}

/// The handlers of SIGHUP (reload) and SIGUSR2 (upgrade), installed before
/// READY is told, so such a signal right after it is served rather than
/// ending the process.
pub(crate) struct Signals {
    pub hup: Option<tokio::signal::unix::Signal>,
    pub usr2: Option<tokio::signal::unix::Signal>,
}

/// What the loop was asked to do, and whom to answer.
enum Asked {
    Reload(Option<oneshot::Sender<Result<String, String>>>),
    Upgrade(Option<oneshot::Sender<Result<String, String>>>),
}

async fn recv_signal(signal: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match signal.as_mut() {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// Serves reloads (the console's RELOAD, SIGHUP) and upgrades (UPGRADE,
/// SIGUSR2), one at a time, until shutdown.
pub(crate) async fn reloads(mut live: Live, mut requests: Requests, mut signals: Signals) {
    let mut shutdown = live.shutdown.clone();
    loop {
        let asked = tokio::select! {
            Some(reply) = requests.reload.recv() => Asked::Reload(Some(reply)),
            Some(reply) = requests.upgrade.recv() => Asked::Upgrade(Some(reply)),
            Some(()) = recv_signal(&mut signals.hup) => {
                tracing::info!("SIGHUP: reloading {}", live.config.source.display());
                Asked::Reload(None)
            }
            Some(()) = recv_signal(&mut signals.usr2) => {
                tracing::info!("SIGUSR2: upgrading");
                Asked::Upgrade(None)
            }
            _ = shutdown.changed() => return,
        };
        let (result, reply) = match asked {
            Asked::Upgrade(reply) => (crate::upgrade::upgrade(&mut live).await, reply),
            Asked::Reload(reply) => {
                let source = live.config.source.clone();
                systemd::notify("RELOADING=1");
                let result = reload(&mut live, &source);
                match &result {
                    Ok(summary) => tracing::info!("config reloaded: {summary}"),
                    Err(e) => tracing::error!("config not reloaded, the running config stays: {e}"),
                }
                match &result {
                    Ok(_) => systemd::notify("READY=1\nSTATUS=config reloaded"),
                    Err(_) => {
                        systemd::notify("READY=1\nSTATUS=reload failed, the running config stays")
                    }
                }
                (result, reply)
            }
        };
        if let Some(reply) = reply {
            let _ = reply.send(result);
        }
    }
}

/// Reads the file again and applies what can change while running: each
/// cluster whose name, protocol and listen address are unchanged gets a new
/// context (backends, weights, policies, pool sizes, users, health); new
/// clients use it, connected ones finish on the old one. The rest needs a
/// restart and is reported.
fn reload(live: &mut Live, source: &Path) -> Result<String, String> {
    let mut new = fulcrum_config::load(source).map_err(|e| e.to_string())?;
    // What only a restart changes keeps its running value (SHOW CONFIG
    // shows what is in effect), and is reported until the file and the
    // process agree again.
    let pending = keep_restart_only(&live.config, &mut new, &live.login_timeouts);
    let slow_changed = new.fulcrum.slow_query_threshold != live.config.fulcrum.slow_query_threshold;
    let mut notes = Vec::new();
    if new.fulcrum.dns_max_ttl != live.config.fulcrum.dns_max_ttl {
        fulcrum_net::dns::set_max_ttl(new.fulcrum.dns_max_ttl);
        notes.push(format!("dns_max_ttl = {:?}", new.fulcrum.dns_max_ttl));
    }
    // `live.config.fulcrum.log` is the file's last value: a file that
    // changes it applies it (over a `SET log`); one that does not leaves
    // the running filter alone.
    if new.fulcrum.log != live.config.fulcrum.log {
        if log_filter::from_env()?.is_some() {
            notes.push(format!(
                "log: {} is set and wins over the file",
                log_filter::ENV
            ));
        } else {
            (live.set_log)(&new.fulcrum.log)?;
            notes.push(format!("log = {:?}", new.fulcrum.log));
        }
    }
    let mut applied = Vec::new();
    let mut admin_list: Vec<Arc<dyn ClusterAdmin>> = Vec::new();
    for (old, current) in live.clusters.iter_mut() {
        let fresh = new.clusters.iter().find(|c| c.name == old.name);
        let Some(fresh) = fresh.filter(|f| f.protocol == old.protocol && f.listen == old.listen)
        else {
            // Removed, or moved to another listener: it keeps serving as it
            // is (`keep_restart_only` reported it).
            admin_list.extend(current_admin(current));
            continue;
        };
        if fresh == old && !slow_changed {
            admin_list.extend(current_admin(current));
            continue;
        }
        let (admin, next) = context(
            fresh.clone(),
            &new,
            &live.metrics,
            &live.shutdown,
            Some(current),
        );
        current.replace_with(next);
        admin_list.push(admin);
        *old = fresh.clone();
        applied.push(old.name.clone());
    }
    *live.admin_list.lock().unwrap_or_else(|e| e.into_inner()) = admin_list;
    // The running clusters, as they run (a new one is not among them); the
    // log filter is the one running (`set_log` keeps it there).
    let running: Vec<_> = live.clusters.iter().map(|(c, _)| c.clone()).collect();
    {
        let mut shown = live.admin_config.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = new.clone();
        next.clusters = running.clone();
        next.fulcrum.log = std::mem::take(&mut shown.fulcrum.log);
        *shown = next;
    }
    live.config = new;
    live.config.clusters = running;
    live.metrics
        .reload_pending_restart
        .set(pending.len() as i64);
    if !pending.is_empty() {
        tracing::warn!(changes = %pending.join("; "), "reload: these changes need a restart; until then the running values stay (a new cluster is not served, a removed one still is)");
    }
    Ok(format!(
        "applied to {}{}; needs a restart: {}",
        if applied.is_empty() {
            "no cluster (nothing changed)".to_string()
        } else {
            applied.join(", ")
        },
        if notes.is_empty() {
            String::new()
        } else {
            format!(" and {}", notes.join(", "))
        },
        if pending.is_empty() {
            "nothing".to_string()
        } else {
            pending.join("; ")
        }
    ))
}

/// What only a restart changes: where `new` differs from `running`, `new`
/// takes the running value, and the difference is listed
/// (`key (running value; the file says new value)`). That is the process's
/// listeners and threads, each listener's limits, and the set of clusters
/// with their `protocol` and `listen` (a listener is bound, and its
/// clusters fixed, at start: a cluster added, removed or moved is listed;
/// the caller keeps running it as it is). `login_timeouts` are each listener's
/// `client_login_timeout` at start (its first cluster's): the login time
/// limit itself follows a reload, the sparing of logins in progress at
/// `max_pending_logins` (a third of it) does not.
pub(crate) fn keep_restart_only(
    running: &Config,
    new: &mut Config,
    login_timeouts: &[(String, Duration)],
) -> Vec<String> {
    let mut pending = Vec::new();
    let (r, n) = (&running.fulcrum, &mut new.fulcrum);
    macro_rules! keep {
        ($field:ident, $name:expr) => {
            if r.$field != n.$field {
                pending.push(format!(
                    "{} (running {:?}; the file says {:?})",
                    $name, r.$field, n.$field
                ));
                n.$field = r.$field.clone();
            }
        };
    }
    keep!(admin, "fulcrum.admin");
    keep!(metrics, "fulcrum.metrics");
    keep!(workers, "fulcrum.workers");
    keep!(log_format, "fulcrum.log_format");
    keep!(shutdown_timeout, "fulcrum.shutdown_timeout");
    keep!(upgrade_timeout, "fulcrum.upgrade_timeout");
    for old in &running.clusters {
        let Some(c) = new.clusters.iter().find(|c| c.name == old.name) else {
            pending.push(format!(
                "cluster {} (removed from the file; it serves on {} until a restart)",
                old.name, old.listen
            ));
            continue;
        };
        if c.protocol != old.protocol || c.listen != old.listen {
            pending.push(format!(
                "{}.protocol and listen (running {:?} on {}; the file says {:?} on {}; none of the cluster's changes apply until a restart)",
                c.name, old.protocol, old.listen, c.protocol, c.listen
            ));
        }
    }
    for c in &new.clusters {
        if !running.clusters.iter().any(|o| o.name == c.name) {
            pending.push(format!(
                "cluster {} (new in the file; a restart starts it on {})",
                c.name, c.listen
            ));
        }
    }
    for c in new.clusters.iter_mut() {
        let Some(old) = running.clusters.iter().find(|o| o.name == c.name) else {
            continue;
        };
        // The listener's Unix socket and limits are set when it starts.
        if old.unix_socket != c.unix_socket {
            pending.push(format!(
                "{}.unix_socket (running {}; the file says {})",
                c.name,
                socket_words(old.unix_socket.as_ref()),
                socket_words(c.unix_socket.as_ref())
            ));
            c.unix_socket = old.unix_socket.clone();
        }
        if old.max_client_connections != c.max_client_connections {
            pending.push(format!(
                "{}.max_client_connections (running {}; the file says {})",
                c.name, old.max_client_connections, c.max_client_connections
            ));
            c.max_client_connections = old.max_client_connections;
        }
        if old.max_pending_logins != c.max_pending_logins {
            pending.push(format!(
                "{}.max_pending_logins (running {}; the file says {})",
                c.name, old.max_pending_logins, c.max_pending_logins
            ));
            c.max_pending_logins = old.max_pending_logins;
        }
        if let Some((_, started)) = login_timeouts.iter().find(|(n, _)| *n == c.name) {
            if *started != c.client_login_timeout {
                pending.push(format!(
                    "{}.client_login_timeout (the login time limit is {:?} from now on; logins in progress are spared at max_pending_logins by the running {:?} until a restart)",
                    c.name, c.client_login_timeout, started
                ));
            }
        }
    }
    pending
}

/// A Unix socket as a reload reports it: its place, mode and group.
fn socket_words(socket: Option<&fulcrum_config::UnixSocket>) -> String {
    let Some(s) = socket else {
        return "none".into();
    };
    let place = match &s.place {
        fulcrum_config::UnixPlace::Dir(d) => format!("unix_socket_dir {}", d.display()),
        fulcrum_config::UnixPlace::File(f) => format!("unix_socket {}", f.display()),
    };
    let group = s
        .group
        .as_ref()
        .map_or(String::new(), |g| format!(", group {}", g.name));
    format!("{place}, mode {:04o}{group}", s.mode)
}

fn current_admin(current: &Current) -> Option<Arc<dyn ClusterAdmin>> {
    Some(match current {
        Current::Postgres(tx) => tx.borrow().clone() as Arc<dyn ClusterAdmin>,
        Current::Mysql(tx) => tx.borrow().clone() as Arc<dyn ClusterAdmin>,
    })
}

#[cfg(test)]
mod tests {
    use super::keep_restart_only;
    use std::time::Duration;

    fn config(clusters: &[(&str, &str)], extra: &str) -> fulcrum_config::Config {
        let mut text = String::from("[fulcrum]\nlog = \"info\"\n");
        for (name, listen) in clusters {
            text.push_str(&format!(
                "\n[[cluster]]\nname = \"{name}\"\nlisten = \"{listen}\"\nprotocol = \"postgres\"\n{extra}\n\
                 [[cluster.backend]]\naddress = \"127.0.0.1:5432\"\nrole = \"primary\"\n\n\
                 [[cluster.user]]\nname = \"app\"\npassword = \"secret\"\n"
            ));
        }
        fulcrum_config::parse(&text, std::path::Path::new("fulcrum.toml")).unwrap()
    }

    #[test]
    fn a_cluster_added_removed_or_moved_needs_a_restart() {
        let running = config(&[("main", "127.0.0.1:6432"), ("old", "127.0.0.1:6433")], "");
        let mut new = config(
            &[("main", "127.0.0.1:7432"), ("fresh", "127.0.0.1:6434")],
            "",
        );
        let pending = keep_restart_only(&running, &mut new, &[]);
        assert_eq!(pending.len(), 3, "{pending:?}");
        assert!(pending[1].starts_with("cluster old (removed from the file"));
        assert!(pending[0].starts_with("main.protocol and listen (running Postgres on 127.0.0.1:6432; the file says Postgres on 127.0.0.1:7432"));
        assert_eq!(
            pending[2],
            "cluster fresh (new in the file; a restart starts it on 127.0.0.1:6434)"
        );
        let mut same = running.clone();
        assert!(keep_restart_only(&running, &mut same, &[]).is_empty());
    }

    #[test]
    fn a_changed_unix_socket_needs_a_restart_and_keeps_running() {
        let running = config(
            &[("main", "127.0.0.1:6432")],
            "unix_socket_dir = \"/run/a\"",
        );
        let mut new = config(
            &[("main", "127.0.0.1:6432")],
            "unix_socket_dir = \"/run/b\"\nunix_socket_mode = \"0770\"",
        );
        let pending = keep_restart_only(&running, &mut new, &[]);
        assert_eq!(
            pending,
            ["main.unix_socket (running unix_socket_dir /run/a, mode 0777; the file says unix_socket_dir /run/b, mode 0770)"]
        );
        assert_eq!(new.clusters[0].unix_socket, running.clusters[0].unix_socket);
        let mut off = config(&[("main", "127.0.0.1:6432")], "");
        let pending = keep_restart_only(&running, &mut off, &[]);
        assert_eq!(pending.len(), 1, "{pending:?}");
        assert!(pending[0].ends_with("the file says none)"), "{pending:?}");
    }

    #[test]
    fn a_new_client_login_timeout_is_reported_for_the_listeners_sparing() {
        let running = config(
            &[("main", "127.0.0.1:6432")],
            "client_login_timeout = \"15s\"",
        );
        let mut new = config(
            &[("main", "127.0.0.1:6432")],
            "client_login_timeout = \"30s\"",
        );
        let started = [("main".to_string(), Duration::from_secs(15))];
        let pending = keep_restart_only(&running, &mut new, &started);
        assert_eq!(pending.len(), 1, "{pending:?}");
        assert!(pending[0].starts_with("main.client_login_timeout (the login time limit is 30s"));
        assert_eq!(
            new.clusters[0].client_login_timeout,
            Duration::from_secs(30),
            "the login time limit is applied"
        );
        // Back to the value the listener started with: nothing pending.
        let mut back = running.clone();
        assert!(keep_restart_only(&new, &mut back, &started).is_empty());
    }
}
