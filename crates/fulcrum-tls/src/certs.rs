//! Certificates and keys from PEM files into a rustls `ServerConfig`, and
//! the reloadable holder a listener reads its acceptor from.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("{path}: no certificate in the file (expected PEM \"BEGIN CERTIFICATE\")")]
    NoCertificate { path: PathBuf },
    #[error("certificate {cert} and key {key} do not go together: {reason}")]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
}

/// The oldest protocol version a listener accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MinVersion {
    Tls12,
    Tls13,
}

/// The largest PEM file read (a chain of a few certificates is a few kB).
const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// A PEM file must be a regular file of sane size: a device such as
/// `/dev/zero` named by mistake would otherwise be read without end.
pub(crate) fn check_file(path: &Path) -> Result<(), TlsError> {
    let fail = |reason: String| TlsError::File {
        path: path.to_owned(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    if !meta.is_file() {
        return Err(fail("not a regular file".into()));
    }
    if meta.len() > MAX_PEM_BYTES {
        return Err(fail(format!(
            "{} bytes: larger than a PEM file is ({MAX_PEM_BYTES} at most)",
            meta.len()
        )));
    }
    Ok(())
}

/// A PEM file's read or parse error, naming the file.
pub(crate) fn pem_error(path: &Path, e: rustls_pki_types::pem::Error) -> TlsError {
    TlsError::File {
        path: path.to_owned(),
        reason: match e {
            rustls_pki_types::pem::Error::Io(io) => io.to_string(),
            rustls_pki_types::pem::Error::NoItemsFound => {
                "no private key in the file (expected PEM \"BEGIN PRIVATE KEY\", RSA or EC)".into()
            }
            other => format!("not a valid PEM file ({other:?})"),
        },
    }
}

/// A rustls server config presenting the chain in `cert` with the key in
/// `key` (PEM files), from TLS `min` up, offering `alpn` protocols. With
/// `client_ca`, clients may present a certificate, which must be signed by
/// a CA of that file (whether one is required is the login's business:
/// `client_auth = "cert"`).
pub fn server_config(
    cert: &Path,
    key: &Path,
    min: MinVersion,
    alpn: &[&[u8]],
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let file_error = pem_error;
    check_file(cert)?;
    check_file(key)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| file_error(cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(cert, e))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert.to_owned(),
        });
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error(key, e))?;
    let versions: &[&rustls::SupportedProtocolVersion] = match min {
        MinVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        MinVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| TlsError::Mismatch {
            cert: cert.to_owned(),
            key: key.to_owned(),
            reason: e.to_string(),
        })?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let roots = Arc::new(crate::client::root_store(ca)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsError::File {
                    path: ca.to_owned(),
                    reason: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, private)
        .map_err(|e| TlsError::Mismatch {
            cert: cert.to_owned(),
            key: key.to_owned(),
            reason: e.to_string(),
        })?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// A self-signed EC certificate and its key, made by openssl in a new
    /// directory.
    fn self_signed(tag: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("fulcrum-tls-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        let status = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args(["-nodes", "-days", "1", "-subj", "/CN=localhost"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl");
        assert!(status.success());
        (cert, key)
    }

    #[test]
    fn a_certificate_and_its_key_make_a_config() {
        let (cert, key) = self_signed("good");
        let c = server_config(&cert, &key, MinVersion::Tls12, &[b"postgresql"], None).unwrap();
        assert_eq!(c.alpn_protocols, vec![b"postgresql".to_vec()]);
    }

    #[test]
    fn broken_files_are_named() {
        let (cert, key) = self_signed("broken");
        let missing = cert.with_file_name("nope.pem");
        let e = server_config(&missing, &key, MinVersion::Tls12, &[], None).unwrap_err();
        assert!(
            e.to_string().starts_with(&missing.display().to_string()),
            "{e}"
        );
        // A key where the certificate should be.
        let e = server_config(&key, &key, MinVersion::Tls12, &[], None).unwrap_err();
        assert!(matches!(e, TlsError::NoCertificate { .. }), "{e}");
        // A certificate where the key should be.
        let e = server_config(&cert, &cert, MinVersion::Tls12, &[], None).unwrap_err();
        assert!(e.to_string().contains("no private key"), "{e}");
        // Not a regular file.
        let e =
            server_config(Path::new("/dev/zero"), &key, MinVersion::Tls12, &[], None).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        // Another certificate's key.
        let (_, other_key) = self_signed("other");
        let e = server_config(&cert, &other_key, MinVersion::Tls13, &[], None).unwrap_err();
        assert!(matches!(e, TlsError::Mismatch { .. }), "{e}");
    }
}
