//! SHOW POOLS (PgBouncer's shape: a row per database and user, clients
//! and server connections), SHOW SERVER_POOLS (Fulcrum's pools one by
//! one, per backend, with their budgets) and SHOW DATABASES (summed per
//! database).

use bytes::BytesMut;

use super::{pool_mode, user_pool_mode};
use crate::rows::result;
use crate::Admin;

impl Admin {
    /// SHOW POOLS, PgBouncer's columns first: a row per (cluster,
    /// database, user) with its clients (active: holding a server
    /// connection; waiting: for one), its server connections over every
    /// backend, and the longest wait now; then Fulcrum's budgets. The
    /// columns PgBouncer has and Fulcrum has no such state for
    /// (cancel requests in flight, servers being tested or logging in) are 0.
    pub(super) fn show_pools(&self, out: &mut BytesMut) {
        use std::collections::BTreeMap;
        #[derive(Default)]
        struct Row {
            cl_active: usize,
            cl_waiting: usize,
            sv_active: usize,
            sv_idle: usize,
            sv_used: usize,
            sv_reserve: usize,
            opened: u64,
            closed: u64,
            waits: u64,
            maxwait_us: u64,
            backends: usize,
        }
        // The clients' state times are the coarse wall clock's ms.
        let now = fulcrum_pool::coarse::unix_ms();
        let clients = fulcrum_cluster::clients::registry().snapshot();
        let mut rows = Vec::new();
        for c in &self.clusters() {
            let config = c.config();
            let mut by: BTreeMap<(String, String), Row> = BTreeMap::new();
            for p in c.pools() {
                let r = by.entry((p.database.clone(), p.user.clone())).or_default();
                r.sv_active += p.active;
                // PgBouncer's idle and used are apart: used ones are
                // checked (server_check_delay) before their next use.
                r.sv_idle += p.idle - p.used;
                r.sv_used += p.used;
                r.sv_reserve += p.reserve;
                r.opened += p.opened;
                r.closed += p.closed;
                r.waits += p.waits;
                r.backends += 1;
            }
            for e in clients.iter().filter(|e| *e.cluster == *config.name) {
                let r = by
                    .entry((e.database.to_string(), e.user.to_string()))
                    .or_default();
                match e.state() {
                    fulcrum_cluster::clients::ClientState::Active => r.cl_active += 1,
                    fulcrum_cluster::clients::ClientState::Waiting => {
                        r.cl_waiting += 1;
                        let waited = now.saturating_sub(e.since_ms()) * 1000;
                        r.maxwait_us = r.maxwait_us.max(waited);
                    }
                    _ => {}
                }
            }
            let b = &config.budgets;
            for ((database, user), r) in by {
                let (mode, size) = (user_pool_mode(config, &user), config.pool_size_of(&user));
                rows.push(vec![
                    database,
                    user,
                    r.cl_active.to_string(),
                    r.cl_waiting.to_string(),
                    "0".into(),
                    "0".into(),
                    r.sv_active.to_string(),
                    "0".into(),
                    "0".into(),
                    r.sv_idle.to_string(),
                    r.sv_used.to_string(),
                    "0".into(),
                    "0".into(),
                    (r.maxwait_us / 1_000_000).to_string(),
                    (r.maxwait_us % 1_000_000).to_string(),
                    mode,
                    config.name.clone(),
                    r.backends.to_string(),
                    size.to_string(),
                    b.min_pool_size.to_string(),
                    b.reserve_pool_size.to_string(),
                    r.sv_reserve.to_string(),
                    r.opened.to_string(),
                    r.closed.to_string(),
                    r.waits.to_string(),
                ]);
            }
        }
        result(
            out,
            &[
                "database",
                "user",
                "cl_active",
                "cl_waiting",
                "cl_active_cancel_req",
                "cl_waiting_cancel_req",
                "sv_active",
                "sv_active_cancel",
                "sv_being_canceled",
                "sv_idle",
                "sv_used",
                "sv_tested",
                "sv_login",
                "maxwait",
                "maxwait_us",
                "pool_mode",
                "cluster",
                "backends",
                "pool_size",
                "min_pool_size",
                "reserve_pool_size",
                "sv_reserve",
                "sv_opened",
                "sv_closed",
                "waits",
            ],
            &rows,
        );
    }

    /// SHOW SERVER_POOLS: a row per pool (backend, user, database), with
    /// the budgets it counts against.
    pub(super) fn show_server_pools(&self, out: &mut BytesMut) {
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
                    user_pool_mode(config, &p.user),
                    config.pool_size_of(&p.user).to_string(),
                    b.min_pool_size.to_string(),
                    b.reserve_pool_size.to_string(),
                    p.reserve.to_string(),
                    per_db[&(p.backend.as_str(), p.database.as_str())].to_string(),
                    b.max_db_connections.to_string(),
                    per_user[&(p.backend.as_str(), p.user.as_str())].to_string(),
                    config.max_user_connections_of(&p.user).to_string(),
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

    /// SHOW DATABASES: the pools summed per (cluster, database), with
    /// PgBouncer's column names where the idea is the same (`name`,
    /// `pool_size`, `min_pool_size`, `reserve_pool`, `pool_mode`,
    /// `max_connections`, `current_connections`, `paused`, `disabled`).
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
            let config = c.config();
            let b = &config.budgets;
            for (database, (pools, active, idle)) in by_db {
                rows.push(vec![
                    config.name.clone(),
                    database.clone(),
                    config.backends.len().to_string(),
                    pools.to_string(),
                    config.pool_size.to_string(),
                    pool_mode(config),
                    active.to_string(),
                    idle.to_string(),
                    database,
                    b.min_pool_size.to_string(),
                    b.reserve_pool_size.to_string(),
                    b.max_db_connections.to_string(),
                    (active + idle).to_string(),
                    i32::from(c.router().is_paused()).to_string(),
                    "0".into(),
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
                "name",
                "min_pool_size",
                "reserve_pool",
                "max_connections",
                "current_connections",
                "paused",
                "disabled",
            ],
            &rows,
        );
    }
}
