//! The `SHOW` tables, PgBouncer's column names where the concept is the
//! same: which table is which (one module per group: `topology` for
//! CLUSTERS, BACKENDS and FAILOVERS, `servers` for SERVERS (each server
//! connection), `pools` for POOLS and DATABASES, `clients` for
//! CLIENTS and USERS, `settings` for CONFIG, LISTS, STATS, TOTALS and
//! VERSION, `upgrade` for UPGRADE; QUERIES and MEM are `queries`'), and
//! the labels they share.

mod cache;
mod clients;
mod pools;
mod servers;
mod settings;
mod topology;
mod upgrade;

use bytes::BytesMut;

use crate::command::Show;
use crate::Admin;

impl Admin {
    pub(crate) fn show(&self, what: Show, out: &mut BytesMut) {
        match what {
            Show::Version => self.show_version(out),
            Show::Clusters => self.show_clusters(out),
            Show::Pools => self.show_pools(out),
            Show::Databases => self.show_databases(out),
            Show::Users => self.show_users(out),
            Show::Servers => self.show_servers(out),
            Show::Backends => self.show_backends(out),
            Show::Clients => self.show_clients(out),
            Show::Mem => self.show_mem(out),
            Show::Stats => self.show_stats(false, out),
            Show::Totals => self.show_stats(true, out),
            Show::Config => self.show_config(out),
            Show::Lists => self.show_lists(out),
            Show::ServerPools => self.show_server_pools(out),
            Show::Help => self.show_help(out),
            Show::Failovers => self.show_failovers(out),
            Show::Listeners => self.show_listeners(out),
            Show::Mirror => self.show_mirror(out),
            Show::Cache => self.show_cache(out),
            Show::Upgrade => self.show_upgrade(out),
        }
    }
}

/// SHOW HELP's rows: each command and what it does.
const HELP: &[(&str, &str)] = &[
    ("SHOW HELP", "this list"),
    ("SHOW POOLS", "per database and user: clients active and waiting, server connections, longest wait (PgBouncer's columns)"),
    ("SHOW SERVER_POOLS", "each pool per backend, user and database, with its budgets"),
    ("SHOW DATABASES", "pools summed per database"),
    ("SHOW STATS | TOTALS", "traffic per database, or summed: totals and per-second averages (PgBouncer's columns)"),
    ("SHOW SERVERS", "each server connection: user, database, state, addresses, server pid (PgBouncer's columns)"),
    ("SHOW BACKENDS", "each backend: role, state, probe, connections, why it serves no reads"),
    ("SHOW CLIENTS", "each client connection (PgBouncer's columns)"),
    ("SHOW CLUSTERS", "each backend's role, state and lag; the topology source and epoch"),
    ("SHOW FAILOVERS", "the changes of primary this instance saw, with their times"),
    ("SHOW LISTENERS", "LISTEN/NOTIFY: each listening connection, its channels and clients"),
    ("SHOW MIRROR", "mirroring's diff per target and digest: sent, dropped, differing, latency of each side"),
    ("SHOW CACHE", "the result cache per cluster and digest: entries, bytes, hits, misses, invalidations by source; each database's change stream"),
    ("SHOW UPGRADE", "the binary upgrades this process took part in: taken over from the old process, or started (handed over or failed, with why)"),
    ("FLUSH CACHE [table]", "drop every result-cache entry, or those of tables of that name"),
    ("SHOW QUERIES [cluster] | SHOW QUERIES RESET [cluster]", "statement digests"),
    ("SHOW USERS | CONFIG | LISTS | MEM | VERSION", "users, running settings, counts, memory, version"),
    ("PAUSE [database | cluster] | RESUME [database | cluster]", "hold new units of work (of the clusters serving the database), then let them go"),
    ("DISABLE database | ENABLE database", "refuse new logins to a database, or accept them again"),
    ("DISABLE BACKEND address | ENABLE BACKEND address", "take a backend (address, or cluster/address) out of reads, or back; DISABLE address works too"),
    ("KILL database | RECONNECT [database] | WAIT_CLOSE [database]", "drop, or recycle, a database's connections"),
    ("SWITCHOVER cluster TO backend", "planned promotion (with etcd: on the leader; with Patroni: asked of Patroni)"),
    ("RELOAD", "read the config file again; says what needs a restart"),
    ("UPGRADE", "start the binary at the daemon's path (same arguments, the config file as it is now) and hand it the listeners, as SIGUSR2 does"),
    ("SET log = 'filter'", "change the log filter"),
    ("SHUTDOWN", "drain and stop, as SIGTERM does"),
];

fn protocol(c: &fulcrum_config::Cluster) -> String {
    match c.protocol {
        fulcrum_config::Protocol::Postgres => "postgres".into(),
        fulcrum_config::Protocol::Mysql => "mysql".into(),
    }
}

fn pool_mode(c: &fulcrum_config::Cluster) -> String {
    c.pool_mode.name().into()
}

/// `user`'s pool mode (its own over the cluster's).
fn user_pool_mode(c: &fulcrum_config::Cluster, user: &str) -> String {
    c.pool_mode_of(user).name().into()
}
