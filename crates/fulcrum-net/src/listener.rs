//! A client listener: its TCP socket and, beside it, an optional Unix-domain
//! socket (PgBouncer's `unix_socket_dir`, MySQL's `socket`), accepted as one
//! stream of clients ([`ClientListener::accept`]), each with who it is
//! ([`ClientPeer`]: its address, or the socket and the peer's uid).
//!
//! It owns the socket file's life: a file left by a crash is replaced only
//! when connecting to it is refused (nobody listens), one another process
//! listens on is an error, anything that is not a socket is never touched;
//! the file is removed when the listener closes, or by
//! [`remove_socket_files`] when the process stops at once, unless an
//! upgrade handed it to the next process ([`disown_socket_files`]; that
//! process adopts the socket with [`UnixSocket::adopt`]). Nothing here
//! knows a wire protocol.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

/// A socket just accepted, by the listener it came in on.
#[derive(Debug)]
pub enum Accepted {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// An [`Accepted`] socket out of its event loop, to hand to another thread's.
#[derive(Debug)]
pub enum StdAccepted {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl Accepted {
    /// The stream type a protocol reads clients through (a TLS-capable
    /// client stream has a variant for each).
    pub fn into_stream<T: From<TcpStream> + From<UnixStream>>(self) -> T {
        match self {
            Accepted::Tcp(s) => T::from(s),
            Accepted::Unix(s) => T::from(s),
        }
    }

    /// Deregistered from this event loop (see [`StdAccepted::into_tokio`]).
    pub fn into_std(self) -> io::Result<StdAccepted> {
        Ok(match self {
            Accepted::Tcp(s) => StdAccepted::Tcp(s.into_std()?),
            Accepted::Unix(s) => StdAccepted::Unix(s.into_std()?),
        })
    }
}

impl StdAccepted {
    /// Registered with the current thread's event loop.
    pub fn into_tokio(self) -> io::Result<Accepted> {
        Ok(match self {
            StdAccepted::Tcp(s) => Accepted::Tcp(TcpStream::from_std(s)?),
            StdAccepted::Unix(s) => Accepted::Unix(UnixStream::from_std(s)?),
        })
    }
}

/// Where a client came from: its TCP address, or the Unix socket it
/// connected to with the peer's credentials (`SO_PEERCRED`), which a
/// `local`/`peer` rule can check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientPeer {
    Tcp(SocketAddr),
    Unix(UnixPeer),
}

/// A client over a Unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnixPeer {
    /// The socket file it connected to.
    pub socket: Arc<Path>,
    /// The TCP port of the listener the socket belongs to (SHOW CLIENTS'
    /// `port`, as PgBouncer shows it for a Unix-socket client).
    pub port: u16,
    /// The peer process's user, group and process id, when the kernel
    /// told them.
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub pid: Option<i32>,
}

impl ClientPeer {
    /// The client's IP address (none over a Unix socket).
    pub fn ip(&self) -> Option<std::net::IpAddr> {
        match self {
            ClientPeer::Tcp(a) => Some(a.ip()),
            ClientPeer::Unix(_) => None,
        }
    }

    pub fn is_unix(&self) -> bool {
        matches!(self, ClientPeer::Unix(_))
    }

    /// The peer's uid, for a client over a Unix socket.
    pub fn uid(&self) -> Option<u32> {
        match self {
            ClientPeer::Unix(u) => u.uid,
            ClientPeer::Tcp(_) => None,
        }
    }
}

impl fmt::Display for ClientPeer {
    /// `10.0.0.5:51234`, or `unix:/run/fulcrum/.s.PGSQL.6432 uid=1000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientPeer::Tcp(a) => a.fmt(f),
            ClientPeer::Unix(u) => {
                write!(f, "unix:{}", u.socket.display())?;
                match u.uid {
                    Some(uid) => write!(f, " uid={uid}"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// A listener's sockets: TCP, and the Unix socket beside it when configured.
#[derive(Debug)]
pub struct ClientListener {
    tcp: TcpListener,
    unix: Option<UnixSocket>,
}

impl ClientListener {
    pub fn new(tcp: TcpListener, unix: Option<UnixSocket>) -> ClientListener {
        ClientListener { tcp, unix }
    }

    pub fn tcp(&self) -> &TcpListener {
        &self.tcp
    }

    pub fn unix(&self) -> Option<&UnixSocket> {
        self.unix.as_ref()
    }

    /// The next client on either socket (cancel safe, as both accepts are).
    pub async fn accept(&self) -> io::Result<(Accepted, ClientPeer)> {
        let tcp = async {
            let (s, a) = self.tcp.accept().await?;
            Ok((Accepted::Tcp(s), ClientPeer::Tcp(a)))
        };
        match &self.unix {
            None => tcp.await,
            Some(unix) => tokio::select! {
                r = tcp => r,
                r = unix.accept() => r,
            },
        }
    }
}

/// A bound Unix-domain socket and its file (removed when this is dropped).
#[derive(Debug)]
pub struct UnixSocket {
    listener: UnixListener,
    file: SocketFile,
    port: u16,
}

impl UnixSocket {
    pub fn path(&self) -> &Path {
        &self.file.path
    }

    /// The listening socket, to hand to the next process on an upgrade.
    pub fn listener_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// A listening socket bound at `path` by the process before this one
    /// (an upgrade handed it over): this process owns its file from now on.
    /// Must be called within a tokio runtime.
    pub fn adopt(
        listener: std::os::unix::net::UnixListener,
        path: &Path,
        port: u16,
    ) -> io::Result<UnixSocket> {
        listener.set_nonblocking(true)?;
        let listener = UnixListener::from_std(listener)?;
        let meta = std::fs::symlink_metadata(path)?;
        let file = SocketFile::new(path.to_path_buf(), meta.dev(), meta.ino());
        Ok(UnixSocket {
            listener,
            file,
            port,
        })
    }

    async fn accept(&self) -> io::Result<(Accepted, ClientPeer)> {
        let (s, _) = self.listener.accept().await?;
        let cred = s.peer_cred().ok();
        let peer = UnixPeer {
            socket: self.file.path.clone(),
            port: self.port,
            uid: cred.map(|c| c.uid()),
            gid: cred.map(|c| c.gid()),
            pid: cred.and_then(|c| c.pid()),
        };
        Ok((Accepted::Unix(s), ClientPeer::Unix(peer)))
    }
}

/// How [`bind_unix`] found the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Nothing was there.
    Nothing,
    /// A socket file nobody listened on (a crash left it): removed.
    Stale,
}

/// Binds a Unix-domain socket at `path` with permissions `mode` and, when
/// given, group `gid` (for the listener whose TCP port is `port`). A socket
/// file already there is replaced only when connecting to it is refused;
/// when a process accepts on it, or the path is not a socket, nothing is
/// touched and the error says so.
pub fn bind_unix(
    path: &Path,
    mode: u32,
    gid: Option<u32>,
    port: u16,
) -> io::Result<(UnixSocket, Found)> {
    let found = clear_stale(path)?;
    let listener = UnixListener::bind(path)?;
    let meta = std::fs::symlink_metadata(path)?;
    // Owned from here: dropped on an error below, it removes the file.
    let file = SocketFile::new(path.to_path_buf(), meta.dev(), meta.ino());
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot set its mode to {mode:04o} (unix_socket_mode): {e}"),
        )
    })?;
    if let Some(gid) = gid {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot give it to group {gid} (unix_socket_group; Fulcrum's user must be a member): {e}"),
            )
        })?;
    }
    Ok((
        UnixSocket {
            listener,
            file,
            port,
        },
        found,
    ))
}

/// Makes way for a new socket at `path`: nothing there, or a socket file
/// nobody listens on (removed). Anything else is an error naming why.
fn clear_stale(path: &Path) -> io::Result<Found> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Found::Nothing),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "the path exists and is not a socket; Fulcrum never removes it: move it away or choose another path",
        ));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            "another process is listening on this socket (another Fulcrum, PgBouncer or database server?)",
        )),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("a stale socket file is there and cannot be removed: {e}"),
                )
            })?;
            Ok(Found::Stale)
        }
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("a socket file is there and whether it is in use cannot be told: {e}"),
        )),
    }
}

/// The socket files this process bound and has not removed yet.
static OPEN: Mutex<Vec<(Arc<Path>, u64, u64)>> = Mutex::new(Vec::new());

/// A socket file this process made, removed on drop if it is still the
/// same file (a newer process may have replaced it while this one drained).
#[derive(Debug)]
struct SocketFile {
    path: Arc<Path>,
    dev: u64,
    ino: u64,
}

impl SocketFile {
    fn new(path: PathBuf, dev: u64, ino: u64) -> SocketFile {
        let path: Arc<Path> = path.into();
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        open.push((path.clone(), dev, ino));
        SocketFile { path, dev, ino }
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|(p, d, i)| !(*p == self.path && *d == self.dev && *i == self.ino));
        if !DISOWNED.load(Ordering::Acquire) {
            remove_if_ours(&self.path, self.dev, self.ino);
        }
    }
}

/// An upgrade handed this process's sockets to the next process: their
/// files are that process's now, and are never removed from here.
static DISOWNED: AtomicBool = AtomicBool::new(false);

/// The next process took this one's listening sockets (an upgrade): from
/// now on no socket file is removed by this process, on drop or exit.
pub fn disown_socket_files() {
    DISOWNED.store(true, Ordering::Release);
    OPEN.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

fn remove_if_ours(path: &Path, dev: u64, ino: u64) {
    let ours = std::fs::symlink_metadata(path).is_ok_and(|m| m.dev() == dev && m.ino() == ino);
    if ours {
        let _ = std::fs::remove_file(path);
    }
}

/// Removes every socket file this process bound and still holds: for an
/// exit that runs no destructors (SIGINT's `process::exit`).
pub fn remove_socket_files() {
    let open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    for (path, dev, ino) in open.iter() {
        remove_if_ours(path, *dev, *ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "fulcrum-net-{name}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir(&dir).unwrap();
        dir
    }

    #[tokio::test]
    async fn a_socket_is_served_with_its_mode_and_removed_when_closed() {
        let dir = scratch("serve");
        let path = dir.join(".s.PGSQL.6432");
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (unix, found) = bind_unix(&path, 0o660, None, 6432).unwrap();
        assert_eq!(found, Found::Nothing);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o660);
        let listener = ClientListener::new(tcp, Some(unix));
        let _client = UnixStream::connect(&path).await.unwrap();
        let (stream, peer) = listener.accept().await.unwrap();
        assert!(matches!(stream, Accepted::Unix(_)));
        let ClientPeer::Unix(u) = &peer else {
            panic!("a Unix peer: {peer:?}")
        };
        assert_eq!((u.port, &*u.socket), (6432, path.as_path()));
        // The test process's own uid, as the kernel reports it.
        let me = std::fs::metadata("/proc/self").unwrap().uid();
        assert_eq!(peer.uid(), Some(me));
        assert!(peer.to_string().starts_with("unix:"), "{peer}");
        drop(listener);
        assert!(!path.exists(), "removed with its listener");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_a_live_one_refused() {
        let dir = scratch("stale");
        let path = dir.join("mysql.sock");
        // A socket file nobody listens on: what a crash leaves.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let (live, found) = bind_unix(&path, 0o777, None, 0).unwrap();
        assert_eq!(found, Found::Stale);
        let err = bind_unix(&path, 0o777, None, 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{err}");
        assert!(path.exists(), "the live socket is left alone");
        drop(live);
        assert!(!path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_file_that_is_not_a_socket_is_never_removed() {
        let dir = scratch("file");
        let path = dir.join(".s.PGSQL.5432");
        std::fs::write(&path, "data").unwrap();
        let err = bind_unix(&path, 0o777, None, 5432).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert!(err.to_string().contains("not a socket"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "data");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_replaced_socket_file_is_not_removed_by_the_old_listener() {
        let dir = scratch("replaced");
        let path = dir.join("s");
        let (old, _) = bind_unix(&path, 0o777, None, 0).unwrap();
        // Another process took the path over (as a new Fulcrum does while
        // this one drains).
        std::fs::remove_file(&path).unwrap();
        let newer = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(old);
        assert!(path.exists(), "the newer socket stays");
        remove_socket_files();
        assert!(path.exists());
        drop(newer);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
