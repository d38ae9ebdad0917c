//! The health loop's PostgreSQL operations (`fulcrum_cluster::ServerOps`):
//! one probe query for role, timeline and WAL positions over a connection
//! kept per backend (re-opened after any error, so a probe also proves the
//! server still accepts logins); `pg_promote()`; and re-pointing a replica
//! with `ALTER SYSTEM SET primary_conninfo` plus `pg_reload_conf()`.

use std::sync::Arc;
use std::time::Duration;

use fulcrum_cluster::lag::parse_lsn;
use fulcrum_cluster::{Observation, OpsError, ServerOps};
use fulcrum_config::Cluster;
use fulcrum_pool::BackendId;
use tokio::sync::Mutex;

use super::conninfo::repoint_conninfo;
use super::internal::Rows;
use super::{connect, Credential, ServerConn, ServerTarget, ServerTlsTarget};

/// Role, timeline (from the WAL file name of the current position) and the
/// positions, in one round trip. Works for any login role: none of these
/// functions needs a privilege.
const PROBE_SQL: &str = "SELECT pg_is_in_recovery(), \
     CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_wal_lsn()::text END, \
     CASE WHEN pg_is_in_recovery() THEN NULL ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END, \
     pg_last_wal_receive_lsn()::text, pg_last_wal_replay_lsn()::text, \
     (extract(epoch FROM now() - pg_last_xact_replay_timestamp()) * 1000)::bigint";

pub struct PgServerOps {
    addresses: Vec<Arc<str>>,
    user: String,
    password: String,
    database: String,
    allow_cleartext: bool,
    tls: Vec<Option<ServerTlsTarget>>,
    connect_timeout: Duration,
    conns: Vec<Mutex<Option<ServerConn>>>,
}

impl PgServerOps {
    pub fn new(config: &Cluster) -> PgServerOps {
        PgServerOps {
            addresses: config
                .backends
                .iter()
                .map(|b| Arc::from(b.address.as_str()))
                .collect(),
            user: config.health.user.clone(),
            password: config.health.password.clone(),
            database: config.health.database.clone(),
            allow_cleartext: config.server_cleartext,
            // Probes and promotion use the data path's TLS settings.
            tls: config
                .backends
                .iter()
                .map(|b| ServerTlsTarget::from_config(&b.tls))
                .collect(),
            // A probe must fit in health_timeout; so must its connect.
            connect_timeout: config.health.timeout.min(config.connect_timeout),
            conns: config.backends.iter().map(|_| Mutex::new(None)).collect(),
        }
    }

    /// Runs `sql` on `backend` over its kept connection, opening one if
    /// needed; any failure drops the connection.
    async fn query(&self, backend: BackendId, sql: &str) -> Result<Rows, OpsError> {
        let mut slot = self.conns[backend].lock().await;
        if slot.is_none() {
            let target = ServerTarget {
                address: self.addresses[backend].clone(),
                user: self.user.clone(),
                credential: Credential::Password(self.password.clone()),
                database: self.database.clone(),
                allow_cleartext: self.allow_cleartext,
                tls: self.tls[backend].clone(),
            };
            let conn = connect(&target, self.connect_timeout)
                .await
                .map_err(probe_error)?;
            *slot = Some(conn);
        }
        let conn = slot.as_mut().expect("just opened");
        match conn.query_rows(sql).await {
            Ok(rows) => Ok(rows),
            Err(e) => {
                *slot = None;
                Err(OpsError::Query(e.to_string()))
            }
        }
    }
}

/// A failed probe login: refused by a server that is up (bad password, no
/// such role or database, no right to connect: SQLSTATE class 28, 3D000,
/// 42501; or Fulcrum's own check of the exchange) is `LoginRefused`, which
/// does not take the backend out; anything else (cannot connect, timeout,
/// TLS, the server starting or stopping) is `Connect`.
fn probe_error(e: super::ConnectError) -> OpsError {
    use super::ConnectError;
    match &e {
        ConnectError::Server { fields, .. }
            if fields.code.starts_with("28")
                || fields.code == "3D000"
                || fields.code == "42501" =>
        {
            OpsError::LoginRefused(e.to_string())
        }
        ConnectError::Auth { .. } => OpsError::LoginRefused(e.to_string()),
        _ => OpsError::Connect(e.to_string()),
    }
}

/// The probe's one row, as an observation.
pub fn parse_probe_row(row: &[Option<String>]) -> Result<Observation, OpsError> {
    let col = |i: usize| row.get(i).and_then(|c| c.as_deref());
    let bad = |what: &str| OpsError::Query(format!("unexpected probe answer: {what}"));
    let in_recovery = match col(0) {
        Some("t") => true,
        Some("f") => false,
        _ => return Err(bad("pg_is_in_recovery")),
    };
    let lsn = |i: usize| col(i).and_then(parse_lsn);
    if !in_recovery {
        let position = lsn(1).ok_or_else(|| bad("pg_current_wal_lsn"))?;
        let timeline = col(2)
            .and_then(|t| u64::from_str_radix(t, 16).ok())
            .unwrap_or(0);
        return Ok(Observation {
            writable: true,
            timeline,
            position,
            received: position,
            replay_age: None,
            detached: false,
        });
    }
    let replayed = lsn(4).unwrap_or(0);
    let received = lsn(3).unwrap_or(0).max(replayed);
    let replay_age = col(5)
        .and_then(|ms| ms.parse::<i64>().ok())
        .map(|ms| Duration::from_millis(ms.max(0) as u64));
    Ok(Observation {
        writable: false,
        timeline: 0,
        position: replayed,
        received,
        replay_age,
        detached: false,
    })
}

impl ServerOps for PgServerOps {
    fn address(&self, backend: BackendId) -> &str {
        &self.addresses[backend]
    }

    async fn probe(&self, backend: BackendId) -> Result<Observation, OpsError> {
        let rows = self.query(backend, PROBE_SQL).await?;
        let row = rows
            .first()
            .ok_or_else(|| OpsError::Query("probe returned no row".into()))?;
        parse_probe_row(row)
    }

    async fn promote(&self, backend: BackendId) -> Result<(), OpsError> {
        // Waits (up to 60 s) until the server has left recovery.
        let rows = self.query(backend, "SELECT pg_promote(true, 60)").await?;
        match rows
            .first()
            .and_then(|r| r.first())
            .and_then(|c| c.as_deref())
        {
            Some("t") => {
                // A former primary fenced by a switchover, promoted again,
                // must take writes: drop the fence if it is there.
                self.query(backend, "ALTER SYSTEM RESET default_transaction_read_only")
                    .await?;
                self.query(backend, "SELECT pg_reload_conf()").await?;
                Ok(())
            }
            other => Err(OpsError::Query(format!(
                "pg_promote() returned {other:?}: the server did not finish promotion"
            ))),
        }
    }

    /// Planned switchover: new transactions on the old primary are read-only
    /// (`default_transaction_read_only`, kept across restarts until an
    /// operator resets it when re-joining the node).
    async fn fence(&self, backend: BackendId) -> Result<u64, OpsError> {
        self.query(
            backend,
            "ALTER SYSTEM SET default_transaction_read_only = on",
        )
        .await?;
        self.query(backend, "SELECT pg_reload_conf()").await?;
        // The insert position covers commits acknowledged before their WAL
        // was written (synchronous_commit = off); the walwriter ships them
        // within wal_writer_delay.
        let rows = self
            .query(backend, "SELECT pg_current_wal_insert_lsn()::text")
            .await?;
        rows.first()
            .and_then(|r| r.first())
            .and_then(|c| c.as_deref())
            .and_then(fulcrum_cluster::lag::parse_lsn)
            .ok_or_else(|| OpsError::Query("unexpected pg_current_wal_insert_lsn answer".into()))
    }

    async fn end_idle_transactions(&self, backend: BackendId) -> Result<u64, OpsError> {
        let rows = self
            .query(
                backend,
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE backend_type = 'client backend' AND state = 'idle in transaction' \
                 AND pid <> pg_backend_pid()",
            )
            .await?;
        Ok(rows
            .first()
            .and_then(|r| r.first())
            .and_then(|c| c.as_deref())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0))
    }

    /// A snapshot's xmax: every transaction the old primary committed and
    /// this server replayed is below it; every id it hands out from now on
    /// is at or above it.
    async fn commit_floor(&self, backend: BackendId) -> Result<Option<u64>, OpsError> {
        let rows = self
            .query(
                backend,
                "SELECT pg_snapshot_xmax(pg_current_snapshot())::text",
            )
            .await?;
        Ok(rows
            .first()
            .and_then(|r| r.first())
            .and_then(|c| c.as_deref())
            .and_then(|x| x.parse().ok()))
    }

    async fn follow(&self, replica: BackendId, primary: BackendId) -> Result<(), OpsError> {
        let rows = self.query(replica, "SHOW primary_conninfo").await?;
        let current = rows
            .first()
            .and_then(|r| r.first())
            .and_then(|c| c.clone())
            .unwrap_or_default();
        let conninfo = repoint_conninfo(&current, &self.addresses[primary]);
        let sql = format!(
            "ALTER SYSTEM SET primary_conninfo = '{}'",
            conninfo.replace('\'', "''")
        );
        self.query(replica, &sql).await?;
        self.query(replica, "SELECT pg_reload_conf()").await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cols: &[Option<&str>]) -> Vec<Option<String>> {
        cols.iter().map(|c| c.map(str::to_owned)).collect()
    }

    #[test]
    fn a_primary_reports_its_position_and_timeline() {
        let o = parse_probe_row(&row(&[
            Some("f"),
            Some("0/3000148"),
            Some("00000002"),
            None,
            None,
            None,
        ]))
        .unwrap();
        assert!(o.writable);
        assert_eq!(o.timeline, 2);
        assert_eq!(o.position, 0x3000148);
        assert_eq!(o.received, 0x3000148);
    }

    #[test]
    fn a_replica_reports_replayed_received_and_age() {
        let o = parse_probe_row(&row(&[
            Some("t"),
            None,
            None,
            Some("0/5000000"),
            Some("0/4000000"),
            Some("1500"),
        ]))
        .unwrap();
        assert!(!o.writable);
        assert_eq!(o.position, 0x4000000);
        assert_eq!(o.received, 0x5000000);
        assert_eq!(o.replay_age, Some(Duration::from_millis(1500)));
        // A replica that never replayed a transaction: no age, no positions yet.
        let fresh = parse_probe_row(&row(&[Some("t"), None, None, None, None, None])).unwrap();
        assert_eq!((fresh.position, fresh.replay_age), (0, None));
    }

    #[test]
    fn nonsense_is_an_error_not_a_panic() {
        assert!(parse_probe_row(&row(&[])).is_err());
        assert!(parse_probe_row(&row(&[Some("yes")])).is_err());
        assert!(parse_probe_row(&row(&[Some("f"), Some("garbage")])).is_err());
    }
}
