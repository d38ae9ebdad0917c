//! The life of a PostgreSQL client between units of work, through a real
//! Fulcrum in front of a real primary with two streaming replicas (one
//! cluster for this binary): local answers that need no server, state a
//! pooled server connection must not carry to the next client, transaction
//! modes that decide the server, and what a client is told when its server
//! dies under a COMMIT. Every wait is bounded: a hang fails the test.
//!
//! Split by theme: `statements` (prepared statements, oversized and held
//! server messages, answers Fulcrum owes), `state` (session state, routing
//! by catalog, pinning, reset), `timeouts` (commits in flight, idle and query
//! timeouts) and `pool_sizes` (min and max pool sizes, server checks);
//! shared cluster and query helpers in `helpers`.

mod helpers;
mod pool_sizes;
mod state;
mod statements;
mod timeouts;

pub(crate) use statements::raw_client;
