//! The new process's side of an upgrade: when started with
//! `FULCRUM_UPGRADE_FROM`, it has passed its own config check, greets the
//! old process (which stops its health loops), takes its listening
//! sockets, binds its listeners from them (a socket the config no longer
//! names is closed), and says `READY` once it serves, whereupon the old
//! process stops accepting.

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
/// process, which stops accepting. Sockets the config no longer names are
/// closed here. Returns SHOW UPGRADE's row for the take-over; nothing when
/// this process was not started by an upgrade.
pub fn ready() -> Option<fulcrum_admin::UpgradeEvent> {
    let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner()).take()?;
    for (socket, _) in &taken.sockets {
        tracing::info!(
            ?socket,
            "upgrade: a socket the old process had is not in this config: closed"
        );
    }
    let outcome = match writeln!(taken.stream, "READY") {
        Ok(()) => {
            tracing::info!("upgrade: serving; the old process stops accepting");
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
