//! The PostgreSQL data path end to end: real clients (tokio-postgres, psql,
//! pgbench, psycopg) through a real Fulcrum daemon in front of real
//! PostgreSQL 15 clusters, and the routing corpora through the classifier.
//! One test binary; each module was a binary of its own before.
//!
//! Clusters: `pg_proxy`, `pg_drivers` and `pg_unix_socket` share one
//! primary with two replicas (`fulcrum_suite::pg_two_replicas`); `pg_isolation` keeps a
//! primary of its own (its objects and roles are its cases); `pg_routing` (which counts
//! commits per server and times replicas) and `pg_session` (which
//! terminates server backends by statement) keep their own; `pg_pgbench`
//! starts one for its test; `cache_stream` starts its own (one with
//! logical decoding, one without); `pg_relations` keeps a primary of its
//! own (its objects are its cases); `pg_cache_scope` and `pg_cache_extended`
//! share `pg_cache`'s.

mod cache_stream;
mod pg_cache;
mod pg_cache_extended;
mod pg_cache_scope;
mod pg_drivers;
mod pg_isolation;
mod pg_memory;
mod pg_mirror;
mod pg_notify;
mod pg_pgbench;
mod pg_pids;
mod pg_pool_modes;
mod pg_proxy;
mod pg_relations;
mod pg_routing;
mod pg_session;
mod pg_unix_socket;
mod sql_corpus;
