//! PostgreSQL high availability end to end: failover (health checks, lag,
//! promotion, follow), transaction replay through a killed primary, and
//! read-your-writes consistency on replicas that apply late. One test
//! binary; each module was a binary of its own before.
//!
//! The failover and replay tests each wreck a cluster of their own and take
//! turns (`fulcrum_suite::serial`, one lock for the whole binary);
//! `pg_consistency` shares one cluster among its tests, its replicas set to
//! apply WAL late. `pg_cache_failover` moves the result cache's change
//! stream to a promoted replica; `pg_upgrade_failover`, a client left on an
//! upgraded process follows the new process's promotion.

mod pg_cache_failover;
mod pg_consistency;
mod pg_failover;
mod pg_replay;
mod pg_upgrade_failover;
