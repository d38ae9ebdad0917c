//! How Fulcrum reaches a coordinator (etcd or Patroni) safely: TLS
//! (`<source>_tls_ca` and the optional client identity
//! `<source>_tls_certificate` / `<source>_tls_private_key`) and
//! credentials (`<source>_user` / `<source>_password`), validated the same
//! way for both. A password that would cross the network in clear (no
//! TLS) is a config error, not a warning.

use std::path::Path;
use std::sync::Arc;

use toml::Spanned;

use super::table::Table;
use crate::error::Problem;
use crate::raw::{SecretText, Value};

/// One source's access keys as written.
pub(super) struct Keys<'a> {
    /// `etcd` or `patroni`: the keys' prefix.
    pub source: &'static str,
    pub user: &'a Value<String>,
    pub password: &'a Value<SecretText>,
    pub ca: &'a Value<String>,
    pub certificate: &'a Value<String>,
    pub private_key: &'a Value<String>,
    /// Why the CA must come with the client identity, for the error.
    pub ca_is: &'static str,
}

/// The validated TLS config (when `<source>_tls_ca` is set) and a digest
/// of its files' contents (equal configs, equal files).
pub(super) type Tls = (Option<Arc<fulcrum_tls::rustls::ClientConfig>>, u64);

/// `<source>_user` and `<source>_password`: both or neither.
pub(super) fn credentials(
    t: &Table,
    k: &Keys,
    base: &Path,
) -> Result<(Option<String>, String), Problem> {
    let (user_key, password_key) = (
        format!("{}_user", k.source),
        format!("{}_password", k.source),
    );
    let user = match k.user {
        None => None,
        Some(_) => Some(t.text(k.user, &user_key, None)?),
    };
    let password = match k.password {
        Some(p) => t.secret(p, &password_key, base)?,
        None => String::new(),
    };
    match (k.user, k.password) {
        (Some(u), None) => Err(t.error(u, &user_key, format!("needs {password_key} as well"))),
        (None, Some(p)) => Err(t.error(p, &password_key, format!("needs {user_key} as well"))),
        _ => Ok((user, password)),
    }
}

/// TLS to the source: on when `<source>_tls_ca` is set (the server's
/// certificate is checked against it, name included); the certificate and
/// private key add a client identity.
pub(super) fn tls(t: &Table, k: &Keys, base: &Path) -> Result<Tls, Problem> {
    let ca_key = format!("{}_tls_ca", k.source);
    let cert_key = format!("{}_tls_certificate", k.source);
    let key_key = format!("{}_tls_private_key", k.source);
    let (cert, key) = (k.certificate, k.private_key);
    let Some(ca) = k.ca else {
        if let Some(v) = cert.as_ref().or(key.as_ref()) {
            let name = if cert.is_some() { &cert_key } else { &key_key };
            return Err(t.error(v, name, format!("needs {ca_key} as well ({})", k.ca_is)));
        }
        return Ok((None, 0));
    };
    let path = |v: &Spanned<String>| base.join(v.get_ref());
    let identity = match (cert, key) {
        (Some(c), Some(k)) => {
            crate::private_file::check(&path(k)).map_err(|why| t.error(k, &key_key, why))?;
            Some((path(c), path(k)))
        }
        (Some(c), None) => return Err(t.error(c, &cert_key, format!("needs {key_key} as well"))),
        (None, Some(k)) => return Err(t.error(k, &key_key, format!("needs {cert_key} as well"))),
        (None, None) => None,
    };
    let ca_path = path(ca);
    let config = fulcrum_tls::client_config(
        fulcrum_tls::Verify::Full,
        Some(&ca_path),
        identity.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
        &[b"http/1.1"],
    )
    .map_err(|e| match (&e, cert) {
        (fulcrum_tls::TlsError::File { path, .. }, _) if *path == ca_path => {
            t.error(ca, &ca_key, e.to_string())
        }
        (_, Some(c)) => t.error(c, &cert_key, e.to_string()),
        _ => t.error(ca, &ca_key, e.to_string()),
    })?;
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in std::iter::once(&ca_path).chain(identity.iter().flat_map(|(c, k)| [c, k])) {
        std::fs::read(p).unwrap_or_default().hash(&mut h);
    }
    Ok((Some(config), h.finish()))
}
