//! MySQL/MariaDB protocol for Fulcrum: the pure layer of a proxy that forwards
//! raw packets and decodes only what routing and session state need.
//!
//! Owns the codecs (`codec`: packet framing, LENENC types, handshake and
//! handshake response, OK/ERR/EOF, auth switch and more-data packets, commands
//! and prepared-statement ids, which capability flags Fulcrum offers) and
//! server-side authentication (`auth`: mysql_native_password and
//! caching_sha2_password's fast path), all as functions over bytes; and the
//! health loop's MariaDB operations (`backend::health`: role from
//! `@@read_only`, positions from GTIDs, promotion and re-pointing for GTID
//! replication), which talk to servers through mysql_async, off the data path.
//!
//! Never knows sockets, TLS, pools, routing or SQL classification: the session
//! that owns a connection reads and writes the bytes, picks the sequence ids,
//! supplies the random scramble, and asks the SQL classifier what a query is.
//! Protocol constants and the scramble functions are mysql_common's, re-exported
//! here so callers use the same types.

pub mod auth;
pub mod backend;
pub mod codec;
pub mod frontend;

pub use mysql_common;
pub use mysql_common::constants::{CapabilityFlags, StatusFlags};
