//! The new process's side of an upgrade: when started with
//! `FULCRUM_UPGRADE_FROM`, it has passed its own config check, greets the
//! old process (which stops its health loops), takes its listening
//! sockets, binds its listeners from them (a socket the config no longer
//! names is closed), and says `READY` once it serves, whereupon the old
//! process stops accepting and starts handing its clients over on the same
//! socket (`fulcrum_cluster::handover::receive`, on a thread of its own
//! until the old process exits).

use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use super::wire::{self, Socket};

/// The old process's socket and what it handed over, until `ready`.
struct Taken {
    stream: UnixStream,
    sockets: Vec<(Socket, OwnedFd)>,
    /// How many were handed over, and when this process greeted.
    count: usize,
    since: std::time::Instant,
}

static TAKEN: Mutex<Option<Taken>> = Mutex::new(None);

/// How long the old process has to hand its sockets over.
const HANDOVER_WAIT: Duration = Duration::from_secs(30);

/// Greets the old process named by `FULCRUM_UPGRADE_FROM` and takes its
/// listening sockets (kept for the listeners to bind from). `None` when
/// this process was not started by an upgrade.
pub fn take_over() -> Option<Result<usize, String>> {
    let path = std::env::var_os(wire::ENV)?;
    Some(connect(Path::new(&path)).map(|taken| {
        let n = taken.sockets.len();
        *TAKEN.lock().unwrap_or_else(|e| e.into_inner()) = Some(taken);
        n
    }))
}

fn connect(path: &Path) -> Result<Taken, String> {
    let fail = |what: &str, e: std::io::Error| format!("{what} {}: {e}", path.display());
    let mut stream =
        UnixStream::connect(path).map_err(|e| fail("cannot reach the old process at", e))?;
    stream
        .set_read_timeout(Some(HANDOVER_WAIT))
        .map_err(|e| fail("socket", e))?;
    writeln!(stream, "HELLO {}", std::process::id()).map_err(|e| fail("cannot greet", e))?;
    let since = std::time::Instant::now();
    let sockets = wire::recv_sockets(&stream).map_err(|e| fail("no sockets from", e))?;
    Ok(Taken {
        stream,
        count: sockets.len(),
        sockets,
        since,
    })
}

fn take(matches: impl Fn(&Socket) -> bool) -> Option<OwnedFd> {
    let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
    let sockets = &mut taken.as_mut()?.sockets;
    let at = sockets.iter().position(|(s, _)| matches(s))?;
    Some(sockets.swap_remove(at).1)
}

/// The client listener the old process had on `address`.
pub fn tcp(address: SocketAddr) -> Option<std::net::TcpListener> {
    take(|s| *s == Socket::Tcp(address)).map(std::net::TcpListener::from)
}

/// The admin console's listener the old process had on `address`.
pub fn admin(address: SocketAddr) -> Option<std::net::TcpListener> {
    take(|s| *s == Socket::Admin(address)).map(std::net::TcpListener::from)
}

/// The metrics listener the old process had on `address`.
pub fn metrics(address: SocketAddr) -> Option<std::net::TcpListener> {
    take(|s| *s == Socket::Metrics(address)).map(std::net::TcpListener::from)
}

/// The Unix socket the old process had at `path` beside port `port`.
pub fn unix(port: u16, path: &Path) -> Option<std::os::unix::net::UnixListener> {
    take(|s| matches!(s, Socket::Unix(p, q) if *p == port && q == path))
        .map(std::os::unix::net::UnixListener::from)
}

/// Every listener is bound and every cluster started: tells the old
/// process, which stops accepting and hands its clients over. Sockets the
/// config no longer names are closed here. Records SHOW UPGRADE's row for
/// the take-over, and one for the clients (updated as the old process
/// reports them, with `fulcrum_upgrade_clients`); nothing when this process
/// was not started by an upgrade.
pub fn ready(log: &fulcrum_admin::UpgradeLog, metrics: &fulcrum_metrics::Metrics) {
    let Some(event) = say_ready() else {
        return;
    };
    let serving = event.outcome == "serving";
    let started = std::time::Instant::now();
    let mut rows = log.lock().unwrap_or_else(|e| e.into_inner());
    rows.push(event);
    let stream = TAKEN_STREAM
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    let (Some(stream), true) = (stream, serving) else {
        return;
    };
    let row = rows.len();
    rows.push(clients_row(&Default::default(), 0));
    drop(rows);
    let log = log.clone();
    let gauge = metrics.upgrade_clients.clone();
    let spawned = std::thread::Builder::new()
        .name("fulcrum-handover".into())
        .spawn(move || {
            fulcrum_cluster::handover::receive(stream, |tally| {
                for (state, n) in [
                    ("handed_over", tally.handed_over),
                    ("left_tls", tally.left_tls),
                    ("left_pinned", tally.left_pinned),
                    ("closed", tally.closed),
                ] {
                    gauge.with_label_values(&[state]).set(n as i64);
                }
                let took = started.elapsed().as_millis() as u64;
                if let Some(r) = log.lock().unwrap_or_else(|e| e.into_inner()).get_mut(row) {
                    *r = clients_row(&tally, took);
                }
                tracing::info!(
                    handed_over = tally.handed_over,
                    left_tls = tally.left_tls,
                    left_pinned = tally.left_pinned,
                    closed = tally.closed,
                    "upgrade: clients from the old process"
                );
            })
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "upgrade: cannot take the old process's clients");
    }
}

/// SHOW UPGRADE's row for the clients the old process hands over: the
/// counts so far, and the time from `READY` to the last report.
fn clients_row(t: &fulcrum_cluster::handover::Tally, took_ms: u64) -> fulcrum_admin::UpgradeEvent {
    fulcrum_admin::UpgradeEvent {
        event: "clients",
        at_unix_ms: super::now_ms(),
        outcome: if t.left_tls + t.left_pinned == 0 {
            "moved"
        } else {
            "moving"
        },
        pid: None,
        took_ms,
        detail: format!(
            "{} handed over; left on the old process: {} TLS, {} pinned; {} closed there",
            t.handed_over, t.left_tls, t.left_pinned, t.closed
        ),
    }
}

/// The upgrade socket, kept after `READY` for the clients.
static TAKEN_STREAM: Mutex<Option<UnixStream>> = Mutex::new(None);

/// Writes `READY`; SHOW UPGRADE's row for the take-over.
fn say_ready() -> Option<fulcrum_admin::UpgradeEvent> {
    let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner()).take()?;
    for (socket, _) in &taken.sockets {
        tracing::info!(
            ?socket,
            "upgrade: a socket the old process had is not in this config: closed"
        );
    }
    let outcome = match writeln!(taken.stream, "READY") {
        Ok(()) => {
            tracing::info!(
                "upgrade: serving; the old process stops accepting and hands its clients over"
            );
            *TAKEN_STREAM.lock().unwrap_or_else(|e| e.into_inner()) = taken.stream.try_clone().ok();
            "serving"
        }
        Err(e) => {
            tracing::warn!(error = %e, "upgrade: cannot tell the old process this one serves");
            "failed"
        }
    };
    Some(fulcrum_admin::UpgradeEvent {
        event: "took_over",
        at_unix_ms: super::now_ms(),
        outcome,
        pid: Some(std::process::id()),
        took_ms: taken.since.elapsed().as_millis() as u64,
        detail: format!(
            "{} listening socket(s) from the old process; {} closed (not in this config)",
            taken.count,
            taken.sockets.len()
        ),
    })
}
