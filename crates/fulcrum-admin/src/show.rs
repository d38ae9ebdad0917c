//! The `SHOW` tables, PgBouncer's column names where the concept is the
//! same: which table is which (one module per group: `topology` for
//! CLUSTERS and SERVERS, `pools` for POOLS and DATABASES, `clients` for
//! CLIENTS and USERS, `settings` for CONFIG, LISTS, STATS, TOTALS and
//! VERSION; QUERIES and MEM are `queries`'), and the labels they share.

mod clients;
mod pools;
mod settings;
mod topology;

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
            Show::Clients => self.show_clients(out),
            Show::Mem => self.show_mem(out),
            Show::Stats => self.show_stats(false, out),
            Show::Totals => self.show_stats(true, out),
            Show::Config => self.show_config(out),
            Show::Lists => self.show_lists(out),
        }
    }
}

fn protocol(c: &fulcrum_config::Cluster) -> String {
    match c.protocol {
        fulcrum_config::Protocol::Postgres => "postgres".into(),
        fulcrum_config::Protocol::Mysql => "mysql".into(),
    }
}

fn pool_mode(c: &fulcrum_config::Cluster) -> String {
    match c.pool_mode {
        fulcrum_config::PoolMode::Session => "session".into(),
        fulcrum_config::PoolMode::Transaction => "transaction".into(),
    }
}
