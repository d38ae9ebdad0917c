//! PostgreSQL v3 for Fulcrum: pure codecs (`codec`, `auth`), the server-facing
//! back end (`backend`: connect, authenticate, keep session state, and the
//! health loop's PostgreSQL operations in `backend::health`) and the
//! client-facing front end (`frontend`: login, and the session, an adapter
//! of `fulcrum_session`'s engine: unit boundaries, the reply queue,
//! statement mapping, session-state replay and the answers Fulcrum gives in
//! PostgreSQL's words).
//!
//! It classifies statements through `fulcrum_sql`, which also reports what
//! each does to the session (`fulcrum_sql::Effects`), but decides nothing about
//! routing or a client's state: `fulcrum_session::decide` and
//! `fulcrum_session::Engine` do, and `fulcrum_pool::Router` picks the
//! backend. Sockets and their buffers are `fulcrum_net::Connection`s.

#![forbid(unsafe_code)]

pub mod auth;
pub mod backend;
pub mod codec;
pub mod frontend;
