//! MariaDB high availability end to end: the health operations and loop,
//! failover, switchover, transaction replay, read consistency. One test
//! binary; each module was a test binary of its own before
//! (`maria_failover` was crates/fulcrum-mysql/tests/maria_failover.rs).

mod maria_failover;
mod my_consistency;
mod my_failover;
mod my_replay;
