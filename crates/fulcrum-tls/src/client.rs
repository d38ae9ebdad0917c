//! Fulcrum as a TLS client of its servers: a rustls `ClientConfig` for one
//! of libpq's verification levels (`require`: encrypted, certificate not
//! checked; `verify-ca`: signed by the given CA; `verify-full`: and issued
//! for the host name), with an optional client certificate, and the
//! handshake over a connected TCP stream.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, Error, RootCertStore, SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::certs::{check_file, pem_error};
use crate::TlsError;

/// How much of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Nothing (libpq's `require`): encryption without authentication.
    Nothing,
    /// The chain up to the configured CA, any host name (`verify-ca`).
    Ca,
    /// The chain and the host name (`verify-full`).
    Full,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Certificates of a PEM file (a CA bundle or a chain).
pub fn load_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    check_file(path)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| pem_error(path, e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// A root store holding every certificate of the PEM file `ca`.
pub fn root_store(ca: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certificates(ca)? {
        roots.add(cert).map_err(|e| TlsError::File {
            path: ca.to_owned(),
            reason: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(roots)
}

/// A client config checking the server as `verify` says, against the CA
/// file `ca` (required for `Ca` and `Full`), presenting `identity`
/// (certificate chain and key files) when the server asks for one.
pub fn client_config(
    verify: Verify,
    ca: Option<&Path>,
    identity: Option<(&Path, &Path)>,
    alpn: &[&[u8]],
) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = provider();
    let verifier: Arc<dyn ServerCertVerifier> = match (verify, ca) {
        (Verify::Nothing, _) => Arc::new(NoVerification(provider.clone())),
        (_, None) => {
            return Err(TlsError::File {
                path: "".into(),
                reason: "certificate verification needs a CA file".into(),
            })
        }
        (Verify::Ca | Verify::Full, Some(ca)) => {
            let roots = Arc::new(root_store(ca)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| TlsError::File {
                    path: ca.to_owned(),
                    reason: e.to_string(),
                })?;
            if verify == Verify::Full {
                webpki
            } else {
                Arc::new(AnyName(webpki))
            }
        }
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default versions")
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = load_certificates(cert)?;
            check_file(key)?;
            let private = PrivateKeyDer::from_pem_file(key).map_err(|e| pem_error(key, e))?;
            builder
                .with_client_auth_cert(chain, private)
                .map_err(|e| TlsError::Mismatch {
                    cert: cert.to_owned(),
                    key: key.to_owned(),
                    reason: e.to_string(),
                })?
        }
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// The name a server at `host` (a DNS name or an IP address) is checked against.
pub fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
    )
    .map_err(|e| TlsError::File {
        path: host.into(),
        reason: format!("not a host name TLS can check: {e}"),
    })
}

/// The client side of a TLS handshake over `tcp`.
pub async fn connect(
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    tcp: TcpStream,
) -> std::io::Result<TlsStream<TcpStream>> {
    TlsConnector::from(config).connect(name, tcp).await
}

/// The server's own certificate on an established client stream.
pub fn peer_certificate(stream: &TlsStream<TcpStream>) -> Option<&[u8]> {
    stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref())
}

/// `require`: any certificate, but the handshake's signatures are still
/// checked (the session is encrypted to whoever holds the key).
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to the CA; the name is not checked.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
