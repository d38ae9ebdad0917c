//! Client-side TLS settings of a listener (`tls_mode`, `tls_certificate`,
//! `tls_private_key`, `tls_min_version`), each taken from the cluster's
//! table or else from `[fulcrum]`. The certificate and key are loaded while
//! validating, so a missing, unreadable or mismatched file is a config error
//! naming file, line and key, at `fulcrum check`, at start and at RELOAD
//! (which then keeps the running config and its certificates).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use toml::Spanned;

use crate::error::Problem;
use crate::raw::{RawCluster, RawGlobal, Value};
use crate::types::Protocol;
use crate::validate::table::Table;

/// Whether clients may, or must, use TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// SSLRequest answered `N`; MySQL offers no SSL capability.
    Disable,
    /// TLS for clients that ask, plain text for the others.
    Allow,
    /// A client that does not use TLS is refused (28000 / ERR 3159).
    Require,
}

/// The oldest TLS version accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVersion {
    Tls12,
    Tls13,
}

/// A listener's TLS, when `tls_mode` is not `disable`.
#[derive(Clone)]
pub struct ClientTls {
    pub mode: TlsMode,
    pub certificate: PathBuf,
    pub private_key: PathBuf,
    pub min_version: TlsVersion,
    /// CA file client certificates are checked against (`tls_client_ca`).
    pub client_ca: Option<PathBuf>,
    /// The `tls-server-end-point` hash of the listener's certificate, for
    /// SCRAM-SHA-256-PLUS (`None` when its signature names no hash).
    pub end_point_hash: Option<Vec<u8>>,
    /// A digest of both files' bytes when they were read: a reload with the
    /// same paths but new contents (a renewed certificate) is a change.
    pub files_digest: u64,
    /// Built from the files above when the config was validated.
    pub server_config: Arc<fulcrum_tls::rustls::ServerConfig>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("mode", &self.mode)
            .field("certificate", &self.certificate)
            .field("private_key", &self.private_key)
            .field("min_version", &self.min_version)
            .field("client_ca", &self.client_ca)
            .finish_non_exhaustive()
    }
}

impl PartialEq for ClientTls {
    fn eq(&self, o: &ClientTls) -> bool {
        (
            self.mode,
            &self.certificate,
            &self.private_key,
            self.min_version,
            &self.client_ca,
            self.files_digest,
        ) == (
            o.mode,
            &o.certificate,
            &o.private_key,
            o.min_version,
            &o.client_ca,
            o.files_digest,
        )
    }
}

const MODES: &[(&str, TlsMode)] = &[
    ("disable", TlsMode::Disable),
    ("allow", TlsMode::Allow),
    ("require", TlsMode::Require),
];
const VERSIONS: &[(&str, TlsVersion)] = &[("1.2", TlsVersion::Tls12), ("1.3", TlsVersion::Tls13)];

/// The cluster's key when set, else `[fulcrum]`'s, with the table that
/// names it in errors.
fn pick<'r, T>(
    ct: &'r Table<'r>,
    c: &'r Value<T>,
    gt: Option<&'r Table<'r>>,
    g: Option<&'r Value<T>>,
) -> (&'r Table<'r>, &'r Value<T>) {
    match (c, gt, g) {
        (Some(_), _, _) | (None, None, _) | (None, _, None) => (ct, c),
        (None, Some(gt), Some(g)) => (gt, g),
    }
}

pub(crate) fn client_tls(
    ct: &Table,
    c: &RawCluster,
    gt: Option<&Table>,
    g: Option<&RawGlobal>,
    protocol: Protocol,
    base: &Path,
) -> Result<Option<ClientTls>, Problem> {
    let (mt, mode) = pick(ct, &c.tls_mode, gt, g.map(|g| &g.tls_mode));
    let mode = mt.choice(mode, "tls_mode", MODES, Some(TlsMode::Disable))?;
    if mode == TlsMode::Disable {
        return Ok(None);
    }
    let (vt, version) = pick(ct, &c.tls_min_version, gt, g.map(|g| &g.tls_min_version));
    let min_version = vt.choice(
        version,
        "tls_min_version",
        VERSIONS,
        Some(TlsVersion::Tls12),
    )?;
    let (certt, cert) = pick(ct, &c.tls_certificate, gt, g.map(|g| &g.tls_certificate));
    let (keyt, key) = pick(ct, &c.tls_private_key, gt, g.map(|g| &g.tls_private_key));
    let needs = |name: &str| {
        let mode_value = c.tls_mode.as_ref().or(g.and_then(|g| g.tls_mode.as_ref()));
        let reason = format!("tls_mode = \"{}\" needs {name}", mode_name(mode));
        match mode_value {
            Some(v) => mt.error(v, "tls_mode", reason),
            None => mt.error_at_header("tls_mode", reason),
        }
    };
    let cert: &Spanned<String> = cert.as_ref().ok_or_else(|| needs("tls_certificate"))?;
    let key: &Spanned<String> = key.as_ref().ok_or_else(|| needs("tls_private_key"))?;
    let (cat, ca) = pick(ct, &c.tls_client_ca, gt, g.map(|g| &g.tls_client_ca));
    let client_ca = ca.as_ref().map(|v| base.join(v.get_ref()));
    let certificate = base.join(cert.get_ref());
    let private_key = base.join(key.get_ref());
    crate::private_file::check(&private_key)
        .map_err(|why| keyt.error(key, "tls_private_key", why))?;
    let alpn: &[&[u8]] = match protocol {
        Protocol::Postgres => &[b"postgresql"],
        Protocol::Mysql => &[],
    };
    let min = match min_version {
        TlsVersion::Tls12 => fulcrum_tls::MinVersion::Tls12,
        TlsVersion::Tls13 => fulcrum_tls::MinVersion::Tls13,
    };
    let server_config =
        fulcrum_tls::server_config(&certificate, &private_key, min, alpn, client_ca.as_deref())
            .map_err(|e| match e {
                fulcrum_tls::TlsError::File { ref path, .. }
                | fulcrum_tls::TlsError::NoCertificate { ref path }
                    if Some(path) == client_ca.as_ref() =>
                {
                    cat.error(ca.as_ref().expect("set"), "tls_client_ca", e.to_string())
                }
                fulcrum_tls::TlsError::File { ref path, .. } if *path == private_key => {
                    keyt.error(key, "tls_private_key", e.to_string())
                }
                fulcrum_tls::TlsError::Mismatch { .. } => {
                    keyt.error(key, "tls_private_key", e.to_string())
                }
                _ => certt.error(cert, "tls_certificate", e.to_string()),
            })?;
    let end_point_hash = fulcrum_tls::load_certificates(&certificate)
        .ok()
        .and_then(|chain| fulcrum_tls::certificate_hash(chain.first()?.as_ref()));
    let files_digest = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::fs::read(&certificate).unwrap_or_default().hash(&mut h);
        std::fs::read(&private_key).unwrap_or_default().hash(&mut h);
        if let Some(ca) = &client_ca {
            std::fs::read(ca).unwrap_or_default().hash(&mut h);
        }
        h.finish()
    };
    Ok(Some(ClientTls {
        mode,
        certificate,
        private_key,
        min_version,
        client_ca,
        end_point_hash,
        files_digest,
        server_config,
    }))
}

/// The admin console's TLS: `[fulcrum]`'s `tls_*` keys, as a cluster that
/// sets none of its own would take them (PostgreSQL protocol, ALPN
/// `postgresql`).
pub(crate) fn console_tls(
    gt: &Table,
    g: &RawGlobal,
    base: &Path,
) -> Result<Option<ClientTls>, Problem> {
    client_tls(
        gt,
        &RawCluster::default(),
        Some(gt),
        Some(g),
        Protocol::Postgres,
        base,
    )
}

fn mode_name(mode: TlsMode) -> &'static str {
    MODES
        .iter()
        .find(|(_, m)| *m == mode)
        .map_or("?", |(n, _)| n)
}
