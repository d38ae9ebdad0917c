//! The client-facing side: login, the forwarding loop, what a server's
//! answer looks like, and MySQL's part of `fulcrum_cluster::serve`'s
//! listener (`serve`); `context` is what one cluster's sessions share.

pub mod auth_query;
pub mod context;
pub mod error;
pub mod login;
mod relations;
pub mod reply;
pub mod serve;
pub mod session;
pub mod statements;
pub mod wire;

pub use context::MyClusterContext;
