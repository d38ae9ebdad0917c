//! The clusters that several test modules of one binary share, and the lock
//! the tests that kill servers take turns with.
//!
//! A shared cluster is started on first use and kept in a `static` for the
//! rest of the test binary: one per process, as every test binary links its
//! own copy of this library. Only tests that leave the servers as they found
//! them use one (no kill, stop, promotion or server setting changed); a
//! module adds the objects it needs (a table, a role) once, on top. Tests
//! that wreck or reconfigure servers start clusters of their own, and a
//! module whose tests count what its servers did (commits, `Com_select`)
//! keeps its cluster to itself.
//!
//! Statics are never dropped: the testkit's reaper (one per cluster, see
//! `crates/fulcrum-testkit/src/reaper.rs`) stops the servers and removes the
//! directory when the process exits, however it exits, so a binary with
//! several static clusters still tears every one of them down.

use std::sync::OnceLock;

use fulcrum_testkit::{MariaCluster, PgCluster};

/// A PostgreSQL 15 primary with two streaming replicas: `pg_proxy` and
/// `pg_drivers` (tests/postgres).
pub fn pg_two_replicas() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        PgCluster::builder()
            .replicas(2)
            .start()
            .expect("start PostgreSQL primary + 2 replicas")
    })
}

/// A PostgreSQL 15 primary alone: `pg_auth_query`, `pg_bad_input` and
/// `pg_tls` (tests/pg_security).
pub fn pg_primary() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        PgCluster::builder()
            .start()
            .expect("start PostgreSQL primary")
    })
}

/// A MariaDB primary with one GTID replica: `my_drivers` and `my_bad_input`
/// (tests/mysql).
pub fn maria_one_replica() -> &'static MariaCluster {
    static CLUSTER: OnceLock<MariaCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        MariaCluster::builder()
            .replicas(1)
            .start()
            .expect("start MariaDB primary + 1 replica")
    })
}

/// The turn of a test that kills or promotes servers: such tests run one at
/// a time in a binary (in every module of it), so their failover timings
/// are not distorted by each other on a small machine. Hold the guard for
/// the whole test.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}
