//! TLS for Fulcrum, on both sides. Towards clients: the certificate chain
//! and private key a listener presents, loaded from PEM files into a rustls
//! server config (built when the config is validated, so a reload with a
//! broken file keeps the running one), optionally checking client
//! certificates, and `ClientStream`, a client connection that is plain TCP
//! or TLS over it. Towards servers: client configs for libpq's verification
//! levels. And the certificate facts logins need: the channel-binding hash
//! (`tls-server-end-point`) and a certificate's common name. It knows
//! nothing of a wire protocol: when to start a handshake (PostgreSQL's
//! SSLRequest, MySQL's SSL request) is the protocol crate's business.

#![forbid(unsafe_code)]

mod certs;
mod client;
mod end_point;
mod server_stream;
mod stream;
mod subject;

pub use certs::{server_config, MinVersion, TlsError};
pub use client::{
    client_config, connect, load_certificates, peer_certificate, root_store, server_name, Verify,
};
pub use end_point::certificate_hash;
pub use server_stream::ServerStream;
pub use stream::ClientStream;
pub use subject::common_name;
pub use tokio_rustls::TlsAcceptor;
pub use {rustls, tokio_rustls};
