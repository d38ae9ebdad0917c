//! The PostgreSQL data path end to end (proxying, session state, routing,
//! pgbench, psycopg) and the routing corpora. One test binary; each module
//! was a test binary of its own before.

mod pg_drivers;
mod pg_pgbench;
mod pg_proxy;
mod pg_routing;
mod pg_session;
mod sql_corpus;
