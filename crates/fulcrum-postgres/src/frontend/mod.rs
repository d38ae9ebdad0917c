//! The client-facing side: log in, forward. `serve` is PostgreSQL's part of
//! `fulcrum_cluster::serve`'s listener (which accepts, and gives each
//! client its own task); `context` is what one cluster's sessions share.

pub mod auth_query;
pub mod cancel;
pub mod context;
pub mod error;
pub mod expect;
pub mod hba;
pub mod login;
pub mod relations;
pub mod serve;
pub mod session;
pub mod startup_options;
pub mod statements;
mod stored_login;
pub mod unit_route;

pub use context::ClusterContext;
