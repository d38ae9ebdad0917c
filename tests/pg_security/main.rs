//! PostgreSQL-side security and hostile input end to end: logins through
//! `auth_query`, with passwords given as the server stores them and hba
//! rules, malformed and oversized protocol input, client-facing TLS and
//! TLS to the servers, and a PgBouncer config using all of PgBouncer's
//! migration items imported and served (`pg_pgbouncer_migration`). One
//! test binary; each module was a binary of its own before.
//!
//! Clusters: `pg_auth_query`, `pg_bad_input`, `pg_database_login`,
//! `pg_hba`, `pg_pgbouncer_migration`, `pg_server_refusal`, `pg_stored_password`
//! and `pg_tls`
//! share one PostgreSQL primary (`fulcrum_suite::pg_primary`);
//! `pg_server_tls` runs a TLS-only one; tests that stop a server start
//! their own.

mod pg_auth_query;
mod pg_bad_input;
mod pg_database_login;
mod pg_hba;
mod pg_pgbouncer_migration;
mod pg_server_refusal;
mod pg_server_tls;
mod pg_stored_password;
mod pg_tls;
