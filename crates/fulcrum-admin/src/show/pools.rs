//! SHOW POOLS and SHOW DATABASES: the server connection pools, one by
//! one with their budgets, and summed per database.

use bytes::BytesMut;

use super::pool_mode;
use crate::rows::result;
use crate::Admin;

impl Admin {
    /// SHOW POOLS: a row per pool, with the budgets it counts against.
    pub(super) fn show_pools(&self, out: &mut BytesMut) {
        let mut rows = Vec::new();
        for c in &self.clusters() {
            let pools = c.pools();
            // Open connections per (backend, database) and (backend, user),
            // what max_db_connections and max_user_connections cap.
            let mut per_db: std::collections::HashMap<(&str, &str), usize> = Default::default();
            let mut per_user: std::collections::HashMap<(&str, &str), usize> = Default::default();
            for p in &pools {
                *per_db.entry((&p.backend, &p.database)).or_default() += p.active + p.idle;
                *per_user.entry((&p.backend, &p.user)).or_default() += p.active + p.idle;
            }
            let config = c.config();
            let b = &config.budgets;
            for p in &pools {
                rows.push(vec![
                    config.name.clone(),
                    p.database.clone(),
                    p.user.clone(),
                    p.backend.clone(),
                    p.active.to_string(),
                    p.idle.to_string(),
                    p.opened.to_string(),
                    p.closed.to_string(),
                    p.waits.to_string(),
                    pool_mode(config),
                    config.pool_size.to_string(),
                    b.min_pool_size.to_string(),
                    b.reserve_pool_size.to_string(),
                    p.reserve.to_string(),
                    per_db[&(p.backend.as_str(), p.database.as_str())].to_string(),
                    b.max_db_connections.to_string(),
                    per_user[&(p.backend.as_str(), p.user.as_str())].to_string(),
                    b.max_user_connections.to_string(),
                ]);
            }
        }
        result(
            out,
            &[
                "cluster",
                "database",
                "user",
                "backend",
                "sv_active",
                "sv_idle",
                "sv_opened",
                "sv_closed",
                "waits",
                "pool_mode",
                "pool_size",
                "min_pool_size",
                "reserve_pool_size",
                "sv_reserve",
                "db_connections",
                "max_db_connections",
                "user_connections",
                "max_user_connections",
            ],
            &rows,
        );
    }

    /// SHOW DATABASES: the pools summed per (cluster, database).
    pub(super) fn show_databases(&self, out: &mut BytesMut) {
        let mut rows = Vec::new();
        for c in &self.clusters() {
            let mut by_db: std::collections::BTreeMap<String, (usize, usize, usize)> =
                Default::default();
            for p in c.pools() {
                let e = by_db.entry(p.database).or_default();
                e.0 += 1;
                e.1 += p.active;
                e.2 += p.idle;
            }
            for (database, (pools, active, idle)) in by_db {
                rows.push(vec![
                    c.config().name.clone(),
                    database,
                    c.config().backends.len().to_string(),
                    pools.to_string(),
                    c.config().pool_size.to_string(),
                    pool_mode(c.config()),
                    active.to_string(),
                    idle.to_string(),
                ]);
            }
        }
        result(
            out,
            &[
                "cluster",
                "database",
                "backends",
                "pools",
                "pool_size",
                "pool_mode",
                "sv_active",
                "sv_idle",
            ],
            &rows,
        );
    }
}
