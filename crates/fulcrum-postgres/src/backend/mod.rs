//! The server-facing side: opening and authenticating server connections and
//! the per-connection state Fulcrum tracks (parameters, prepared statements).

pub mod conn;
pub mod connect;
mod connect_query;
pub mod conninfo;
pub mod health;
pub mod internal;
pub mod server_statements;
pub mod settings;
pub mod stream;

pub use conn::ServerConn;
pub use connect::{connect, connect_with, ConnectError, Credential, ServerTarget, ServerTlsTarget};
pub use connect_query::run_connect_query;
