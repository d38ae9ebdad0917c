//! Shared helpers for Fulcrum's end-to-end tests and benchmarks. The tests
//! are six binaries, one directory each under `tests/` (`postgres`,
//! `pg_ha`, `pg_security`, `mysql`, `my_ha`, `operations`; see "The test
//! suite" in docs/architecture.md); every helper more than one test module
//! needs lives here, once:
//!
//! - [`config`]: the config texts Fulcrum runs with ([`PgProxyConfig`],
//!   [`maria_toml`], [`with_metrics`]);
//! - [`connect`]: logins through Fulcrum with tokio-postgres and
//!   mysql_async;
//! - [`metrics`]: scraping `/metrics` and reading samples from it, and
//!   starting Fulcrum with a metrics listener;
//! - [`clusters`]: the clusters the modules of one binary share, and the
//!   lock the tests that kill servers take turns with;
//! - [`servers`]: what the tests read from the servers themselves;
//! - [`console`]: what they read from the admin console (`SHOW MIRROR`);
//! - [`python`]: driver scripts in the test kit's Python environment;
//! - [`sysbench`](mod@sysbench): sysbench runs on a MySQL port;
//! - [`wire`]: raw PostgreSQL protocol bytes (startup packets).
//!
//! The clusters and the daemon process come from `fulcrum-testkit`.

pub mod clusters;
pub mod config;
pub mod connect;
pub mod console;
pub mod metrics;
pub mod process;
pub mod python;
pub mod rustls_tokio_postgres;
pub mod servers;
pub mod sysbench;
pub mod wire;

pub use clusters::{maria_one_replica, pg_primary, pg_two_replicas, serial};
pub use config::{
    maria_toml, pg_conn_string, with_console, with_metrics, PgProxyConfig, CONSOLE_PASSWORD,
    CONSOLE_USER,
};
pub use connect::{
    console_connect, first_value, maria_connect, maria_opts, pg_connect, pg_connect_as,
    pg_connect_str, pg_connect_with_options, try_console_connect, try_maria_connect,
    try_pg_connect, try_pg_connect_as,
};
pub use console::{show_mirror, upgrade_clients_row, MirrorRow};
pub use metrics::{
    family_sum, http_get, http_get_head, metric_sum, replays, scrape, start_with_metrics,
    try_scrape,
};
pub use process::{rss_kb, upgraded_to, KillOnDrop};
pub use python::run_python;
pub use rustls_tokio_postgres::cancel_a_sleep;
pub use servers::com_select;
pub use sysbench::sysbench;
pub use wire::{startup_message, PROTOCOL_3_0};
