//! The server-facing side: opening and authenticating server connections and
//! what Fulcrum tracks on them; the health probe and failover operations.

pub mod conn;
pub mod connect;
pub mod gtid;
pub mod health;

pub use conn::ServerConn;
pub use connect::{connect, ConnectError, ServerTarget};
