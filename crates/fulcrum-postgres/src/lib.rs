//! PostgreSQL v3 for Fulcrum: pure codecs (`codec`, `auth`), the server-facing
//! back end (`backend`: connect, authenticate, keep session state) and the
//! client-facing front end (`frontend`: login, the forwarding loop, statement
//! mapping). Knows nothing of SQL classification or health checking: it asks
//! `fulcrum_pool::Router` where a unit of work goes.

pub mod auth;
pub mod backend;
pub mod codec;
pub mod frontend;
