//! A binary upgrade (SIGUSR2, the console's `UPGRADE`), the running
//! process's side: it starts the binary now at the path it was started
//! from, with the same arguments (the config file as it is now), on a
//! private Unix socket named by `FULCRUM_UPGRADE_FROM`. The new process
//! must pass its config check and greet (`HELLO`) within 30 s; then this
//! process stops its health loops (waiting for a round in progress, so two
//! loops never promote), hands over every listening socket (clients,
//! Unix sockets, console, metrics: no connection attempt is refused at any
//! moment), and waits for `READY`. From then on the new process accepts;
//! this one stops accepting, and each client moves to it at its next
//! transaction boundary with its session (`fulcrum_cluster::handover`);
//! those that cannot (TLS, pinned) stay until they leave (up to
//! `upgrade_timeout`). On any failure before `READY` this process keeps
//! serving (its health loops restarted if they were stopped) and says why.
//! The new process's side is [`successor`]; the wire is [`wire`].

pub mod successor;
pub mod wire;

use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fulcrum_cluster::ProtocolContext;

use crate::{Current, Live};
use wire::Socket;

/// How long the new process has to start, pass its config check and greet.
const GREETING_WAIT: Duration = Duration::from_secs(30);
/// How long it has, once it has the sockets, to start its clusters.
const READY_WAIT: Duration = Duration::from_secs(60);
/// How long a health round in progress may take to end.
const HEALTH_STOP_WAIT: Duration = Duration::from_secs(15);

/// The binary and arguments the daemon was started with.
static STARTED_AS: OnceLock<(PathBuf, Vec<std::ffi::OsString>)> = OnceLock::new();

/// Remembers the binary's path and the arguments, at start: an upgrade
/// starts whatever binary is at that path then.
pub fn remember_start() {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("fulcrum"));
    let _ = STARTED_AS.set((exe, std::env::args_os().skip(1).collect()));
}

/// The listening sockets this process would hand over, as the config names
/// them: dups kept at start (the listeners themselves belong to their
/// accept loops). A `listen` on port 0 is not handed over (the new process
/// binds its own).
pub(crate) type Sockets = Vec<(Socket, OwnedFd)>;

/// Runs one upgrade; the answer for the console (and the log).
pub(crate) async fn upgrade(live: &mut Live) -> Result<String, String> {
    if live.handed_over {
        return Err("this process has already handed its listeners over".into());
    }
    let started = Instant::now();
    let result = hand_over(live).await;
    let outcome = if result.is_ok() {
        "handed_over"
    } else {
        "failed"
    };
    live.metrics.upgrades.with_label_values(&[outcome]).inc();
    let took_ms = started.elapsed().as_millis() as u64;
    let (pid, detail) = match &result {
        Ok(pid) => (
            Some(*pid),
            format!(
                "{} listening socket(s) handed over; {} client(s) move at their next transaction boundary (TLS and pinned ones stay until they leave)",
                live.sockets.len(),
                fulcrum_cluster::clients::registry().snapshot().len()
            ),
        ),
        Err(e) => (None, e.clone()),
    };
    live.upgrades
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(fulcrum_admin::UpgradeEvent {
            event: "upgrade",
            at_unix_ms: now_ms(),
            outcome,
            pid,
            took_ms,
            detail,
        });
    match result {
        Ok(pid) => {
            live.handed_over = true;
            let took = started.elapsed();
            tracing::info!(new_pid = pid, took_ms = took.as_millis() as u64, "upgrade: handed over to process {pid}; this process stops accepting, its clients move there at their next transaction boundary, and it ends when the rest have left (upgrade_timeout {:?})", live.config.fulcrum.upgrade_timeout);
            crate::systemd::notify(&format!(
                "MAINPID={pid}\nREADY=1\nSTATUS=upgraded: process {pid} serves"
            ));
            fulcrum_net::listener::disown_socket_files();
            fulcrum_cluster::serve::hand_over(live.config.fulcrum.upgrade_timeout);
            live.sockets.clear();
            observe_only(live);
            let _ = live.stop.send(true);
            Ok(format!(
                "handed over to process {pid} in {} ms",
                took.as_millis()
            ))
        }
        Err(e) => {
            tracing::error!("upgrade failed, this process keeps serving: {e}");
            Err(e)
        }
    }
}

/// The conversation with the new process; its pid once it serves, when
/// the clients start moving to it (`fulcrum_cluster::handover`).
async fn hand_over(live: &mut Live) -> Result<u32, String> {
    let dir =
        private_dir().map_err(|e| format!("cannot make the upgrade socket's directory: {e}"))?;
    let path = dir.join("upgrade.sock");
    let result = converse(live, &path).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn converse(live: &mut Live, path: &Path) -> Result<u32, String> {
    let listener = UnixListener::bind(path)
        .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    let (exe, args) = STARTED_AS
        .get()
        .cloned()
        .ok_or("the daemon's start was not recorded")?;
    tracing::info!(binary = %exe.display(), "upgrade: starting the new process");
    let mut child = std::process::Command::new(&exe)
        .args(&args)
        .env(wire::ENV, path)
        // Its MySQL clients' connection ids start past this process's, so
        // none takes the id of a client handed over to it.
        .env(
            fulcrum_mysql::frontend::context::CONNECTION_IDS_ENV,
            fulcrum_mysql::frontend::context::successor_connection_ids().to_string(),
        )
        .stdin(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let greeted = tokio::task::spawn_blocking(move || {
        let r = greet(&listener, &mut child);
        (r, child)
    })
    .await
    .map_err(|e| format!("upgrade task: {e}"))?;
    let (greeted, mut child) = greeted;
    let (stream, mut reader, pid) = match greeted {
        Ok(g) => g,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    // From here the new process's health loops will be the only ones.
    stop_health(live).await;
    let (names, fds): (Vec<Socket>, Vec<_>) = live
        .sockets
        .iter()
        .map(|(n, f)| (n.clone(), f.as_fd()))
        .unzip();
    let sent = wire::send_sockets(&stream, &names, &fds)
        .map_err(|e| format!("cannot hand the sockets over: {e}"));
    let ready = match sent {
        Ok(()) => tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(_) if line.trim() == "READY" => Ok(()),
                Ok(0) => Err("the new process ended before it served".to_string()),
                Ok(_) => Err(format!("the new process said {:?}", line.trim())),
                Err(e) => Err(format!(
                    "no READY from the new process in {READY_WAIT:?}: {e}"
                )),
            }
        })
        .await
        .map_err(|e| format!("upgrade task: {e}"))
        .and_then(|r| r),
        Err(e) => Err(e),
    };
    // Reaped by whoever is its parent once this process exits; a failed
    // one is ended now.
    match ready {
        Ok(()) => {
            // The same socket carries the clients from now on, and back
            // the cancel requests for those that stay here.
            forward_cancels_here(live);
            fulcrum_cluster::handover::open(stream);
            Ok(pid)
        }
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            restart_health(live);
            Err(e)
        }
    }
}

/// A cancel request the new process forwards (a key it does not know) is
/// carried out here by the cluster whose client has the key: one that
/// stayed (TLS, pinned) gets its Ctrl-C as before the upgrade.
fn forward_cancels_here(live: &Live) {
    let postgres: Vec<_> = live
        .clusters
        .iter()
        .filter_map(|(_, c)| c.postgres().map(|tx| tx.subscribe()))
        .collect();
    let runtime = tokio::runtime::Handle::current();
    fulcrum_cluster::handover::on_cancel(move |protocol, pid, secret| {
        if protocol != "postgres" {
            return;
        }
        let clusters: Vec<_> = postgres.iter().map(|rx| rx.borrow().clone()).collect();
        runtime.spawn(async move {
            fulcrum_postgres::frontend::cancel::answer(&clusters, pid as i32, secret as i32).await;
        });
    });
}

/// Waits for the new process to connect and greet; a process that exits
/// first (a config error exits 2) is named with its status.
fn greet(
    listener: &UnixListener,
    child: &mut std::process::Child,
) -> Result<(UnixStream, BufReader<UnixStream>, u32), String> {
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + GREETING_WAIT;
    let stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(format!("accept: {e}")),
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("the new process exited ({status}) before taking over; its log lines say why (a config error exits 2)"));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the new process did not greet within {GREETING_WAIT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let fail = |e: std::io::Error| e.to_string();
    stream.set_nonblocking(false).map_err(fail)?;
    stream.set_read_timeout(Some(READY_WAIT)).map_err(fail)?;
    let mut reader = BufReader::new(stream.try_clone().map_err(fail)?);
    let mut line = String::new();
    reader
        .read_line(&mut line)
        .map_err(|e| format!("no greeting: {e}"))?;
    let pid = line
        .trim()
        .strip_prefix("HELLO ")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("the new process said {:?}", line.trim()))?;
    Ok((stream, reader, pid))
}

/// Restarts the health loops an upgrade stopped before it failed: each
/// cluster gets a fresh context, as a reload gives it.
fn restart_health(live: &mut Live) {
    let shutdown = live.shutdown.clone();
    fresh_contexts(live, &shutdown, |c| c);
    tracing::info!("upgrade: health loops restarted");
}

/// After the hand-over, the clients still on this process route by health
/// loops that only observe (`failover = "follow"`, `topology = "probe"`):
/// a failover the new process makes reaches them, and this process never
/// promotes. They run until the process exits (the daemon's shutdown,
/// which the hand-over turns on, does not stop them).
fn observe_only(live: &mut Live) {
    static FOREVER: OnceLock<tokio::sync::watch::Sender<bool>> = OnceLock::new();
    let never = FOREVER
        .get_or_init(|| tokio::sync::watch::channel(false).0)
        .subscribe();
    fresh_contexts(live, &never, |mut c| {
        c.health.failover = fulcrum_config::Failover::Follow;
        c.topology = fulcrum_config::Topology::Probe;
        c
    });
}

/// Gives each cluster a fresh context (its health loop stopped by `until`),
/// made from its config as `adjust` changes it; the running one's router
/// follows it, so connected clients route by the new loop.
fn fresh_contexts(
    live: &mut Live,
    until: &tokio::sync::watch::Receiver<bool>,
    adjust: impl Fn(fulcrum_config::Cluster) -> fulcrum_config::Cluster,
) {
    for (cluster, current) in live.clusters.iter_mut() {
        let (_, next) = crate::context(
            adjust(cluster.clone()),
            &live.config,
            &live.metrics,
            until,
            Some(current),
        );
        current.replace_with(next);
    }
}

/// Stops every cluster's health loop, each waiting for its round in
/// progress.
async fn stop_health(live: &Live) {
    for (cluster, current) in &live.clusters {
        let ended = match current {
            Current::Postgres(tx) => {
                let ctx = tx.borrow().clone();
                ctx.core().stop_health(HEALTH_STOP_WAIT).await
            }
            Current::Mysql(tx) => {
                let ctx = tx.borrow().clone();
                ctx.core().stop_health(HEALTH_STOP_WAIT).await
            }
        };
        if !ended {
            tracing::warn!(cluster = %cluster.name, "upgrade: a health round did not end in {HEALTH_STOP_WAIT:?}");
        }
    }
}

/// Now, for SHOW UPGRADE.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A directory only this user can enter, for the upgrade socket.
fn private_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!("fulcrum-upgrade-{}-{nanos}", std::process::id()));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}
