//! The protocol-neutral part of a cluster, which both protocol crates
//! build on.
//!
//! Health and failover: the health loop probes every backend, tracks its
//! state (up, down, lagging, stale), measures replication lag, decides
//! which backend is the primary, fences a second writable node, and
//! promotes a replica when the primary is lost. What it decides is
//! published to `fulcrum_pool::Router`, which sessions read. The decisions
//! (`state`, `lag`, `topology`, the expansion in `command`) are pure and
//! unit-tested. The I/O is in `monitor` (the loop and its probes),
//! `switchover` (the planned switchover it runs), `health_loop` (starting
//! and stopping the loop's task) and `command` (running `failover_command`
//! through `/bin/sh`).
//!
//! A cluster's shared state: `context::ClusterCore`, what every protocol's
//! cluster context holds (config, metrics, router and health view,
//! classifier, digests, function and relation catalogs (their per-database
//! lookups are `by_database`'s), causal-read positions, the
//! server connection pools and their upkeep), and `serve`, the client
//! listener (accept, pending-login admission, `max_client_connections`, a
//! task per client, the drain on shutdown). `clients` and `view` are shared
//! registries the data path and the admin console read and write with
//! short locks or atomics (`client_stats`: each client's traffic counts,
//! summed per database for SHOW STATS); `auth_cache` holds what `auth_query` fetched and
//! what clients proved, for both protocols; `admin` is what the console
//! asks of a cluster; `attach` checks out a server connection for a unit
//! of work (a replica, else the primary, waited for during a failover),
//! the protocol supplying the checkout through `attach::Checkouts`;
//! `workers` runs each session on one worker event loop for life
//! (`workers` > 1);
//! `replay` drives a transaction replay (start, wait for a primary,
//! compare, match or fail) over the protocol's checkout and client buffer;
//! `handover` moves clients to the process a binary upgrade started (each
//! session's socket and its protocol's snapshot over the upgrade socket,
//! resumed by the listener of its cluster there), with the tally of who
//! moved and who stayed, and cancel requests passed back.
//!
//! It knows no wire protocol and no SQL text beyond what `fulcrum_sql`
//! tells it: the server-specific part of health (how to ask a PostgreSQL
//! or MariaDB server its role and position, how to promote one and
//! re-point the others) is the [`ServerOps`] trait; opening a server
//! connection, reading a database's functions, logging a client in,
//! running its session and resuming a handed-over one are
//! [`ProtocolContext`] and [`serve::Frontend`]; each protocol crate
//! implements them.

#![forbid(unsafe_code)]

pub mod admin;
pub mod attach;
pub mod auth_cache;
pub mod by_database;
pub mod client_stats;
pub mod clients;
pub mod command;
pub mod context;
pub mod coordinated;
pub mod digests;
pub mod function_catalog;
pub mod handover;
pub mod health_loop;
pub mod lag;
pub mod mirror;
pub mod monitor;
pub mod ops;
pub mod pool_upkeep;
pub mod relation_catalog;
pub mod replay;
pub mod serve;
pub mod state;
pub mod switchover;
pub mod topology;
pub mod view;
pub mod workers;

pub use admin::{ClusterAdmin, ListenerRow, PoolRow};
pub use auth_cache::{
    auth_query_backend, AuthCache, AuthLimits, AuthQueryError, Looked, Outcome as AuthOutcome,
};
pub use context::{ClusterCore, PoolScope, ProtocolContext};
pub use digests::DigestSlot;
pub use health_loop::HealthLoop;
pub use monitor::{Monitor, MonitorSettings};
pub use ops::{Observation, OpsError, ServerOps};
pub use state::BackendState;
pub use switchover::MonitorHandle;
pub use view::{BackendStatus, ClusterView};
