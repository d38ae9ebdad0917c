//! Bad input at Fulcrum's PostgreSQL front end, sent to the real daemon in front
//! of a real PostgreSQL: each case checks the exact reply (FATAL and SQLSTATE,
//! or a silent close) and that the daemon and a client connected before the bad
//! input are unharmed.
//!
//! Raw-byte cases use a `client_auth = "trust"` listener, so a raw login is a
//! StartupMessage and reading up to ReadyForQuery. Needs `cargo build -p fulcrum`.
//! The small raw-protocol client (`Raw`) is local to this file; it belongs in
//! fulcrum-testkit once a second test needs it.
//!
//! Split by theme: `startup` (bad startup packets, SSL/GSSENC requests,
//! unknown cancel keys), `messages` (bad messages after login, oversized and
//! endless input) and `logins` (SCRAM and password failures, unknown
//! databases, stalls, floods, connection caps, a backend down); the raw
//! protocol client and shared helpers in `helpers`.

mod helpers;
mod logins;
mod messages;
mod startup;
