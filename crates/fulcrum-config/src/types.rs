//! The validated configuration model: what the rest of Fulcrum reads.
//! Plain data, built by `crate::load`/`crate::parse`; defaults live here.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// A whole, validated configuration file.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file it was read from (used in reload messages).
    pub source: PathBuf,
    pub fulcrum: Global,
    pub clusters: Vec<Cluster>,
}

/// The `[fulcrum]` table.
#[derive(Debug, Clone, PartialEq)]
pub struct Global {
    /// Admin console listen address (later issue); `None` = off.
    pub admin: Option<SocketAddr>,
    /// Prometheus listen address (later issue); `None` = off.
    pub metrics: Option<SocketAddr>,
    /// A tracing filter such as `info` or `fulcrum=debug,info`.
    pub log: String,
    /// Threads that run client sessions: 0 = one per CPU; 1 = a single
    /// event-loop thread (no cross-thread wake-ups, like PgBouncer).
    pub workers: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Postgres,
    Mysql,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    Session,
    Transaction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    ScramSha256,
    Md5,
    Trust,
}

/// Read-balancing policy (`balance`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BalancePolicy {
    RoundRobin,
    Weighted,
    LeastConnections,
    Random,
    P2c,
}

/// Where unparsable statements go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultRoute {
    Primary,
    Replica,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Primary,
    Replica,
    Auto,
}

/// One `[[cluster]]`: a listener in front of one replicated cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    pub name: String,
    pub protocol: Protocol,
    pub listen: SocketAddr,
    pub pool_mode: PoolMode,
    /// Server connections per backend per (user, database).
    pub pool_size: u32,
    pub client_auth: ClientAuth,
    /// How long a client waits for a server connection before it gets an error.
    pub pool_timeout: Duration,
    /// How long opening (and authenticating) a server connection may take.
    pub connect_timeout: Duration,
    /// Idle server connections older than this are closed.
    pub server_idle_timeout: Duration,
    /// Largest client message accepted, in bytes (declared length).
    pub max_message_size: u64,
    /// Most client connections accepted at once on this listener.
    pub max_client_connections: u32,
    /// Most protocol-level prepared statements kept per server connection.
    pub max_prepared_statements: u32,
    /// The primary also serves reads (weighted like the replicas).
    pub reads_on_primary: bool,
    /// How reads are spread over the readers.
    pub balance: BalancePolicy,
    /// Where statements the classifier cannot parse go.
    pub default_route: DefaultRoute,
    /// User functions that write: a read calling one goes to the primary.
    pub write_functions: Vec<String>,
    /// Functions known to be safe on a replica.
    pub read_only_functions: Vec<String>,
    /// Classifier decisions cached per cluster (0: no cache).
    pub classifier_cache_size: u32,
    pub backends: Vec<Backend>,
    pub users: Vec<User>,
}

/// One `[[cluster.backend]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Backend {
    /// `host:port`; the host may be a name.
    pub address: String,
    pub role: Role,
    pub weight: u32,
}

/// One `[[cluster.user]]`.
#[derive(Clone, PartialEq)]
pub struct User {
    pub name: String,
    pub password: String,
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print passwords, not even in debug output.
        f.debug_struct("User")
            .field("name", &self.name)
            .field("password", &"<redacted>")
            .finish()
    }
}

pub mod defaults {
    //! Default values for optional keys (documented in docs/configuration.md).
    use std::time::Duration;
    pub const LOG: &str = "info";
    pub const WORKERS: u32 = 0;
    pub const POOL_MODE: super::PoolMode = super::PoolMode::Transaction;
    pub const POOL_SIZE: u32 = 20;
    pub const CLIENT_AUTH: super::ClientAuth = super::ClientAuth::ScramSha256;
    pub const POOL_TIMEOUT: Duration = Duration::from_secs(5);
    pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
    pub const SERVER_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
    pub const MAX_MESSAGE_SIZE: u64 = 256 * 1024 * 1024;
    pub const MAX_CLIENT_CONNECTIONS: u32 = 10_000;
    pub const MAX_PREPARED_STATEMENTS: u32 = 1_000;
    pub const WEIGHT: u32 = 1;
    pub const DEFAULT_ROUTE: super::DefaultRoute = super::DefaultRoute::Primary;
    pub const BALANCE: super::BalancePolicy = super::BalancePolicy::RoundRobin;
    pub const CLASSIFIER_CACHE_SIZE: u32 = 10_000;
}
