//! PostgreSQL-side security and hostile input end to end: `auth_query`,
//! bad protocol input, TLS to clients and to servers. One test binary; each
//! module was a test binary of its own before.

mod pg_auth_query;
mod pg_bad_input;
mod pg_server_tls;
mod pg_tls;
