//! How a MySQL client session ends, when it does not end with COM_QUIT.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum SessionError {
    #[error("client connection failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("client closed the connection")]
    ClientGone,
    /// The command failed and the client was told (an ERR was sent); the
    /// session goes on.
    #[error("command failed; session goes on")]
    Recoverable,
    /// A read's replica died before any byte of its answer reached the
    /// client: send it again elsewhere.
    #[error("replica lost before answering; retry")]
    Retry,
    /// The server died under a transaction that can be replayed
    /// (`transaction_replay`): nothing was sent to the client; the session
    /// replays it on the primary.
    #[error("server lost in a replayable transaction; replay it")]
    Replay,
    /// Fulcrum refused the client and told it why (an ERR was sent).
    #[error("{0}")]
    Refused(String),
}
