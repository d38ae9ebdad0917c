//! The server-facing side: today the health probe and failover operations.

pub mod gtid;
pub mod health;
