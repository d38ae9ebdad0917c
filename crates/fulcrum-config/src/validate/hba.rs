//! `auth_hba_file` of a `[[cluster]]` with `client_auth = "hba"`: the file
//! read (through `crate::hba`) when the config is, so a bad line is a config
//! error at `fulcrum check`, at start and at reload (which keeps the running
//! rules), shown as `fulcrum.toml:N: cluster[i].auth_hba_file: hba.conf:L: why`;
//! and the lines that could never work with the cluster's TLS settings.

use std::path::Path;

use super::table::Table;
use crate::error::Problem;
use crate::hba::{ConnKind, Hba, HbaMethod};
use crate::raw::RawCluster;
use crate::types::ClientAuth;
use crate::ClientTls;

/// The rules when `client_auth = "hba"`, else `None` (and `auth_hba_file`
/// must not be set).
pub(super) fn hba(
    t: &Table,
    c: &RawCluster,
    client_auth: ClientAuth,
    tls: Option<&ClientTls>,
    base: &Path,
) -> Result<Option<Hba>, Problem> {
    if client_auth != ClientAuth::Hba {
        if let Some(v) = &c.auth_hba_file {
            return Err(t.error(
                v,
                "auth_hba_file",
                "is read only with client_auth = \"hba\"",
            ));
        }
        return Ok(None);
    }
    let Some(value) = &c.auth_hba_file else {
        let v = c.client_auth.as_ref().expect("hba is never the default");
        return Err(t.error(
            v,
            "client_auth",
            "client_auth = \"hba\" needs auth_hba_file (the rules, in pg_hba.conf's format)",
        ));
    };
    let name = t.text(&c.auth_hba_file, "auth_hba_file", None)?;
    let path = base.join(name);
    let fail = |line: usize, reason: &str| {
        let at = match line {
            0 => format!("{}", path.display()),
            n => format!("{}:{n}", path.display()),
        };
        t.error(value, "auth_hba_file", format!("{at}: {reason}"))
    };
    let hba = Hba::load(&path).map_err(|e| fail(e.line, &e.reason))?;
    for rule in &hba.rules {
        if rule.kind == ConnKind::HostSsl && tls.is_none() {
            return Err(fail(
                rule.line,
                "a hostssl line cannot match: the cluster's tls_mode is \"disable\"",
            ));
        }
        if rule.method == HbaMethod::Cert && tls.is_none_or(|t| t.client_ca.is_none()) {
            return Err(fail(
                rule.line,
                "cert needs tls_client_ca (the CA that signs the clients' certificates)",
            ));
        }
    }
    Ok(Some(hba))
}
