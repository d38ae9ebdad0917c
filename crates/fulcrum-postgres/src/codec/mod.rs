//! Pure PostgreSQL v3 codecs: frame boundaries, the startup packet, and the few
//! message bodies Fulcrum must read or write. No I/O; every function works on bytes.

pub mod backend_msg;
pub mod frame;
pub mod frontend_msg;
pub mod replication;
pub mod startup;

pub use frame::{check_frame, FrameError, FrameHeader};
