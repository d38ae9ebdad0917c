//! Pure MySQL/MariaDB client/server protocol codecs: packet framing, the
//! primitive wire types, the connection-phase packets, the responses Fulcrum
//! reads or writes, and client commands. No I/O; every function works on bytes,
//! and a packet's sequence id is left to whoever frames it.

pub mod auth_packets;
pub mod capabilities;
pub mod change_user;
pub mod command;
pub mod err;
pub mod handshake;
pub mod packet;
pub mod response;
pub mod statements;
pub mod thread_ids;
pub mod wait_timeout;
pub mod wire;

#[cfg(test)]
mod robustness_tests;

pub use packet::{check_packet, Header, PacketError};
pub use wire::DecodeError;
