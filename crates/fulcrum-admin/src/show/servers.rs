//! SHOW SERVERS in PgBouncer's shape: one row per server connection
//! (`fulcrum_pool::servers`), PgBouncer's columns in its order, then
//! Fulcrum's (cluster, backend, role). The per-backend table is SHOW
//! BACKENDS (`topology`).

use bytes::BytesMut;
use fulcrum_pool::ServerRow;

use crate::rows::{result, utc_time};
use crate::Admin;

/// PgBouncer's columns, then Fulcrum's.
pub(crate) const COLUMNS: [&str; 21] = [
    "type",
    "user",
    "database",
    "state",
    "addr",
    "port",
    "local_addr",
    "local_port",
    "connect_time",
    "request_time",
    "wait",
    "wait_us",
    "close_needed",
    "ptr",
    "link",
    "remote_pid",
    "tls",
    "application_name",
    "cluster",
    "backend",
    "role",
];

/// A server connection's row under [`COLUMNS`]; `role` is its backend's.
/// Where the connection did not say where it is connected, `addr` and
/// `port` are the backend's configured address (the one it dialled).
pub(crate) fn row(r: &ServerRow, role: &str) -> Vec<String> {
    let id = &r.identity;
    let (addr, port) = if id.addr.is_empty() {
        match r.labels.backend.rsplit_once(':') {
            Some((host, port)) => (
                host.trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned(),
                port.to_owned(),
            ),
            None => (r.labels.backend.to_string(), "0".into()),
        }
    } else {
        (id.addr.clone(), id.port.to_string())
    };
    vec![
        "S".into(),
        r.labels.user.to_string(),
        r.labels.database.to_string(),
        r.state.as_str().into(),
        addr,
        port,
        id.local_addr.clone(),
        id.local_port.to_string(),
        utc_time(r.connect_unix_ms),
        utc_time(r.request_unix_ms),
        // PgBouncer: not used for server connections.
        "0".into(),
        "0".into(),
        u8::from(r.close_needed).to_string(),
        format!("{:#x}", r.id),
        // The client it serves (SHOW CLIENTS' id); empty when unlinked,
        // as PgBouncer shows an idle server.
        r.link.map(|c| c.to_string()).unwrap_or_default(),
        id.remote_pid.to_string(),
        id.tls.clone(),
        id.application_name.clone(),
        r.labels.cluster.to_string(),
        r.labels.backend.to_string(),
        role.into(),
    ]
}

impl Admin {
    /// SHOW SERVERS: each open server connection of every cluster's pools.
    pub(super) fn show_servers(&self, out: &mut BytesMut) {
        let clusters = self.clusters();
        let rows: Vec<Vec<String>> = fulcrum_pool::servers::snapshot()
            .iter()
            .map(|r| {
                let role = clusters
                    .iter()
                    .find(|c| *c.config().name == *r.labels.cluster)
                    .and_then(|c| {
                        let i = c
                            .config()
                            .backends
                            .iter()
                            .position(|b| *b.address == *r.labels.backend)?;
                        Some(if c.router().is_primary(i) {
                            "primary"
                        } else {
                            "replica"
                        })
                    })
                    .unwrap_or_default();
                row(r, role)
            })
            .collect();
        result(out, &COLUMNS, &rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fulcrum_pool::{PoolLabels, ServerIdentity, ServerState};

    fn server(identity: ServerIdentity) -> ServerRow {
        ServerRow {
            labels: PoolLabels {
                cluster: "main".into(),
                backend: "10.0.0.5:5432".into(),
                user: "app".into(),
                database: "shop".into(),
            },
            id: 255,
            state: ServerState::Active,
            identity,
            connect_unix_ms: 951_782_400_000,
            request_unix_ms: 951_782_401_000,
            close_needed: true,
            link: Some(7),
        }
    }

    #[test]
    fn a_row_has_pgbouncer_columns_first() {
        let r = row(
            &server(ServerIdentity {
                addr: "10.0.0.5".into(),
                port: 5432,
                local_addr: "10.0.0.9".into(),
                local_port: 40000,
                remote_pid: 4242,
                tls: "TLSv1.3".into(),
                application_name: "psql".into(),
            }),
            "primary",
        );
        assert_eq!(r.len(), COLUMNS.len());
        assert_eq!(
            r,
            [
                "S",
                "app",
                "shop",
                "active",
                "10.0.0.5",
                "5432",
                "10.0.0.9",
                "40000",
                "2000-02-29 00:00:00",
                "2000-02-29 00:00:01",
                "0",
                "0",
                "1",
                "0xff",
                "7",
                "4242",
                "TLSv1.3",
                "psql",
                "main",
                "10.0.0.5:5432",
                "primary"
            ]
        );
        // A connection that did not say: the address it dialled.
        let r = row(&server(ServerIdentity::default()), "replica");
        assert_eq!((&*r[4], &*r[5], &*r[15]), ("10.0.0.5", "5432", "0"));
    }
}
