//! How a client session ends, when it does not end with Terminate.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum SessionError {
    #[error("client connection failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("client closed the connection")]
    ClientGone,
    /// The backend could not be reached (nothing was sent to the client yet).
    #[error("{0}")]
    BackendDown(String),
    /// Fulcrum refused the client and told it why (a FATAL was sent).
    #[error("{0}")]
    Refused(String),
}
