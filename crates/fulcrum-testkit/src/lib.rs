//! Fulcrum's test harness: starts real PostgreSQL 15 clusters (a primary and
//! streaming replicas) and real MariaDB clusters (a primary and GTID
//! replicas, read-only) in temp dirs on free loopback ports, runs the Fulcrum
//! daemon as a child process, and drives the real `psql`, `pgbench` and
//! `mariadb` clients.
//!
//! It owns processes and temp dirs, and never touches the machine's own
//! database services (no fixed ports, no system data directories). It knows
//! nothing about Fulcrum's internals: the daemon is a binary and a config text.
//!
//! Everything is synchronous (std::process), so it works from plain and
//! `#[tokio::test]` tests alike. Servers are cleaned up on `Drop` and, if the
//! test process dies first or a cluster lives in a `static`, by a reaper
//! process (see `reaper.rs`). Set `FULCRUM_TESTKIT_KEEP=1` to keep temp dirs.

mod clients;
mod error;
mod etcd_cluster;
mod fulcrum_process;
mod maria_cluster;
mod maria_conf;
mod maria_node;
mod patroni_cluster;
mod pg_cluster;
mod pg_conf;
mod pg_node;
mod ports;
mod process;
mod reaper;
mod roles;
mod scratch;
mod tls;

pub use clients::{
    pgbench, pgbench_init, run_mariadb, run_mariadb_socket, run_pgbench, run_psql, PgbenchResult,
};
pub use error::{Result, TestkitError};
pub use etcd_cluster::EtcdCluster;
pub use fulcrum_process::{
    fulcrum_bin, listen_addrs, run_fulcrum, FulcrumProcess, Signal, FULCRUM_BIN_ENV, START_TIMEOUT,
};
pub use maria_cluster::{MariaCluster, MariaClusterBuilder};
pub use maria_node::MariaNode;
pub use patroni_cluster::PatroniCluster;
pub use pg_cluster::{PgCluster, PgClusterBuilder, KEEP_ENV, VERBOSE_ENV};
pub use pg_node::PgNode;
pub use ports::{free_port, wait_for_tcp, wait_for_unix, RESERVED_PORTS};
pub mod provision;
pub use process::{find_maria_bin, find_pg_bin, is_root, maria_bin, pg_bin, raise_fd_limit};
pub use provision::{python, tool};
pub use roles::{
    APP_DB, APP_MD5_USER, APP_PASSWORD, APP_PLAIN_USER, APP_TRUST_USER, APP_USER,
    MARIA_REPL_PASSWORD, MARIA_REPL_USER, MARIA_SUPERUSER, SUPERUSER,
};
pub use scratch::{ScratchDir, TMPDIR_ENV};
pub use tls::TestCerts;
