//! The server connections the pools hold, one entry per connection, for the
//! admin console's SHOW SERVERS: what a connection says about itself
//! ([`Poolable::identity`](crate::Poolable::identity), read once when it
//! opens), when it opened and was last handed out, whether it is in use
//! (derived when asked, from the pool's idle list), the client it serves
//! (`link`) and the `application_name` the server last reported.
//!
//! Cost: a pool's list is written when a connection opens (a lock and a
//! push); a connection's entry goes with it when it closes (the slot that
//! holds the connection holds the entry's only strong reference); a
//! checkout stores one time, and the session the client's id, each with a
//! relaxed store; a server's `application_name` report (only when a client
//! sets it) takes a lock. Nothing else on the data path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

use crate::coarse;

/// What a server connection says about itself, read once when it opens.
/// Empty fields (0, "") where the protocol does not tell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerIdentity {
    /// The server's IP address, or the directory of its Unix socket.
    pub addr: String,
    pub port: u16,
    /// This end's address and port (empty and 0 over a Unix socket).
    pub local_addr: String,
    pub local_port: u16,
    /// The server's process id (PostgreSQL's BackendKeyData) or thread id
    /// (MySQL's handshake); 0 when unknown.
    pub remote_pid: u64,
    /// The TLS version and cipher (`TLSv1.3/TLS_AES_256_GCM_SHA384`);
    /// empty without TLS.
    pub tls: String,
    /// The `application_name` the server reported at login (in a
    /// [`ServerRow`]: the one it reported last).
    pub application_name: String,
}

impl ServerIdentity {
    /// A connection over a socket: `sockets` are the server's and this
    /// end's addresses (`None` over a Unix socket or a pipe).
    pub fn of_socket(
        sockets: Option<(std::net::SocketAddr, std::net::SocketAddr)>,
        remote_pid: u64,
        tls: String,
        application_name: String,
    ) -> ServerIdentity {
        let (addr, port, local_addr, local_port) = match sockets {
            Some((peer, local)) => (
                peer.ip().to_string(),
                peer.port(),
                local.ip().to_string(),
                local.port(),
            ),
            None => Default::default(),
        };
        ServerIdentity {
            addr,
            port,
            local_addr,
            local_port,
            remote_pid,
            tls,
            application_name,
        }
    }
}

/// Whom a pool's connections serve (set by the pool's maker, see
/// [`Pool::labelled`](crate::Pool::labelled)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolLabels {
    pub cluster: Arc<str>,
    /// The backend's configured address.
    pub backend: Arc<str>,
    /// The client-side user name the pool serves.
    pub user: Arc<str>,
    /// The client-side database name (empty where a connection serves
    /// every database, as MySQL's).
    pub database: Arc<str>,
}

/// PgBouncer's server states Fulcrum has: in use by a client (`active`),
/// ready (`idle`), or idle past `server_check_delay` and so checked before
/// its next use (`used`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerState {
    Active,
    Idle,
    Used,
}

impl ServerState {
    pub fn as_str(self) -> &'static str {
        match self {
            ServerState::Active => "active",
            ServerState::Idle => "idle",
            ServerState::Used => "used",
        }
    }
}

/// One open server connection, as SHOW SERVERS lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerRow {
    pub labels: PoolLabels,
    /// Unique in the process for its lifetime (PgBouncer's `ptr`).
    pub id: u64,
    pub state: ServerState,
    pub identity: ServerIdentity,
    /// When it opened and was last handed out, ms since the Unix epoch.
    pub connect_unix_ms: u64,
    pub request_unix_ms: u64,
    /// A RECONNECT or `server_lifetime` closes it when it is next idle.
    pub close_needed: bool,
    /// The id of the client it serves while `active` (PgBouncer's `link`;
    /// the id SHOW CLIENTS shows); `None` when idle or not said.
    pub link: Option<u64>,
}

/// A connection's entry. The slot holding the connection (idle or checked
/// out) holds the only strong reference; the pool's list a weak one.
pub(crate) struct Entry {
    id: u64,
    identity: ServerIdentity,
    pub(crate) born: Instant,
    born_ms: u64,
    connect_unix_ms: u64,
    /// When it was last handed out, ms since the Unix epoch.
    request_unix_ms: AtomicU64,
    /// The client it was last handed to (0: not said).
    link: AtomicU64,
    /// The `application_name` the server reported after login, when it
    /// changed (a client's `SET`, a replayed setting).
    application_name: Mutex<Option<Box<str>>>,
}

impl Entry {
    pub(crate) fn new(identity: ServerIdentity, born: Instant, born_ms: u64) -> Arc<Entry> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let now = coarse::unix_ms();
        Arc::new(Entry {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            identity,
            born,
            born_ms,
            connect_unix_ms: now,
            request_unix_ms: AtomicU64::new(now),
            link: AtomicU64::new(0),
            application_name: Mutex::new(None),
        })
    }

    /// The client (its registry id) the connection now serves.
    pub(crate) fn link(&self, client: u64) {
        self.link.store(client, Ordering::Relaxed);
    }

    /// The server reported a new `application_name`.
    pub(crate) fn application_name_reported(&self, name: &str) {
        let mut now = self
            .application_name
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if now.as_deref() != Some(name) {
            *now = Some(name.into());
        }
    }

    /// Handed out now: the one store a checkout pays.
    pub(crate) fn requested(&self) {
        self.request_unix_ms
            .store(coarse::unix_ms(), Ordering::Relaxed);
    }

    pub(crate) fn row(
        &self,
        labels: &PoolLabels,
        state: ServerState,
        close_needed: bool,
    ) -> ServerRow {
        let mut identity = self.identity.clone();
        if let Some(name) = self
            .application_name
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_deref()
        {
            identity.application_name = name.to_owned();
        }
        let link = Some(self.link.load(Ordering::Relaxed))
            .filter(|&c| c != 0 && state == ServerState::Active);
        ServerRow {
            labels: labels.clone(),
            id: self.id,
            state,
            identity,
            connect_unix_ms: self.connect_unix_ms,
            request_unix_ms: self.request_unix_ms.load(Ordering::Relaxed),
            close_needed,
            link,
        }
    }

    pub(crate) fn born_ms(&self) -> u64 {
        self.born_ms
    }
}

/// A pool's open connections (weakly: a closed one's entry is gone).
#[derive(Default)]
pub(crate) struct Entries {
    list: Mutex<Vec<Weak<Entry>>>,
}

impl Entries {
    /// A connection opened: listed, and the closed ones' slots reclaimed.
    pub(crate) fn opened(&self, e: &Arc<Entry>) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(e));
    }

    /// The connections open now.
    pub(crate) fn alive(&self) -> Vec<Arc<Entry>> {
        let list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        list.iter().filter_map(Weak::upgrade).collect()
    }
}

/// A labelled pool, type-erased for the registry.
pub(crate) trait ListServers: Send + Sync {
    fn servers(&self) -> Vec<ServerRow>;
}

fn registry() -> &'static Mutex<Vec<Weak<dyn ListServers>>> {
    static POOLS: OnceLock<Mutex<Vec<Weak<dyn ListServers>>>> = OnceLock::new();
    POOLS.get_or_init(Default::default)
}

/// Lists a labelled pool (until it is dropped).
pub(crate) fn register(pool: Weak<dyn ListServers>) {
    let mut pools = registry().lock().unwrap_or_else(|e| e.into_inner());
    pools.retain(|w| w.strong_count() > 0);
    pools.push(pool);
}

/// Every open server connection of every labelled pool in the process.
pub fn snapshot() -> Vec<ServerRow> {
    let pools: Vec<Arc<dyn ListServers>> = registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    let mut rows: Vec<ServerRow> = pools.iter().flat_map(|p| p.servers()).collect();
    rows.sort_by_key(|r| r.id);
    rows
}
