//! End-to-end behaviour of the PostgreSQL data path: real clients (tokio-postgres,
//! psql) through a real Fulcrum daemon in front of a real primary with two
//! streaming replicas, started once for this test binary (shared with
//! `pg_drivers`).
//!
//! Split by theme: `protocol` (simple, extended and pipelined queries,
//! prepared statements, COPY, notices, psql), `sessions` (session state,
//! temporary tables, session mode, cancel, COMMIT AND CHAIN) and `pooling`
//! (waiting, vanished clients, broken and renewed server connections, many
//! clients, unix sockets); the shared cluster and configs in `helpers`.

mod helpers;
mod pooling;
mod protocol;
mod sessions;
