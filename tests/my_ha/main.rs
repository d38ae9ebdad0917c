//! MariaDB high availability end to end: the health operations and the
//! health loop on their own (`maria_failover`, formerly
//! crates/fulcrum-mysql/tests), failover and switchover through Fulcrum,
//! transaction replay through a killed primary (and `my_replay_lost`: a
//! replay whose own server is killed while a replayed statement that may
//! commit runs), and read-your-writes
//! consistency on delayed replicas. One test binary; each module was a
//! binary of its own before.
//!
//! The tests that kill or promote servers each have a cluster of their own
//! and take turns (`fulcrum_suite::serial`, one lock for the whole binary);
//! `my_consistency` shares one cluster among its tests. `my_cache_failover`
//! moves the result cache's binlog stream to a promoted replica.

mod maria_failover;
mod my_cache_failover;
mod my_consistency;
mod my_failover;
mod my_replay;
mod my_replay_lost;
