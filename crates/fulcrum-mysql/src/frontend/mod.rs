//! The client-facing side: login, the forwarding loop, what a server's
//! answer looks like, and the listener.

pub mod auth_query;
pub mod context;
pub mod error;
pub mod login;
pub mod reply;
pub mod serve;
pub mod session;
pub mod statements;
pub mod wire;

pub use context::MyClusterContext;
pub use serve::serve;
