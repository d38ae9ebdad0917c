//! PostgreSQL high availability end to end: failover, transaction replay,
//! read consistency. One test binary; each module was a test binary of its
//! own before.

mod pg_consistency;
mod pg_failover;
mod pg_replay;
