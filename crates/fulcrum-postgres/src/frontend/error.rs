//! How a client session ends, when it does not end with Terminate.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum SessionError {
    #[error("client connection failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("client closed the connection")]
    ClientGone,
    /// Fulcrum refused the client and told it why (a FATAL was sent).
    #[error("{0}")]
    Refused(String),
}
