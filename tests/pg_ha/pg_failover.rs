//! Health checks, replication lag and failover on real clusters: a replica
//! killed under a read load, a replica made to lag, the primary killed under
//! a write load with `failover = "promote"` (synchronous standby, every
//! acknowledged write counted afterwards, the old primary fenced when it
//! returns), and `failover = "follow"` after an external promotion.
//!
//! Each test wrecks its own cluster; they run one at a time (a lock, shared
//! with the binary's other tests that kill servers: `fulcrum_suite::serial`)
//! so their timings are not distorted by each other on a small machine.
//!
//! Split by theme: `replicas` (a replica killed or lagging under reads),
//! `primary_kill` (a primary killed under writes, a listener across the kill)
//! and `modes` (`follow`, `none`, `failover_max_lag`); shared configs and
//! loads in `helpers` (`config` is used by `pg_cache_failover` too).

mod helpers;
mod modes;
mod primary_kill;
mod replicas;

pub(crate) use helpers::{config, port_of};
