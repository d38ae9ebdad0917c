//! The validated configuration model: what the rest of Fulcrum reads.
//! Plain data, built by `crate::load`/`crate::parse`; defaults live here
//! (`defaults`), the logins in `logins`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use crate::cache::{Cache, CacheInvalidation, CacheIsolation, CacheMode, CacheRule, Keeping};
pub use crate::coordination::{CoordinatorLoss, Etcd, Patroni, Topology};
pub use crate::mirror::{Mirror, MirrorLogin, MirrorMode};

mod cluster_lookups;
mod logins;
mod password_hash;
pub(crate) mod unix_socket;
pub use cluster_lookups::cluster_for_database;
pub use logins::{AuthQuery, ServerLogin, User, UserPool};
pub use password_hash::{PasswordHash, ScramVerifier};
pub use unix_socket::{pg_socket_path, UnixGroup, UnixPlace, UnixSocket};

/// A whole, validated configuration file.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file it was read from (used in reload messages).
    pub source: PathBuf,
    pub fulcrum: Global,
    pub clusters: Vec<Cluster>,
}

/// `status_key`: compared, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct StatusKey(pub String);

impl std::fmt::Debug for StatusKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
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
    /// `text` or `json` log lines.
    pub log_format: LogFormat,
    /// Units of work slower than this are logged (None: off).
    pub slow_query_threshold: Option<Duration>,
    /// SIGTERM: how long in-flight transactions may take to finish.
    pub shutdown_timeout: Duration,
    /// An upgrade (SIGUSR2, `UPGRADE`): how long clients left on the old
    /// process may stay before they are ended at a transaction boundary.
    pub upgrade_timeout: Duration,
    /// How long a server's host name's addresses are kept (`dns_max_ttl`;
    /// zero: looked up for every connection).
    pub dns_max_ttl: Duration,
    /// Logins of the admin console (`[[fulcrum.admin_user]]`).
    pub admin_users: Vec<User>,
    /// How console logins prove their password: SCRAM-SHA-256 or md5
    /// (never `Trust`).
    pub admin_auth: ClientAuth,
    /// Console users who may only read (`SHOW ...`): PgBouncer's
    /// `stats_users`, each one of `admin_users`.
    pub stats_users: Vec<String>,
    /// The key the status page and `/api/v1` on the metrics port ask for
    /// (`status_key`); `None`: both are off.
    pub status_key: Option<StatusKey>,
    /// The console's TLS: `[fulcrum]`'s `tls_mode`, `tls_certificate` and
    /// `tls_private_key` (the listeners' defaults); `None`: plain only.
    pub admin_tls: Option<crate::ClientTls>,
}

/// The log line format (`log_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
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
    /// PostgreSQL: the server connection goes back after every statement;
    /// a transaction block ends the client (PgBouncer's statement pooling).
    Statement,
}

impl PoolMode {
    /// The name written in the config file.
    pub fn name(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
            PoolMode::Statement => "statement",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    ScramSha256,
    Md5,
    Trust,
    /// PostgreSQL: the client's TLS certificate (checked against
    /// `tls_client_ca`) names the user by its CN; no password.
    Cert,
    /// PostgreSQL: the method is picked per connection by the first line
    /// of `auth_hba_file` that applies ([`Cluster::hba`]).
    Hba,
    /// PostgreSQL, from an hba `password` line only (no `client_auth`
    /// value): the password asked in clear text.
    Password,
    /// MySQL: `mysql_native_password` offered in the greeting.
    MysqlNativePassword,
    /// MySQL: `caching_sha2_password` offered in the greeting (MySQL 8's
    /// default); native replies are accepted too.
    CachingSha2Password,
}

impl ClientAuth {
    /// The name written in the config file.
    pub fn name(self) -> &'static str {
        match self {
            ClientAuth::ScramSha256 => "scram-sha-256",
            ClientAuth::Md5 => "md5",
            ClientAuth::Trust => "trust",
            ClientAuth::Cert => "cert",
            ClientAuth::Hba => "hba",
            ClientAuth::Password => "password",
            ClientAuth::MysqlNativePassword => "mysql_native_password",
            ClientAuth::CachingSha2Password => "caching_sha2_password",
        }
    }
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

/// What Fulcrum does when the primary is lost (`failover`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failover {
    /// Eject the primary and wait for it to come back.
    None,
    /// An external tool promotes a replica; Fulcrum finds it and follows.
    Follow,
    /// Fulcrum promotes the most advanced replica after `failover_timeout`.
    Promote,
}

/// What a read may miss (`consistency`; see docs/consistency.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consistency {
    /// Any replica within `max_lag`.
    Eventual,
    /// Never older than the client's own last committed write.
    Session,
    /// Never older than the last write committed by any connection of the
    /// same user to the same database (through this Fulcrum).
    User,
    /// Sees every write committed anywhere before the read started.
    Strong,
}

impl Consistency {
    /// The names accepted in the config, in hints and in `SET fulcrum.consistency`.
    pub const NAMES: &'static [(&'static str, Consistency)] = &[
        ("eventual", Consistency::Eventual),
        ("session", Consistency::Session),
        ("user", Consistency::User),
        ("strong", Consistency::Strong),
    ];

    /// Parses a name, ASCII case-insensitively.
    pub fn from_name(name: &str) -> Option<Consistency> {
        Self::NAMES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|&(_, c)| c)
    }

    pub fn name(self) -> &'static str {
        match self {
            Consistency::Eventual => "eventual",
            Consistency::Session => "session",
            Consistency::User => "user",
            Consistency::Strong => "strong",
        }
    }

    /// Sessions learn the position of their writes (session and user).
    pub fn tracks_writes(self) -> bool {
        matches!(self, Consistency::Session | Consistency::User)
    }
}

/// What a causal read does when the replica it was given is behind
/// (`causal_wait`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CausalWait {
    /// Wait on the replica only while the primary has no free connection;
    /// otherwise read on the primary at once (whichever answers first).
    Auto,
    /// Wait on the replica up to `causal_timeout`, then use the primary.
    Always,
    /// Use the primary at once.
    Never,
}

impl CausalWait {
    /// `Some(true)`: always wait; `Some(false)`: never; `None`: decide per read.
    pub fn forced(self) -> Option<bool> {
        match self {
            CausalWait::Auto => None,
            CausalWait::Always => Some(true),
            CausalWait::Never => Some(false),
        }
    }
}

/// How far behind the primary a replica may be and still serve reads (`max_lag`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxLag {
    /// WAL bytes (PostgreSQL) not yet replayed.
    Bytes(u64),
    /// Age of the newest change not yet replayed.
    Time(Duration),
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
    /// A Unix-domain socket it also listens on (`unix_socket_dir`,
    /// `unix_socket`); `None`: TCP only.
    pub unix_socket: Option<UnixSocket>,
    pub pool_mode: PoolMode,
    /// Server connections per backend per (user, database).
    pub pool_size: u32,
    pub client_auth: ClientAuth,
    /// `client_auth = "hba"`: the rules read from `auth_hba_file` (read
    /// again at each reload); `None` otherwise.
    pub hba: Option<crate::hba::Hba>,
    /// How long a client waits for a server connection before it gets an error.
    pub pool_timeout: Duration,
    /// How long opening (and authenticating) a server connection may take.
    pub connect_timeout: Duration,
    /// A client must finish its login within this time.
    pub client_login_timeout: Duration,
    /// A logged-in client idle (outside a transaction) this long is closed; `None`: never.
    pub client_idle_timeout: Option<Duration>,
    /// A client idle inside a transaction this long is told, its
    /// transaction rolled back and its server connection returned; `None`: never.
    pub idle_transaction_timeout: Option<Duration>,
    /// A statement the server has worked on this long is cancelled
    /// (PostgreSQL CancelRequest, MySQL KILL QUERY); `None`: never.
    pub query_timeout: Option<Duration>,
    /// Idle server connections older than this are closed.
    pub server_idle_timeout: Duration,
    /// Server connections older than this are closed when they come back
    /// to the pool; `None`: kept as long as they work.
    pub server_lifetime: Option<Duration>,
    /// Largest client message accepted, in bytes (declared length).
    pub max_message_size: u64,
    /// Most client connections accepted at once on this listener.
    pub max_client_connections: u32,
    /// Connections still logging in at once; at the cap the oldest is closed.
    pub max_pending_logins: u32,
    /// PostgreSQL, transaction pooling: notifications queued for one client
    /// at most; past it the next ones for that client are dropped (counted).
    pub notify_queue: u32,
    /// Notifications' bytes queued for one client at most (as `notify_queue`).
    pub max_client_notify_bytes: u64,
    /// Most protocol-level prepared statements kept per server connection.
    pub max_prepared_statements: u32,
    /// Most protocol-level prepared statements one client may hold at once
    /// (Fulcrum keeps each in memory; a loop of fresh names would grow it
    /// without end).
    pub max_client_prepared_statements: u32,
    /// Most distinct session settings (SET) one client may have tracked.
    pub max_client_settings: u32,
    /// Most bytes of tracked settings (keys and statements) per client.
    pub max_client_settings_bytes: u64,
    /// Most bytes of protocol-level prepared statement text per client.
    pub max_client_prepared_bytes: u64,
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
    /// User functions and procedures known to leave no session state:
    /// calling one does not pin (PostgreSQL).
    pub session_free_functions: Vec<String>,
    /// Look up functions no list decides in the server's catalog
    /// (`function_catalog`); `None`: off. The duration is how long an
    /// answer is used before it is asked again (`function_catalog_ttl`).
    pub function_catalog: Option<Duration>,
    /// How long a login to a database whose functions are not read yet
    /// waits for them (`function_catalog_wait`).
    pub function_catalog_wait: Duration,
    /// Classifier decisions cached per cluster (0: no cache).
    pub classifier_cache_size: u32,
    /// Per-statement digest statistics (`digest_max_entries`, `digest_metrics_top`).
    pub digests: Digests,
    /// PgBouncer's pool budgets: warm minimum, reserve, per-database and
    /// per-user caps.
    pub budgets: PoolBudgets,
    /// Longest statement text the classifier parses; longer ones go where
    /// `default_route` says.
    pub max_classify_bytes: u64,
    /// Client-side TLS (`tls_mode` and its files); `None`: disabled.
    pub tls: Option<crate::ClientTls>,
    /// MySQL: let clients use `LOAD DATA LOCAL INFILE` through Fulcrum.
    pub allow_local_infile: bool,
    /// Send the password in clear text when a server asks for it.
    pub server_cleartext: bool,
    /// PostgreSQL: run on a server connection going back to the pool in
    /// session pooling, and after a pinned client in transaction pooling
    /// (`DISCARD ALL` by default; empty: such a connection is closed, never
    /// returned with its state).
    pub server_reset_query: String,
    /// Also run it on every return in transaction pooling.
    pub server_reset_query_always: bool,
    /// Run once on every new server connection, after its login and before
    /// it serves a client (`connect_query`; a database's own overrides it).
    pub connect_query: Option<String>,
    /// Health checks, lag limit and failover.
    pub health: Health,
    /// Who decides the primary (`topology`): this instance's probes, a
    /// leader elected in etcd, or Patroni.
    pub topology: Topology,
    /// Users not listed, looked up on the server (`auth_user`, `auth_query`).
    pub auth_query: Option<AuthQuery>,
    /// Read consistency (`consistency`).
    pub consistency: Consistency,
    /// Longest a causal read waits for a replica (`causal_timeout`).
    pub causal_timeout: Duration,
    /// Wait on a behind replica or use the primary (`causal_wait`).
    pub causal_wait: CausalWait,
    /// Replay an open transaction on the new primary when its server dies
    /// before COMMIT was sent (`transaction_replay*`); `None`: off.
    pub transaction_replay: Option<TransactionReplay>,
    pub backends: Vec<Backend>,
    pub users: Vec<User>,
    /// `[[cluster.user_default]]`: the pool settings of users not listed
    /// (found by `auth_query`).
    pub user_default: UserPool,
    /// `[[cluster.database]]`: when any is listed, the only databases this
    /// listener serves, each possibly an alias of another on the servers.
    pub databases: Vec<Database>,
    /// `[[cluster.mirror]]`: where its traffic is mirrored to.
    pub mirrors: Vec<Mirror>,
    /// `[cluster.cache]`: the result cache (off unless configured).
    pub cache: Cache,
}

/// `transaction_replay = true`: how much of a transaction is kept, and how
/// long a replay waits for a primary to replay on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransactionReplay {
    /// Bytes of client messages kept per open transaction
    /// (`transaction_replay_max_size`); a larger one is not replayable.
    pub max_size: u64,
    /// Longest wait for a primary to take the replay (`transaction_replay_timeout`).
    pub timeout: Duration,
    /// Keep the client's output too, to log the bytes of a mismatch
    /// (`transaction_replay_debug`).
    pub debug: bool,
    /// Learn each replayable transaction's id so that a COMMIT in flight
    /// when its server dies can be resolved on the new primary
    /// (`transaction_replay_resolve_commits`, PostgreSQL).
    pub resolve_commits: bool,
}

/// One `[[cluster.database]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Database {
    /// What clients ask for.
    pub name: String,
    /// What the servers call it (default: the same).
    pub server_database: String,
    /// PostgreSQL: every client of this database is served by connections
    /// logged in as this (`server_user`, `server_password`), whoever it
    /// logged in as: one pool per backend for them all (PgBouncer's
    /// `user=`/`password=` in `[databases]`).
    pub server: Option<ServerLogin>,
    /// PostgreSQL: run on each new server connection of this database
    /// instead of the cluster's `connect_query`.
    pub connect_query: Option<String>,
}

/// The health loop's settings for one cluster.
#[derive(Clone, PartialEq)]
pub struct Health {
    /// Time between probes of a backend.
    pub interval: Duration,
    /// How long one probe (connect and query) may take.
    pub timeout: Duration,
    /// Consecutive failed probes before a backend is down.
    pub failures: u32,
    /// Login the probes (and promotion) use.
    pub user: String,
    pub password: String,
    /// Database the probes connect to.
    pub database: String,
    /// Replicas further behind than this serve no reads.
    pub max_lag: Option<MaxLag>,
    pub failover: Failover,
    /// `promote` does not promote a replica further behind the last primary
    /// position than this (an operator's SWITCHOVER still can).
    pub failover_max_lag: MaxLag,
    /// How long the primary must stay down before `promote` acts.
    pub failover_timeout: Duration,
    /// Run after a promotion, with `%`-placeholders (see docs/failover.md).
    pub failover_command: Option<String>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("interval", &self.interval)
            .field("timeout", &self.timeout)
            .field("failures", &self.failures)
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .field("database", &self.database)
            .field("max_lag", &self.max_lag)
            .field("failover", &self.failover)
            .field("failover_max_lag", &self.failover_max_lag)
            .field("failover_timeout", &self.failover_timeout)
            .field("failover_command", &self.failover_command)
            .finish()
    }
}

/// One `[[cluster.backend]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Backend {
    /// `host:port`; the host may be a name.
    pub address: String,
    pub role: Role,
    pub weight: u32,
    /// TLS from Fulcrum to this backend (its own keys over the cluster's).
    pub tls: crate::ServerTls,
}

/// Digest statistics settings of a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digests {
    /// Digests kept (least recently used evicted); 0 turns them off.
    pub max_entries: u32,
    /// The top N digests by total time exported to Prometheus (0: none).
    pub metrics_top: u32,
}

impl Default for Digests {
    fn default() -> Digests {
        Digests {
            max_entries: defaults::DIGEST_MAX_ENTRIES,
            metrics_top: 0,
        }
    }
}

/// Connection budgets beyond `pool_size` (PgBouncer's keys; 0 = off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolBudgets {
    /// Server connections each pool keeps open, idle or not.
    pub min_pool_size: u32,
    /// Extra connections a pool may open for clients that waited
    /// `reserve_pool_timeout`.
    pub reserve_pool_size: u32,
    pub reserve_pool_timeout: Duration,
    /// Most server connections per backend for one database, across users.
    pub max_db_connections: u32,
    /// Most server connections per backend for one user, across databases.
    pub max_user_connections: u32,
    /// An idle connection older than this is checked with a round trip
    /// before it is handed out (`server_check_delay`; zero: always).
    pub server_check_delay: Duration,
}

impl Default for PoolBudgets {
    fn default() -> PoolBudgets {
        PoolBudgets {
            min_pool_size: 0,
            reserve_pool_size: 0,
            reserve_pool_timeout: defaults::RESERVE_POOL_TIMEOUT,
            max_db_connections: 0,
            max_user_connections: 0,
            server_check_delay: defaults::SERVER_CHECK_DELAY,
        }
    }
}

pub mod defaults;
