//! The client-facing side: accept, log in, forward. `serve` runs one
//! cluster's listener; each client gets its own task.

pub mod auth_query;
pub mod cancel;
pub mod context;
pub mod error;
pub mod expect;
pub mod login;
pub mod serve;
pub mod session;
pub mod startup_options;
pub mod statements;
pub mod unit_route;

pub use context::ClusterContext;
pub use serve::serve;
