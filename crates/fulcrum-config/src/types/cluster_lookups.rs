//! What a validated `[[cluster]]` answers about one user or database: the
//! pool settings that apply to a user (its own, the user default's, or the
//! cluster's), a database's server login and `connect_query`, and which of
//! the clusters sharing a listener serves a database.

use super::*;

impl Cluster {
    /// The pool settings that apply to `user`: its `[[cluster.user]]`'s,
    /// or `[[cluster.user_default]]`'s for a user not listed.
    fn user_pool(&self, user: &str) -> UserPool {
        self.users
            .iter()
            .find(|u| u.name == user)
            .map_or(self.user_default, |u| u.pool)
    }

    /// `user`'s pool mode: its own, else the cluster's.
    pub fn pool_mode_of(&self, user: &str) -> PoolMode {
        self.user_pool(user).pool_mode.unwrap_or(self.pool_mode)
    }

    /// `user`'s pool size per (backend, database): its own, else the cluster's.
    pub fn pool_size_of(&self, user: &str) -> u32 {
        self.user_pool(user).pool_size.unwrap_or(self.pool_size)
    }

    /// `user`'s cap on server connections per backend (0: none): its own,
    /// else the cluster's `max_user_connections`.
    pub fn max_user_connections_of(&self, user: &str) -> u32 {
        self.user_pool(user)
            .max_user_connections
            .unwrap_or(self.budgets.max_user_connections)
    }

    /// The server's name for the database a client asked for; `None` when
    /// `[[cluster.database]]` lists others only.
    pub fn server_database<'a>(&'a self, client: &'a str) -> Option<&'a str> {
        if self.databases.is_empty() {
            return Some(client);
        }
        self.databases
            .iter()
            .find(|d| d.name == client)
            .map(|d| d.server_database.as_str())
    }

    /// The login every client of the database it asked for (`name`, as
    /// listed) is served with, when its `[[cluster.database]]` forces one.
    pub fn forced_login_of(&self, name: &str) -> Option<&ServerLogin> {
        self.databases
            .iter()
            .find(|d| d.name == name)?
            .server
            .as_ref()
    }

    /// The user a client's pools are keyed by when it asked for database
    /// `name`: the server login that database forces (all its clients
    /// share its pools), else the client's own.
    pub fn pool_user<'a>(&'a self, client_user: &'a str, name: &str) -> &'a str {
        self.forced_login_of(name)
            .map_or(client_user, |l| l.user.as_str())
    }

    /// The forced login a pool of `user` on `server_database` logs in
    /// with: that of a `[[cluster.database]]` of this server database
    /// forcing `user` (its pool key, [`Cluster::pool_user`]).
    pub fn forced_login(&self, server_database: &str, user: &str) -> Option<&ServerLogin> {
        self.forced_entry(server_database, user)?.server.as_ref()
    }

    fn forced_entry(&self, server_database: &str, user: &str) -> Option<&Database> {
        self.databases.iter().find(|d| {
            d.server_database == server_database
                && d.server.as_ref().is_some_and(|s| s.user == user)
        })
    }

    /// What a new server connection of `user`'s pool on `server_database`
    /// (`None`: a MySQL connection, which serves every schema) runs before
    /// it serves: the `connect_query` of the `[[cluster.database]]` whose
    /// pool it is (one forcing `user`, else one forcing none), else the
    /// cluster's. Entries sharing a pool agree on it (validated).
    pub fn connect_query(&self, server_database: Option<&str>, user: &str) -> Option<&str> {
        let entry = server_database.and_then(|db| {
            self.forced_entry(db, user).or_else(|| {
                self.databases
                    .iter()
                    .find(|d| d.server_database == db && d.server.is_none())
            })
        });
        entry
            .and_then(|d| d.connect_query.as_deref())
            .or(self.connect_query.as_deref())
    }
}

/// Of the clusters sharing one listen address (in config order), the one
/// that serves `database`: the one listing it, else the one listing none,
/// else the first (which refuses it as an unknown database).
pub fn cluster_for_database<'a, T>(
    clusters: &'a [T],
    config: impl Fn(&T) -> &Cluster,
    database: &str,
) -> Option<&'a T> {
    clusters
        .iter()
        .find(|c| config(c).databases.iter().any(|d| d.name == database))
        .or_else(|| clusters.iter().find(|c| config(c).databases.is_empty()))
        .or_else(|| clusters.first())
}
