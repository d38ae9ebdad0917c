//! The health loop's MariaDB operations (`fulcrum_cluster::ServerOps`), over
//! mysql_async connections kept per backend (re-opened after any error):
//! role from `@@read_only`; positions from GTIDs (`@@gtid_binlog_pos` on a
//! primary, `@@gtid_slave_pos` replayed and `Gtid_IO_Pos` received on a
//! replica); lag in time from `Seconds_Behind_Master`. Promotion for GTID
//! replication: `STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0`;
//! re-pointing: `CHANGE MASTER TO ... MASTER_USE_GTID = slave_pos`.
//!
//! The probe login needs `REPLICATION CLIENT` (SHOW SLAVE STATUS); promotion
//! needs `SUPER` (or READ_ONLY ADMIN and REPLICATION SLAVE ADMIN).

use std::time::Duration;

use fulcrum_cluster::{Observation, OpsError, ServerOps};
use fulcrum_config::Cluster;
use fulcrum_pool::BackendId;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, OptsBuilder, Row};
use tokio::sync::Mutex;

use super::gtid::gtid_position;

pub struct MariaServerOps {
    addresses: Vec<String>,
    /// Each backend's `server_tls`, which the probes follow too.
    tls: Vec<fulcrum_config::ServerTls>,
    user: String,
    password: String,
    /// Empty: no default database (the probe needs none).
    database: String,
    connect_timeout: Duration,
    conns: Vec<Mutex<Option<Conn>>>,
}

/// What one probe read, before it becomes an observation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeAnswer {
    pub read_only: bool,
    pub binlog_pos: String,
    pub slave_pos: String,
    /// From SHOW SLAVE STATUS, when the server replicates.
    pub io_pos: Option<String>,
    pub seconds_behind: Option<u64>,
    /// SHOW SLAVE STATUS returned a row (`None`: not allowed to look).
    pub replicates: Option<bool>,
}

/// The observation a probe answer gives.
pub fn observe(a: &ProbeAnswer) -> Result<Observation, OpsError> {
    let bad = |what: &str, v: &str| OpsError::Query(format!("unexpected {what}: {v:?}"));
    if !a.read_only {
        let position =
            gtid_position(&a.binlog_pos).ok_or_else(|| bad("@@gtid_binlog_pos", &a.binlog_pos))?;
        return Ok(Observation {
            writable: true,
            timeline: 0,
            position,
            received: position,
            replay_age: None,
            detached: false,
        });
    }
    let replayed =
        gtid_position(&a.slave_pos).ok_or_else(|| bad("@@gtid_slave_pos", &a.slave_pos))?;
    let received = match &a.io_pos {
        Some(io) => gtid_position(io).ok_or_else(|| bad("Gtid_IO_Pos", io))?,
        None => replayed,
    };
    Ok(Observation {
        writable: false,
        timeline: 0,
        position: replayed,
        received: received.max(replayed),
        replay_age: a.seconds_behind.map(Duration::from_secs),
        detached: a.replicates == Some(false),
    })
}

/// `CHANGE MASTER TO` pointing a replica at `address` (`host:port`), keeping
/// its user and password.
pub fn change_master_sql(address: &str) -> String {
    let (host, port) = match address.rsplit_once(':') {
        Some((h, p)) => (h.trim_start_matches('[').trim_end_matches(']'), p),
        None => (address, "3306"),
    };
    let port: u16 = port.parse().unwrap_or(3306);
    format!(
        "CHANGE MASTER TO MASTER_HOST = '{}', MASTER_PORT = {port}, MASTER_USE_GTID = slave_pos",
        host.replace('\\', "\\\\").replace('\'', "\\'")
    )
}

impl MariaServerOps {
    pub fn new(config: &Cluster) -> MariaServerOps {
        MariaServerOps {
            addresses: config.backends.iter().map(|b| b.address.clone()).collect(),
            tls: config.backends.iter().map(|b| b.tls.clone()).collect(),
            user: config.health.user.clone(),
            password: config.health.password.clone(),
            database: config.health.database.clone(),
            connect_timeout: config.health.timeout.min(config.connect_timeout),
            conns: config.backends.iter().map(|_| Mutex::new(None)).collect(),
        }
    }

    /// Runs `f` on `backend`'s kept connection, opening one if needed; any
    /// failure drops the connection.
    async fn with_conn<T>(
        &self,
        backend: BackendId,
        f: impl AsyncFnOnce(&mut Conn) -> Result<T, mysql_async::Error>,
    ) -> Result<T, OpsError> {
        let mut slot = self.conns[backend].lock().await;
        if slot.is_none() {
            let open = connect(
                &self.addresses[backend],
                &self.tls[backend],
                &self.user,
                &self.password,
                &self.database,
            );
            let conn = tokio::time::timeout(self.connect_timeout, open)
                .await
                .map_err(|_| OpsError::Timeout(self.connect_timeout))?
                .map_err(probe_error)?;
            *slot = Some(conn);
        }
        let conn = slot.as_mut().expect("just opened");
        match f(conn).await {
            Ok(v) => Ok(v),
            Err(e) => {
                *slot = None;
                Err(OpsError::Query(e.to_string()))
            }
        }
    }

    async fn run(&self, backend: BackendId, statements: &[String]) -> Result<(), OpsError> {
        self.with_conn(backend, async |c: &mut Conn| {
            for s in statements {
                c.query_drop(s.as_str()).await?;
            }
            Ok(())
        })
        .await
    }
}

/// mysql_async options to log in to the server at `address` as `user`,
/// following `tls` (`database` empty: none). The probes and `auth_query` use it.
pub fn client_opts(
    address: &str,
    tls: &fulcrum_config::ServerTls,
    user: &str,
    password: &str,
    database: &str,
) -> OptsBuilder {
    let (host, port) = address.rsplit_once(':').unwrap_or((address, "3306"));
    let builder = OptsBuilder::default()
        .user(Some(user.to_owned()))
        .pass(Some(password.to_owned()))
        .db_name((!database.is_empty()).then(|| database.to_owned()))
        .prefer_socket(false)
        .ssl_opts(ssl_opts(tls));
    if host.starts_with('/') {
        builder.socket(Some(format!("{host}/mysqld.sock")))
    } else {
        builder
            .ip_or_hostname(
                host.trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned(),
            )
            .tcp_port(port.parse().unwrap_or(3306))
    }
}

/// A mysql_async connection to the server at `address` as `user`
/// (`database` empty: none), following `tls` (`prefer` and a server
/// without SSL: plain text). The probes and `auth_query` use it, off the
/// data path; the caller bounds it in time.
pub async fn connect(
    address: &str,
    tls: &fulcrum_config::ServerTls,
    user: &str,
    password: &str,
    database: &str,
) -> Result<Conn, mysql_async::Error> {
    let opts =
        |tls: &fulcrum_config::ServerTls| client_opts(address, tls, user, password, database);
    match Conn::new(opts(tls)).await {
        Err(mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer))
            if tls.mode == fulcrum_config::ServerTlsMode::Prefer =>
        {
            Conn::new(opts(&fulcrum_config::ServerTls::disabled())).await
        }
        other => other,
    }
}

/// mysql_async's TLS options for a backend's `server_tls` (`None`: plain).
/// Only `server_tls_ca` is trusted, never the built-in web roots.
fn ssl_opts(tls: &fulcrum_config::ServerTls) -> Option<mysql_async::SslOpts> {
    use fulcrum_config::ServerTlsMode as M;
    let mut o = mysql_async::SslOpts::default().with_disable_built_in_roots(true);
    match tls.mode {
        M::Disable => return None,
        M::Prefer | M::Require => {
            o = o
                .with_danger_accept_invalid_certs(true)
                .with_danger_skip_domain_validation(true)
        }
        M::VerifyCa => o = o.with_danger_skip_domain_validation(true),
        M::VerifyFull => {}
    }
    if let Some(ca) = &tls.ca {
        o = o.with_root_certs(vec![ca.clone().into()]);
    }
    if let (Some(cert), Some(key)) = (&tls.certificate, &tls.private_key) {
        o = o.with_client_identity(Some(mysql_async::ClientIdentity::new(
            cert.clone().into(),
            key.clone().into(),
        )));
    }
    Some(o)
}

/// A failed probe login: access denied (1045, 1044, 1698) or an unknown
/// database (1049) is `LoginRefused`, which does not take the backend out;
/// anything else is `Connect`.
fn probe_error(e: mysql_async::Error) -> OpsError {
    match &e {
        mysql_async::Error::Server(s) if matches!(s.code, 1044 | 1045 | 1049 | 1698) => {
            OpsError::LoginRefused(e.to_string())
        }
        _ => OpsError::Connect(e.to_string()),
    }
}

fn text(row: &Row, column: &str) -> Option<String> {
    row.get::<Option<String>, _>(column).flatten()
}

impl ServerOps for MariaServerOps {
    fn address(&self, backend: BackendId) -> &str {
        &self.addresses[backend]
    }

    async fn probe(&self, backend: BackendId) -> Result<Observation, OpsError> {
        let answer = self
            .with_conn(backend, async |c: &mut Conn| {
                let row: Option<(i64, String, String)> = c
                    .query_first("SELECT @@read_only, @@gtid_binlog_pos, @@gtid_slave_pos")
                    .await?;
                let (read_only, binlog_pos, slave_pos) = row.unwrap_or_default();
                // Needs REPLICATION CLIENT (SLAVE MONITOR): without it the
                // probe still has role and positions, only not the received
                // position and the lag in seconds.
                let mut denied = false;
                let status: Option<Row> = match c.query_first("SHOW SLAVE STATUS").await {
                    Ok(s) => s,
                    Err(mysql_async::Error::Server(e)) if e.code == 1227 => {
                        denied = true;
                        None
                    }
                    Err(e) => return Err(e),
                };
                let (io_pos, seconds_behind) = match &status {
                    Some(s) => (
                        text(s, "Gtid_IO_Pos"),
                        text(s, "Seconds_Behind_Master").and_then(|v| v.parse().ok()),
                    ),
                    None => (None, None),
                };
                let replicates = match &status {
                    Some(_) => Some(true),
                    None if denied => None,
                    None => Some(false),
                };
                Ok(ProbeAnswer {
                    read_only: read_only != 0,
                    binlog_pos,
                    slave_pos,
                    io_pos,
                    seconds_behind,
                    replicates,
                })
            })
            .await?;
        observe(&answer)
    }

    async fn promote(&self, backend: BackendId) -> Result<(), OpsError> {
        self.run(
            backend,
            &[
                "STOP SLAVE".into(),
                "RESET SLAVE ALL".into(),
                "SET GLOBAL read_only = 0".into(),
            ],
        )
        .await
    }

    /// `SET GLOBAL read_only = 1` (users without SUPER / READ ONLY ADMIN
    /// can no longer write), then the binlog position every acknowledged
    /// write is under. The node then replicates from nobody: the probe marks
    /// it detached, so it stays fenced until it is re-joined as a replica.
    async fn fence(&self, backend: BackendId) -> Result<u64, OpsError> {
        self.run(backend, &["SET GLOBAL read_only = 1".into()])
            .await?;
        let pos = self
            .with_conn(backend, async |c: &mut Conn| {
                c.query_first::<String, _>("SELECT @@gtid_binlog_pos").await
            })
            .await?
            .unwrap_or_default();
        gtid_position(&pos)
            .ok_or_else(|| OpsError::Query(format!("unexpected @@gtid_binlog_pos: {pos:?}")))
    }

    /// Sessions sleeping with an open InnoDB transaction, killed.
    async fn end_idle_transactions(&self, backend: BackendId) -> Result<u64, OpsError> {
        let ids: Vec<u64> = self
            .with_conn(backend, async |c: &mut Conn| {
                c.query(
                    "SELECT p.ID FROM information_schema.PROCESSLIST p \
                     JOIN information_schema.INNODB_TRX t ON t.trx_mysql_thread_id = p.ID \
                     WHERE p.COMMAND = 'Sleep' AND p.ID <> CONNECTION_ID()",
                )
                .await
            })
            .await?;
        let kills: Vec<String> = ids
            .iter()
            .map(|id| format!("KILL CONNECTION {id}"))
            .collect();
        if !kills.is_empty() {
            self.run(backend, &kills).await?;
        }
        Ok(ids.len() as u64)
    }

    async fn follow(&self, replica: BackendId, primary: BackendId) -> Result<(), OpsError> {
        self.run(
            replica,
            &[
                "STOP SLAVE".into(),
                change_master_sql(&self.addresses[primary]),
                "START SLAVE".into(),
            ],
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writable_server_is_a_primary_at_its_binlog_position() {
        let o = observe(&ProbeAnswer {
            read_only: false,
            binlog_pos: "0-1-120".into(),
            ..Default::default()
        })
        .unwrap();
        assert!(o.writable);
        assert_eq!((o.position, o.received), (120, 120));
    }

    #[test]
    fn a_replica_reports_applied_received_and_seconds_behind() {
        let o = observe(&ProbeAnswer {
            read_only: true,
            binlog_pos: "0-1-100".into(),
            slave_pos: "0-1-100".into(),
            io_pos: Some("0-1-130".into()),
            seconds_behind: Some(4),
            replicates: Some(true),
        })
        .unwrap();
        assert!(!o.writable);
        assert!(!o.detached);
        assert_eq!((o.position, o.received), (100, 130));
        assert_eq!(o.replay_age, Some(Duration::from_secs(4)));
        assert!(observe(&ProbeAnswer {
            read_only: true,
            slave_pos: "garbage".into(),
            ..Default::default()
        })
        .is_err());
    }

    #[test]
    fn a_read_only_server_replicating_from_nobody_is_detached() {
        let answer = |replicates| ProbeAnswer {
            read_only: true,
            binlog_pos: "0-1-100".into(),
            slave_pos: "0-1-90".into(),
            replicates,
            ..Default::default()
        };
        assert!(observe(&answer(Some(false))).unwrap().detached);
        assert!(!observe(&answer(Some(true))).unwrap().detached);
        assert!(
            !observe(&answer(None)).unwrap().detached,
            "not allowed to look: assumed a replica"
        );
    }

    #[test]
    fn change_master_keeps_credentials_and_uses_gtid() {
        assert_eq!(
            change_master_sql("127.0.0.1:40123"),
            "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = 40123, MASTER_USE_GTID = slave_pos"
        );
        assert!(change_master_sql("db'x:3306").contains("'db\\'x'"));
    }
}
