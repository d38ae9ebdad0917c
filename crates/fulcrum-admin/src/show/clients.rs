//! SHOW CLIENTS and SHOW USERS: the clients connected now (from the
//! client registry), and the users each cluster knows; SHOW LISTENERS:
//! the listening connections serving clients' LISTEN; SHOW MIRROR:
//! mirroring's diff.

use bytes::BytesMut;
use fulcrum_net::ClientPeer;

use super::user_pool_mode;
use crate::rows::result;
use crate::Admin;

impl Admin {
    /// SHOW CLIENTS: a row per client connected now.
    pub(super) fn show_clients(&self, out: &mut BytesMut) {
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
                // As PgBouncer: a Unix-socket client's addr is "unix" and
                // its port the listener's; its pid is `remote_pid`.
                let (addr, port, pid, uid) = match &e.peer {
                    ClientPeer::Tcp(a) => (a.ip().to_string(), a.port(), 0, String::new()),
                    ClientPeer::Unix(u) => (
                        "unix".to_owned(),
                        u.port,
                        u.pid.unwrap_or(0),
                        u.uid.map_or(String::new(), |uid| uid.to_string()),
                    ),
                };
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
                    addr,
                    port.to_string(),
                    crate::rows::utc_time(e.connected_ms),
                    crate::rows::utc_time(e.since_ms()),
                    (waited_ms / 1000).to_string(),
                    ((waited_ms % 1000) * 1000).to_string(),
                    e.cluster.to_string(),
                    server,
                    e.id.to_string(),
                    pid.to_string(),
                    uid,
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
                "remote_pid",
                "uid",
            ],
            &rows,
        );
    }

    /// SHOW USERS: the configured users of each cluster, and its auth_query.
    pub(super) fn show_users(&self, out: &mut BytesMut) {
        let mut rows = Vec::new();
        for c in &self.clusters() {
            let config = c.config();
            for u in &config.users {
                rows.push(vec![
                    config.name.clone(),
                    u.name.clone(),
                    u.server_user().to_owned(),
                    "config".into(),
                    user_pool_mode(config, &u.name),
                ]);
            }
            if let Some(aq) = &config.auth_query {
                rows.push(vec![
                    config.name.clone(),
                    "*".into(),
                    "*".into(),
                    format!("auth_query as {}", aq.user),
                    config
                        .user_default
                        .pool_mode
                        .unwrap_or(config.pool_mode)
                        .name()
                        .into(),
                ]);
            }
        }
        result(
            out,
            &["cluster", "name", "server_user", "source", "pool_mode"],
            &rows,
        );
    }

    /// SHOW LISTENERS: each listening connection of LISTEN/NOTIFY
    /// (PostgreSQL, transaction pooling): per cluster, database and user.
    pub(super) fn show_listeners(&self, out: &mut BytesMut) {
        let mut rows = Vec::new();
        for c in &self.clusters() {
            for l in c.listeners() {
                rows.push(vec![
                    c.config().name.clone(),
                    l.database,
                    l.user,
                    l.channels.to_string(),
                    l.clients.to_string(),
                    l.subscriptions.to_string(),
                    l.backend.unwrap_or_default(),
                    l.reconnects.to_string(),
                ]);
            }
        }
        result(
            out,
            &[
                "cluster",
                "database",
                "user",
                "channels",
                "clients",
                "subscriptions",
                "backend",
                "reconnects",
            ],
            &rows,
        );
    }

    /// SHOW MIRROR: per cluster, mirror target and statement digest, the
    /// units mirrored, dropped and answered differently, and the p50/p99
    /// latency of each side.
    pub(super) fn show_mirror(&self, out: &mut BytesMut) {
        let ms = |v: f64| format!("{v:.3}");
        let mut rows = Vec::new();
        for c in &self.clusters() {
            for stats in c.mirrors() {
                for r in stats.rows() {
                    rows.push(vec![
                        c.config().name.clone(),
                        stats.target.clone(),
                        format!("{:016x}", r.digest),
                        r.query,
                        r.sent.to_string(),
                        r.dropped.to_string(),
                        r.differing.to_string(),
                        ms(r.primary_ms.0),
                        ms(r.primary_ms.1),
                        ms(r.mirror_ms.0),
                        ms(r.mirror_ms.1),
                    ]);
                }
            }
        }
        result(
            out,
            &[
                "cluster",
                "target",
                "digest",
                "query",
                "sent",
                "dropped",
                "differing",
                "primary_p50_ms",
                "primary_p99_ms",
                "mirror_p50_ms",
                "mirror_p99_ms",
            ],
            &rows,
        );
    }
}
