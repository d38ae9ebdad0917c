//! Default values for optional keys (documented in docs/configuration.md).

use std::time::Duration;
pub const LOG: &str = "info";
pub const WORKERS: u32 = 0;
pub const LOG_FORMAT: super::LogFormat = super::LogFormat::Text;
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long clients may stay on the old process after an upgrade.
pub const UPGRADE_TIMEOUT: Duration = Duration::from_secs(600);
/// `dns_max_ttl`: PgBouncer's default.
pub const DNS_MAX_TTL: Duration = Duration::from_secs(15);
pub const POOL_MODE: super::PoolMode = super::PoolMode::Transaction;
pub const POOL_SIZE: u32 = 20;
pub const CLIENT_AUTH: super::ClientAuth = super::ClientAuth::ScramSha256;
pub const AUTH_QUERY_PG: &str = "SELECT usename, passwd FROM pg_shadow WHERE usename = $1";
pub const AUTH_DATABASE_PG: &str = "postgres";
pub const AUTH_QUERY_MYSQL: &str =
    "SELECT authentication_string FROM mysql.user WHERE user = ? AND host = '%'";
pub const AUTH_CACHE_TTL: Duration = Duration::from_secs(60);
pub const AUTH_MAX_CONNECTIONS: u32 = 2;
pub const AUTH_FAILED_LOOKUPS_PER_MINUTE: u32 = 30;
pub const ADMIN_AUTH: super::ClientAuth = super::ClientAuth::ScramSha256;
pub const POOL_TIMEOUT: Duration = Duration::from_secs(5);
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
pub const CLIENT_LOGIN_TIMEOUT: Duration = Duration::from_secs(15);
/// `client_login_timeout = "0s"`: off (ten years).
pub const CLIENT_LOGIN_TIMEOUT_OFF: Duration = Duration::from_secs(10 * 365 * 86_400);
pub const SERVER_LIFETIME: Duration = Duration::from_secs(3600);
pub const SERVER_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
pub const MAX_MESSAGE_SIZE: u64 = 64 * 1024 * 1024;
pub const MAX_CLIENT_CONNECTIONS: u32 = 10_000;
pub const NOTIFY_QUEUE: u32 = 10_000;
pub const MAX_CLIENT_NOTIFY_BYTES: u64 = 1024 * 1024;
pub const MIRROR_QUEUE: u32 = 1000;
pub const MIRROR_MAX_TRANSACTION_BYTES: u64 = 4 * 1024 * 1024;
pub const MAX_PENDING_LOGINS: u32 = 512;
pub const MAX_PREPARED_STATEMENTS: u32 = 1_000;
pub const MAX_CLIENT_PREPARED_STATEMENTS: u32 = 50_000;
pub const MAX_CLIENT_SETTINGS: u32 = 1_000;
pub const MAX_CLIENT_SETTINGS_BYTES: u64 = 4 * 1024 * 1024;
pub const MAX_CLIENT_PREPARED_BYTES: u64 = 16 * 1024 * 1024;
pub const WEIGHT: u32 = 1;
pub const DEFAULT_ROUTE: super::DefaultRoute = super::DefaultRoute::Primary;
pub const BALANCE: super::BalancePolicy = super::BalancePolicy::LeastConnections;
pub const CLASSIFIER_CACHE_SIZE: u32 = 10_000;
pub const DIGEST_MAX_ENTRIES: u32 = 5_000;
pub const RESERVE_POOL_TIMEOUT: Duration = Duration::from_secs(5);
pub const SERVER_CHECK_DELAY: Duration = Duration::from_secs(30);
pub const FUNCTION_CATALOG_TTL: Duration = Duration::from_secs(60);
pub const FUNCTION_CATALOG_WAIT: Duration = Duration::from_millis(100);
pub const MAX_CLASSIFY_BYTES: u64 = 64 * 1024;
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(1);
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);
pub const HEALTH_FAILURES: u32 = 2;
pub const HEALTH_DATABASE_POSTGRES: &str = "postgres";
/// None: a probe needs no database, and a login without rights on one
/// would otherwise be refused.
pub const HEALTH_DATABASE_MYSQL: &str = "";
pub const FAILOVER: super::Failover = super::Failover::Follow;
pub const FAILOVER_TIMEOUT: Duration = Duration::from_secs(3);
pub const ETCD_PREFIX: &str = "/fulcrum";
pub const ETCD_LEASE: Duration = Duration::from_secs(5);
pub const PATRONI_TIMEOUT: Duration = Duration::from_secs(5);
pub const ON_COORDINATOR_LOSS: super::CoordinatorLoss = super::CoordinatorLoss::Hold;
pub const CONSISTENCY: super::Consistency = super::Consistency::Session;
pub const CAUSAL_TIMEOUT: Duration = Duration::from_secs(1);
pub const TRANSACTION_REPLAY_MAX_SIZE: u64 = 1024 * 1024;
pub const TRANSACTION_REPLAY_TIMEOUT: Duration = Duration::from_secs(30);
pub const CAUSAL_WAIT: super::CausalWait = super::CausalWait::Auto;
