//! Server-side TLS settings (Fulcrum to its backends): `server_tls` with
//! libpq's meanings, `server_tls_ca`, Fulcrum's own client certificate
//! (`server_tls_certificate`, `server_tls_private_key`) and
//! `server_channel_binding`, set per `[[cluster]]` and overridable per
//! `[[cluster.backend]]`. The files are loaded while validating, like the
//! listener's, so a broken file is a config error naming file, line and key.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use toml::Spanned;

use crate::error::Problem;
use crate::raw::Value;
use crate::validate::table::Table;

/// libpq's `sslmode`, for Fulcrum's own server connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerTlsMode {
    /// Plain text.
    Disable,
    /// TLS when the server offers it, plain text otherwise.
    Prefer,
    /// TLS or no connection; the certificate is not checked.
    Require,
    /// TLS, with a certificate signed by `server_tls_ca`.
    VerifyCa,
    /// And issued for the backend's host name (or IP address).
    VerifyFull,
}

/// Whether SCRAM logins to servers bind to the TLS channel
/// (SCRAM-SHA-256-PLUS, `tls-server-end-point`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelBinding {
    Disable,
    /// When the connection is TLS and the server offers it.
    Prefer,
    /// A login without channel binding is refused (TLS and SCRAM-PLUS needed).
    Require,
}

/// One backend's TLS, as resolved from its table and its cluster's.
#[derive(Clone)]
pub struct ServerTls {
    pub mode: ServerTlsMode,
    pub ca: Option<PathBuf>,
    pub certificate: Option<PathBuf>,
    pub private_key: Option<PathBuf>,
    pub channel_binding: ChannelBinding,
    /// The files' bytes when read: a renewed file is a change.
    pub files_digest: u64,
    /// Built when validated; `None` when `mode` is `Disable`.
    pub client_config: Option<Arc<fulcrum_tls::rustls::ClientConfig>>,
}

impl ServerTlsMode {
    /// The server's certificate is checked (`verify-ca`, `verify-full`).
    pub fn verifies(self) -> bool {
        matches!(self, ServerTlsMode::VerifyCa | ServerTlsMode::VerifyFull)
    }
}

/// A link no one but this machine can sit in the middle of: a Unix-domain
/// socket (an address that is a path) or a loopback address.
pub fn local_link(address: &str) -> bool {
    if address.starts_with('/') {
        return true;
    }
    let host = match address.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => address,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether a password may go to the server at `address` in a form a man in
/// the middle could read or replay (a cleartext password, caching_sha2's
/// full authentication): only over a local link, or TLS whose certificate
/// was verified.
pub fn may_send_password(address: &str, tls_verified: bool) -> bool {
    tls_verified || local_link(address)
}

impl ServerTls {
    /// No TLS to the server.
    pub fn disabled() -> ServerTls {
        ServerTls {
            mode: ServerTlsMode::Disable,
            ca: None,
            certificate: None,
            private_key: None,
            channel_binding: ChannelBinding::Prefer,
            files_digest: 0,
            client_config: None,
        }
    }
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls")
            .field("mode", &self.mode)
            .field("ca", &self.ca)
            .field("certificate", &self.certificate)
            .field("private_key", &self.private_key)
            .field("channel_binding", &self.channel_binding)
            .finish_non_exhaustive()
    }
}

impl PartialEq for ServerTls {
    fn eq(&self, o: &ServerTls) -> bool {
        (
            self.mode,
            &self.ca,
            &self.certificate,
            &self.private_key,
            self.channel_binding,
            self.files_digest,
        ) == (
            o.mode,
            &o.ca,
            &o.certificate,
            &o.private_key,
            o.channel_binding,
            o.files_digest,
        )
    }
}

pub(crate) const MODES: &[(&str, ServerTlsMode)] = &[
    ("disable", ServerTlsMode::Disable),
    ("prefer", ServerTlsMode::Prefer),
    ("require", ServerTlsMode::Require),
    ("verify-ca", ServerTlsMode::VerifyCa),
    ("verify-full", ServerTlsMode::VerifyFull),
];
const BINDINGS: &[(&str, ChannelBinding)] = &[
    ("disable", ChannelBinding::Disable),
    ("prefer", ChannelBinding::Prefer),
    ("require", ChannelBinding::Require),
];

/// The server-TLS keys of one table (a cluster's or a backend's).
pub(crate) struct RawServerTls<'r> {
    pub mode: &'r Value<String>,
    pub ca: &'r Value<String>,
    pub certificate: &'r Value<String>,
    pub private_key: &'r Value<String>,
    pub channel_binding: &'r Value<String>,
}

/// The backend's key when set, else the cluster's, with the table naming it.
fn pick<'r>(
    bt: &'r Table<'r>,
    b: &'r Value<String>,
    ct: &'r Table<'r>,
    c: &'r Value<String>,
) -> (&'r Table<'r>, &'r Value<String>) {
    if b.is_some() {
        (bt, b)
    } else {
        (ct, c)
    }
}

/// Resolves one backend's server TLS from its table `b` over the cluster's `c`.
pub(crate) fn server_tls(
    bt: &Table,
    b: &RawServerTls,
    ct: &Table,
    c: &RawServerTls,
    base: &Path,
) -> Result<ServerTls, Problem> {
    let (mt, mode_value) = pick(bt, b.mode, ct, c.mode);
    let mode = mt.choice(mode_value, "server_tls", MODES, Some(ServerTlsMode::Prefer))?;
    let (cbt, cb) = pick(bt, b.channel_binding, ct, c.channel_binding);
    let channel_binding = cbt.choice(
        cb,
        "server_channel_binding",
        BINDINGS,
        Some(ChannelBinding::Prefer),
    )?;
    if channel_binding == ChannelBinding::Require && mode == ServerTlsMode::Disable {
        let reason = "server_channel_binding = \"require\" needs TLS to the server (server_tls other than \"disable\")";
        return Err(match cb {
            Some(v) => cbt.error(v, "server_channel_binding", reason),
            None => cbt.error_at_header("server_channel_binding", reason),
        });
    }
    let path = |v: &Spanned<String>| base.join(v.get_ref());
    let (cat, ca) = pick(bt, b.ca, ct, c.ca);
    let (certt, cert) = pick(bt, b.certificate, ct, c.certificate);
    let (keyt, key) = pick(bt, b.private_key, ct, c.private_key);
    let verify = match mode {
        ServerTlsMode::Disable => {
            return Ok(ServerTls {
                channel_binding,
                ..ServerTls::disabled()
            })
        }
        ServerTlsMode::Prefer | ServerTlsMode::Require => fulcrum_tls::Verify::Nothing,
        ServerTlsMode::VerifyCa => fulcrum_tls::Verify::Ca,
        ServerTlsMode::VerifyFull => fulcrum_tls::Verify::Full,
    };
    if verify != fulcrum_tls::Verify::Nothing && ca.is_none() {
        let reason = format!(
            "server_tls = \"{}\" needs server_tls_ca (the PEM file of the CA that signed the servers' certificates)",
            mode_name(mode)
        );
        return Err(match mode_value {
            Some(v) => mt.error(v, "server_tls", reason),
            None => mt.error_at_header("server_tls", reason),
        });
    }
    let identity = match (cert, key) {
        (Some(c), Some(k)) => {
            crate::private_file::check(&path(k))
                .map_err(|why| keyt.error(k, "server_tls_private_key", why))?;
            Some((path(c), path(k)))
        }
        (Some(c), None) => {
            return Err(certt.error(
                c,
                "server_tls_certificate",
                "needs server_tls_private_key as well",
            ))
        }
        (None, Some(k)) => {
            return Err(keyt.error(
                k,
                "server_tls_private_key",
                "needs server_tls_certificate as well",
            ))
        }
        (None, None) => None,
    };
    let ca_path = ca.as_ref().map(path);
    let config = fulcrum_tls::client_config(
        verify,
        ca_path.as_deref(),
        identity.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
        &[],
    )
    .map_err(|e| {
        let text = e.to_string();
        match (&e, ca, cert, key) {
            (fulcrum_tls::TlsError::Mismatch { .. }, _, _, Some(k)) => {
                keyt.error(k, "server_tls_private_key", text)
            }
            (fulcrum_tls::TlsError::File { path, .. }, _, _, Some(k))
                if identity.as_ref().is_some_and(|(_, kp)| kp == path) =>
            {
                keyt.error(k, "server_tls_private_key", text)
            }
            (
                fulcrum_tls::TlsError::File { path, .. }
                | fulcrum_tls::TlsError::NoCertificate { path },
                Some(ca),
                _,
                _,
            ) if ca_path.as_ref() == Some(path) => cat.error(ca, "server_tls_ca", text),
            (_, _, Some(c), _) => certt.error(c, "server_tls_certificate", text),
            (_, Some(ca), _, _) => cat.error(ca, "server_tls_ca", text),
            _ => mt.error_at_header("server_tls", text),
        }
    })?;
    let files_digest = if ca_path.is_none() && identity.is_none() {
        0
    } else {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for p in [ca_path.as_ref()]
            .into_iter()
            .chain(identity.iter().flat_map(|(c, k)| [Some(c), Some(k)]))
            .flatten()
        {
            std::fs::read(p).unwrap_or_default().hash(&mut h);
        }
        h.finish()
    };
    Ok(ServerTls {
        mode,
        ca: ca_path,
        certificate: identity.as_ref().map(|(c, _)| c.clone()),
        private_key: identity.map(|(_, k)| k),
        channel_binding,
        files_digest,
        client_config: Some(config),
    })
}

fn mode_name(mode: ServerTlsMode) -> &'static str {
    MODES
        .iter()
        .find(|(_, m)| *m == mode)
        .map_or("?", |(n, _)| n)
}

#[cfg(test)]
mod link_tests {
    use super::*;

    #[test]
    fn only_local_links_or_verified_tls_may_carry_a_password() {
        for local in [
            "/run/postgresql:5432",
            "127.0.0.1:5432",
            "[::1]:3306",
            "localhost:5432",
            "127.0.0.2",
        ] {
            assert!(local_link(local), "{local}");
            assert!(may_send_password(local, false), "{local}");
        }
        for remote in ["10.0.0.5:5432", "db.example.com:3306", "[2001:db8::1]:5432"] {
            assert!(!local_link(remote), "{remote}");
            assert!(!may_send_password(remote, false), "{remote}");
            assert!(
                may_send_password(remote, true),
                "{remote} over verified TLS"
            );
        }
        assert!(ServerTlsMode::VerifyCa.verifies() && ServerTlsMode::VerifyFull.verifies());
        assert!(!ServerTlsMode::Require.verifies() && !ServerTlsMode::Prefer.verifies());
    }
}
