//! MySQL/MariaDB protocol for Fulcrum: a proxy that forwards raw packets and
//! decodes only what routing and session state need.
//!
//! Owns the codecs (`codec`: packet framing, LENENC types, handshake and
//! handshake response, OK/ERR/EOF, auth switch and more-data packets, commands
//! and prepared-statement ids, which capability flags Fulcrum offers) and
//! authentication (`auth`: mysql_native_password, and caching_sha2_password's
//! fast path and full authentication: towards clients over TLS only, towards
//! servers over TLS or with the server's RSA key), all as functions over
//! bytes; and the health loop's MariaDB operations (`backend::health`: role
//! from `@@read_only`, positions from GTIDs, promotion and re-pointing for
//! GTID replication), which talk to servers through mysql_async, off the
//! data path, as do `auth_query`'s look-ups, the result cache's relation
//! catalog (`frontend::relations`) and its change stream (`change_stream`:
//! the primary's binlog).
//!
//! The front end (`frontend`: login, the session loop, answer tracking,
//! prepared statements, KILL, COM_CHANGE_USER) owns client sockets and server
//! connections from `fulcrum_pool` pools; it classifies each query with
//! `fulcrum_sql` and asks `fulcrum_session::decide` where it goes, and
//! `fulcrum_pool::Router` which backend serves that route; the client's
//! phase, the unit in flight and its read consistency are
//! `fulcrum_session`'s (`Engine`, `Reads`), attaching and a transaction
//! replay's run `fulcrum_cluster`'s (`attach`, `replay`), this crate keeping
//! GTIDs, the `MASTER_GTID_WAIT` probe, the words of its answers, and some
//! session state of its own beside the engine's phase (the replay under
//! way, the sequence id of a lost command's answer). `mirror` captures
//! units for `[[cluster.mirror]]`. The codecs and `auth` stay pure: no
//! sockets, the caller supplies sequence ids and the random scramble.
//! Protocol constants and the scramble functions are mysql_common's,
//! re-exported here so callers use the same types.

#![forbid(unsafe_code)]

pub mod auth;
pub mod backend;
pub mod change_stream;
pub mod codec;
pub mod frontend;
pub mod mirror;

pub use mysql_common;
pub use mysql_common::constants::{CapabilityFlags, StatusFlags};
