//! Running one console command: the `SHOW` tables (PgBouncer's column names
//! where the concept is the same) and the operator commands.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use fulcrum_cluster::ClusterAdmin;
use fulcrum_postgres::codec::backend_msg;

use crate::command::{Command, Show};
use crate::rows::result;
use crate::stats::StatFigures;
use crate::Admin;

/// How long PAUSE waits for transactions in progress to finish.
const PAUSE_WAIT: Duration = Duration::from_secs(60);

pub(crate) type Failure = (&'static str, String);

impl Admin {
    pub(crate) async fn execute(&self, cmd: Command, out: &mut BytesMut) -> Result<(), Failure> {
        match cmd {
            Command::Show(what) => {
                self.show(what, out);
                Ok(())
            }
            Command::Pause(target) => {
                let clusters = self.targets(target.as_deref())?;
                for c in &clusters {
                    c.router().set_paused(true);
                }
                // Wait for the transactions in progress to finish.
                let deadline = tokio::time::Instant::now() + PAUSE_WAIT;
                while clusters
                    .iter()
                    .any(|c| c.router().total_load() + c.router().admitting() > 0)
                {
                    if tokio::time::Instant::now() >= deadline {
                        return Err((
                            "57014",
                            "fulcrum admin: paused, but transactions still hold server connections after 60s".into(),
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                backend_msg::command_complete(out, "PAUSE");
                Ok(())
            }
            Command::ShowQueries(target) => self.show_queries(target.as_deref(), out),
            Command::Kill(database) => {
                let mut clients = 0;
                for e in fulcrum_cluster::clients::registry().snapshot() {
                    if *e.database == *database {
                        e.kill();
                        clients += 1;
                    }
                }
                let mut pools = 0;
                for c in self.clusters() {
                    pools += c.reconnect(Some(&database));
                }
                tracing::info!(%database, clients, pools, "admin KILL");
                backend_msg::command_complete(out, "KILL");
                Ok(())
            }
            Command::Reconnect(database) => {
                for c in self.clusters() {
                    c.reconnect(database.as_deref());
                }
                backend_msg::command_complete(out, "RECONNECT");
                Ok(())
            }
            Command::WaitClose(database) => {
                let deadline = tokio::time::Instant::now() + PAUSE_WAIT;
                loop {
                    let left: usize = self
                        .clusters()
                        .iter()
                        .map(|c| c.retiring(database.as_deref()))
                        .sum();
                    if left == 0 {
                        break;
                    }
                    if tokio::time::Instant::now() >= deadline {
                        return Err((
                            "57014",
                            format!("fulcrum admin: {left} server connections still in use after 60s; they close when their transactions end"),
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                backend_msg::command_complete(out, "WAIT_CLOSE");
                Ok(())
            }
            Command::ResetQueries(target) => {
                for c in self.targets(target.as_deref())? {
                    c.digests().reset();
                }
                backend_msg::command_complete(out, "RESET");
                Ok(())
            }
            Command::Resume(target) => {
                for c in self.targets(target.as_deref())? {
                    c.router().set_paused(false);
                }
                backend_msg::command_complete(out, "RESUME");
                Ok(())
            }
            Command::Disable(target) => self.set_disabled(&target, true, out),
            Command::Enable(target) => self.set_disabled(&target, false, out),
            Command::Reload => {
                let tx = self.reload.as_ref().ok_or((
                    "55000",
                    "fulcrum admin: reload is not available".to_string(),
                ))?;
                let (reply, rx) = tokio::sync::oneshot::channel();
                tx.send(reply).await.map_err(|_| {
                    (
                        "55000",
                        "fulcrum admin: the daemon is shutting down".to_string(),
                    )
                })?;
                let summary = rx
                    .await
                    .map_err(|_| {
                        (
                            "55000",
                            "fulcrum admin: the reload did not answer".to_string(),
                        )
                    })?
                    .map_err(|e| {
                        (
                            "F0000",
                            format!(
                                "fulcrum admin: config not reloaded, the running config stays: {e}"
                            ),
                        )
                    })?;
                crate::rows::result(out, &["reload"], &[vec![summary]]);
                Ok(())
            }
            Command::Switchover { cluster, backend } => {
                let c = self.cluster(&cluster).ok_or_else(|| {
                    (
                        "42704",
                        format!("fulcrum admin: no cluster named {cluster:?}"),
                    )
                })?;
                let target = c
                    .config()
                    .backends
                    .iter()
                    .position(|b| b.address == backend)
                    .ok_or_else(|| {
                        (
                            "42704",
                            format!(
                                "fulcrum admin: cluster {cluster:?} has no backend {backend:?}"
                            ),
                        )
                    })?;
                let handle = c.monitor().ok_or((
                    "55000",
                    "fulcrum admin: the health loop is not running".to_string(),
                ))?;
                let held = handle
                    .switchover(target)
                    .await
                    .map_err(|e| ("55000", format!("fulcrum admin: switchover not done: {e}")))?;
                crate::rows::result(
                    out,
                    &["cluster", "new_primary", "held_ms"],
                    &[vec![cluster, backend, held.as_millis().to_string()]],
                );
                Ok(())
            }
            Command::SetLog(filter) => {
                (self.set_log)(&filter).map_err(|e| ("22023", format!("fulcrum admin: {e}")))?;
                tracing::info!(filter = %filter, "log filter changed");
                backend_msg::command_complete(out, "SET");
                Ok(())
            }
        }
    }

    pub(crate) fn targets(
        &self,
        name: Option<&str>,
    ) -> Result<Vec<Arc<dyn ClusterAdmin>>, Failure> {
        match name {
            None => Ok(self.clusters()),
            Some(n) => self
                .cluster(n)
                .map(|c| vec![c])
                .ok_or_else(|| ("42704", format!("fulcrum admin: no cluster named {n:?}"))),
        }
    }

    /// A backend named by address, or `cluster/address` when two clusters share it.
    fn backend(&self, target: &str) -> Result<(Arc<dyn ClusterAdmin>, usize), Failure> {
        let (cluster, address) = match target.split_once('/') {
            Some((c, a))
                if !c.starts_with('[')
                    && !c.is_empty()
                    && !a.is_empty()
                    && !target.starts_with('/') =>
            {
                (Some(c), a)
            }
            _ => (None, target),
        };
        let found: Vec<(Arc<dyn ClusterAdmin>, usize)> = self
            .clusters()
            .iter()
            .filter(|c| cluster.is_none_or(|n| c.config().name == n))
            .flat_map(|c| {
                c.config()
                    .backends
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| b.address == address)
                    .map(|(i, _)| (c.clone(), i))
                    .collect::<Vec<_>>()
            })
            .collect();
        match found.len() {
            1 => Ok(found.into_iter().next().expect("one")),
            0 => Err((
                "42704",
                format!("fulcrum admin: no backend {target:?}; SHOW CLUSTERS lists them"),
            )),
            _ => Err((
                "42725",
                format!("fulcrum admin: {address:?} is in several clusters; say cluster/address"),
            )),
        }
    }

    pub(crate) fn set_disabled(
        &self,
        target: &str,
        disabled: bool,
        out: &mut BytesMut,
    ) -> Result<(), Failure> {
        let (c, b) = self.backend(target)?;
        if disabled && c.router().is_primary(b) {
            return Err((
                "55000",
                format!("fulcrum admin: {target} is the primary of cluster {:?}; it cannot be drained (a planned SWITCHOVER would move it)", c.config().name),
            ));
        }
        c.router().set_disabled(b, disabled);
        tracing::warn!(cluster = %c.config().name, backend = %target, disabled, "backend {} by an operator", if disabled { "disabled" } else { "enabled" });
        backend_msg::command_complete(out, if disabled { "DISABLE" } else { "ENABLE" });
        Ok(())
    }

    fn show(&self, what: Show, out: &mut BytesMut) {
        match what {
            Show::Version => result(
                out,
                &["version"],
                &[vec![format!("Fulcrum {}", env!("CARGO_PKG_VERSION"))]],
            ),
            Show::Clusters => {
                let mut rows = Vec::new();
                for c in &self.clusters() {
                    let cfg = c.config();
                    let blocked = c.view().failover_blocked().unwrap_or_default();
                    for (i, v) in c.view().backends().iter().enumerate() {
                        let role = if c.router().is_primary(i) {
                            "primary"
                        } else if v.writable == Some(true) {
                            "writable (not the primary)"
                        } else {
                            "replica"
                        };
                        rows.push(vec![
                            cfg.name.clone(),
                            protocol(cfg),
                            v.address.clone(),
                            role.into(),
                            v.state.as_str().into(),
                            v.lag_bytes.to_string(),
                            format!("{:.3}", v.lag_time.as_secs_f64()),
                            cfg.backends[i].weight.to_string(),
                            c.router().is_disabled(i).to_string(),
                            c.router().is_paused().to_string(),
                            blocked.clone(),
                        ]);
                    }
                }
                result(
                    out,
                    &[
                        "cluster",
                        "protocol",
                        "backend",
                        "role",
                        "state",
                        "lag_bytes",
                        "lag_seconds",
                        "weight",
                        "disabled",
                        "paused",
                        "failover_blocked",
                    ],
                    &rows,
                );
            }
            Show::Pools => {
                let mut rows = Vec::new();
                for c in &self.clusters() {
                    let pools = c.pools();
                    // Open connections per (backend, database) and (backend, user),
                    // what max_db_connections and max_user_connections cap.
                    let mut per_db: std::collections::HashMap<(&str, &str), usize> =
                        Default::default();
                    let mut per_user: std::collections::HashMap<(&str, &str), usize> =
                        Default::default();
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
            Show::Databases => {
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
            Show::Users => {
                let mut rows = Vec::new();
                for c in &self.clusters() {
                    let config = c.config();
                    for u in &config.users {
                        rows.push(vec![
                            config.name.clone(),
                            u.name.clone(),
                            u.server_user().to_owned(),
                            "config".into(),
                            pool_mode(config),
                        ]);
                    }
                    if let Some(aq) = &config.auth_query {
                        rows.push(vec![
                            config.name.clone(),
                            "*".into(),
                            "*".into(),
                            format!("auth_query as {}", aq.user),
                            pool_mode(config),
                        ]);
                    }
                }
                result(
                    out,
                    &["cluster", "name", "server_user", "source", "pool_mode"],
                    &rows,
                );
            }
            Show::Servers => {
                let mut rows = Vec::new();
                for c in &self.clusters() {
                    let pools = c.pools();
                    for (i, v) in c.view().backends().iter().enumerate() {
                        let mine = pools.iter().filter(|p| p.backend == v.address);
                        let (active, idle) =
                            mine.fold((0, 0), |(a, d), p| (a + p.active, d + p.idle));
                        rows.push(vec![
                            c.config().name.clone(),
                            v.address.clone(),
                            if c.router().is_primary(i) {
                                "primary"
                            } else {
                                "replica"
                            }
                            .into(),
                            v.state.as_str().into(),
                            if v.probe_login_refused {
                                "login refused"
                            } else if v.last_error.is_some() {
                                "failing"
                            } else {
                                "ok"
                            }
                            .into(),
                            active.to_string(),
                            idle.to_string(),
                            v.last_error.clone().unwrap_or_default(),
                            crate::reason::reason(
                                v,
                                c.router().is_disabled(i),
                                c.config().health.max_lag.as_ref(),
                            ),
                        ]);
                    }
                }
                result(
                    out,
                    &[
                        "cluster",
                        "backend",
                        "role",
                        "state",
                        "probe",
                        "sv_active",
                        "sv_idle",
                        "last_error",
                        "reason",
                    ],
                    &rows,
                );
            }
            Show::Clients => {
                let clusters = self.clusters();
                let now = crate::rows::now_ms();
                let rows: Vec<Vec<String>> = fulcrum_cluster::clients::registry()
                    .snapshot()
                    .iter()
                    .map(|e| {
                        let state = e.state();
                        let server = e
                            .backend()
                            .and_then(|b| {
                                let c = clusters.iter().find(|c| *c.config().name == *e.cluster)?;
                                Some(c.config().backends.get(b)?.address.clone())
                            })
                            .unwrap_or_default();
                        let waited_ms = if state == fulcrum_cluster::clients::ClientState::Waiting {
                            now.saturating_sub(e.since_ms())
                        } else {
                            0
                        };
                        vec![
                            "C".into(),
                            e.user.to_string(),
                            e.database.to_string(),
                            state.as_str().into(),
                            e.peer.ip().to_string(),
                            e.peer.port().to_string(),
                            crate::rows::utc_time(e.connected_ms),
                            crate::rows::utc_time(e.since_ms()),
                            (waited_ms / 1000).to_string(),
                            ((waited_ms % 1000) * 1000).to_string(),
                            e.cluster.to_string(),
                            server,
                            e.id.to_string(),
                        ]
                    })
                    .collect();
                result(
                    out,
                    &[
                        "type",
                        "user",
                        "database",
                        "state",
                        "addr",
                        "port",
                        "connect_time",
                        "request_time",
                        "wait",
                        "wait_us",
                        "cluster",
                        "server",
                        "id",
                    ],
                    &rows,
                );
            }
            Show::Mem => self.show_mem(out),
            Show::Stats | Show::Totals => {
                let per_cluster: Vec<(String, StatFigures)> = self
                    .clusters()
                    .iter()
                    .map(|c| {
                        (
                            c.config().name.clone(),
                            StatFigures::of(&self.metrics, c.as_ref()),
                        )
                    })
                    .collect();
                let rows: Vec<Vec<String>> = if what == Show::Totals {
                    let mut all = StatFigures::default();
                    for (_, f) in &per_cluster {
                        all.add(f);
                    }
                    vec![all.row("total")]
                } else {
                    per_cluster.iter().map(|(n, f)| f.row(n)).collect()
                };
                result(out, &StatFigures::COLUMNS, &rows);
            }
            Show::Config => {
                let config = self.config();
                let g = &config.fulcrum;
                let opt =
                    |a: Option<std::net::SocketAddr>| a.map_or("off".to_owned(), |a| a.to_string());
                let mut rows = vec![
                    vec!["fulcrum.admin".into(), opt(g.admin)],
                    vec!["fulcrum.metrics".into(), opt(g.metrics)],
                    vec!["fulcrum.log".into(), g.log.clone()],
                    vec!["fulcrum.workers".into(), g.workers.to_string()],
                    vec![
                        "fulcrum.shutdown_timeout".into(),
                        format!("{:?}", g.shutdown_timeout),
                    ],
                    vec!["fulcrum.admin_auth".into(), g.admin_auth.name().into()],
                ];
                for c in &config.clusters {
                    let k = |key: &str| format!("cluster.{}.{key}", c.name);
                    rows.extend([
                        vec![k("protocol"), protocol(c)],
                        vec![k("listen"), c.listen.to_string()],
                        vec![k("pool_mode"), pool_mode(c)],
                        vec![k("pool_size"), c.pool_size.to_string()],
                        vec![k("balance"), format!("{:?}", c.balance)],
                        vec![k("failover"), format!("{:?}", c.health.failover)],
                        vec![k("health_interval"), format!("{:?}", c.health.interval)],
                        vec![k("max_lag"), format!("{:?}", c.health.max_lag)],
                        vec![
                            k("backends"),
                            c.backends
                                .iter()
                                .map(|b| b.address.as_str())
                                .collect::<Vec<_>>()
                                .join(", "),
                        ],
                        vec![
                            k("users"),
                            c.users
                                .iter()
                                .map(|u| u.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", "),
                        ],
                    ]);
                }
                result(out, &["key", "value"], &rows);
            }
            Show::Lists => {
                let backends: usize = self
                    .clusters()
                    .iter()
                    .map(|c| c.config().backends.len())
                    .sum();
                let pools: usize = self.clusters().iter().map(|c| c.pools().len()).sum();
                let clients: i64 = self.clusters().iter().map(|c| c.clients()).sum();
                let rows = vec![
                    vec!["clusters".into(), self.clusters().len().to_string()],
                    vec!["backends".into(), backends.to_string()],
                    vec!["pools".into(), pools.to_string()],
                    vec!["clients".into(), clients.to_string()],
                    vec!["admin_users".into(), self.users().len().to_string()],
                ];
                result(out, &["list", "items"], &rows);
            }
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
