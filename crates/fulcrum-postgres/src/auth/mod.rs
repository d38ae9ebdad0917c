//! Client authentication as a server would do it: SCRAM-SHA-256 (RFC 5802/7677)
//! and md5. Pure state machines over message payloads; the I/O is in `frontend::login`.

pub mod md5;
pub mod scram;
