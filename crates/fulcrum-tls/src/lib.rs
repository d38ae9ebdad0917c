//! TLS for Fulcrum's client listeners: the certificate chain and private key
//! a listener presents, loaded from PEM files into a rustls server config
//! (built when the config is validated, so a reload with a broken file keeps
//! the running one), and `ClientStream`, a client connection that is plain
//! TCP or TLS over it, for the protocol crates' connection type. It knows nothing
//! of a wire protocol: when to start the handshake (PostgreSQL's
//! SSLRequest, MySQL's SSL request) is the protocol crate's business.

#![forbid(unsafe_code)]

mod certs;
mod stream;

pub use certs::{server_config, MinVersion, TlsError};
pub use stream::ClientStream;
pub use tokio_rustls::TlsAcceptor;
pub use {rustls, tokio_rustls};
