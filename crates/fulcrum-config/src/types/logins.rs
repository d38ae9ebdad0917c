//! Who logs in: the users of a cluster and of the admin console, the
//! server-side login a user may map to, and `auth_query` for users not in
//! the file. Their `Debug` never prints a password.

use std::time::Duration;

/// `auth_query`: logins for users not in the config are checked against
/// the password the server stores, fetched with this query.
#[derive(Clone, PartialEq)]
pub struct AuthQuery {
    /// Who runs the query, and its password.
    pub user: String,
    pub password: String,
    /// `$1` (PostgreSQL) or `?` (MySQL) is the login name.
    pub query: String,
    /// Database the query runs in (MySQL: empty, none).
    pub database: String,
    /// How long a fetched secret is used before it is fetched again.
    pub cache_ttl: Duration,
    /// `auth_user` connections (and lookups) at once, pooled.
    pub max_connections: usize,
    /// Lookups that find nobody allowed per client address and minute
    /// (0: no limit).
    pub failed_lookups_per_minute: u32,
}

impl std::fmt::Debug for AuthQuery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthQuery")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .field("query", &self.query)
            .field("database", &self.database)
            .field("cache_ttl", &self.cache_ttl)
            .field("max_connections", &self.max_connections)
            .field("failed_lookups_per_minute", &self.failed_lookups_per_minute)
            .finish()
    }
}

/// One `[[cluster.user]]` (or `[[fulcrum.admin_user]]`).
#[derive(Clone, PartialEq)]
pub struct User {
    pub name: String,
    /// The text given, as given (a hash's text when `hash` is set).
    pub password: String,
    /// PostgreSQL clusters: the password was given as the server stores it
    /// (a SCRAM-SHA-256 verifier or an md5 hash), never the password itself.
    pub hash: Option<super::PasswordHash>,
    /// The login used on the servers, when not this one (`server_user`,
    /// `server_password`): many client users, one application role.
    pub server: Option<ServerLogin>,
    /// This user's own `pool_mode`, `pool_size`, `max_user_connections`.
    pub pool: UserPool,
}

/// A user's pool settings over the cluster's (PgBouncer's `[users]`):
/// `pool_mode`, `pool_size` and `max_user_connections` on a
/// `[[cluster.user]]`, or on the `[[cluster.user_default]]` for the users
/// `auth_query` finds. `None`: the cluster's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UserPool {
    pub pool_mode: Option<super::PoolMode>,
    pub pool_size: Option<u32>,
    pub max_user_connections: Option<u32>,
}

/// A server-side login.
#[derive(Clone, PartialEq)]
pub struct ServerLogin {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for ServerLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerLogin")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl User {
    /// A user who logs in to the servers as itself.
    pub fn new(name: impl Into<String>, password: impl Into<String>) -> User {
        User {
            name: name.into(),
            password: password.into(),
            hash: None,
            server: None,
            pool: UserPool::default(),
        }
    }

    /// The hash this user logs in to the servers with, when its server
    /// login is its own and its password was given as a hash: what a
    /// client proves (SCRAM) or the hash itself (md5) must serve, as the
    /// text is no password.
    pub fn server_hash(&self) -> Option<&super::PasswordHash> {
        self.server
            .is_none()
            .then_some(self.hash.as_ref())
            .flatten()
    }

    /// The name this user logs in to the servers with.
    pub fn server_user(&self) -> &str {
        self.server.as_ref().map_or(&self.name, |s| &s.user)
    }

    /// The password this user logs in to the servers with.
    pub fn server_password(&self) -> &str {
        self.server.as_ref().map_or(&self.password, |s| &s.password)
    }
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print passwords, not even in debug output.
        f.debug_struct("User")
            .field("name", &self.name)
            .field("password", &"<redacted>")
            .field("hash", &self.hash)
            .field("server_user", &self.server.as_ref().map(|s| &s.user))
            .field("pool", &self.pool)
            .finish()
    }
}
