//! PostgreSQL v3 for Fulcrum: pure codecs (`codec`, `auth`), the server-facing
//! back end (`backend`: connect, authenticate, keep session state, and the
//! health loop's PostgreSQL operations in `backend::health`) and the
//! client-facing front end (`frontend`: login, and the session, which feeds
//! `fulcrum_session`'s engine its events and carries out its actions: unit
//! boundaries, the reply queue, statement mapping, session-state replay and
//! the answers Fulcrum gives in PostgreSQL's words).
//!
//! It classifies statements through `fulcrum_sql`, which also reports what
//! each does to the session (`fulcrum_sql::Effects`); `fulcrum_session::decide`
//! places each unit, `fulcrum_session::Engine` holds the client's phase and
//! the unit in flight, `fulcrum_session::Reads` its read consistency, and
//! `fulcrum_pool::Router` picks the backend; attaching a connection and
//! driving a transaction replay are `fulcrum_cluster`'s (`attach`,
//! `replay`) over this crate's checkout. This crate keeps what is
//! PostgreSQL's own: frames, the reply queue, statement and portal maps,
//! session-parameter replay, how a write's LSN is learnt and a replica's is
//! asked, and the words of every answer; and, beside the engine's phase,
//! some session state of its own (how a lost transaction is answered, the
//! replay under way, what the server still owes). A session's sockets and
//! their buffers are `fulcrum_net::Connection`s; the logins before it (the
//! client's startup and authentication, a server connection's connect and
//! authentication) read and write the raw stream with a buffer of their
//! own, which the `Connection` then takes over. `notify`
//! answers LISTEN without pinning (one listening server connection per
//! database and user, its notifications fanned out); `mirror` captures
//! units for `[[cluster.mirror]]`; `change_stream` reads the primary's
//! logical decoding to invalidate the result cache (`fulcrum_cache`).

#![forbid(unsafe_code)]

pub mod auth;
pub mod backend;
pub mod change_stream;
pub mod codec;
pub mod frontend;
pub mod mirror;
pub mod notify;
