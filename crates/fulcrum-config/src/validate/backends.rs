//! Validates a `[[cluster]]`'s `[[cluster.backend]]` tables: each address,
//! role, weight and `server_tls` (the cluster's as default), and the rules
//! across them (no address twice, one `primary` at most, somewhere for
//! writes to go).

use super::cluster::non_empty;
use super::table::Table;
use crate::addr::check_backend_address;
use crate::error::Problem;
use crate::raw::{RawBackend, RawCluster};
use crate::server_tls::RawServerTls;
use crate::types::{defaults, Backend, Role};

const ROLES: &[(&str, Role)] = &[
    ("primary", Role::Primary),
    ("replica", Role::Replica),
    ("auto", Role::Auto),
];

fn server_tls_keys(b: &RawBackend) -> RawServerTls<'_> {
    RawServerTls {
        mode: &b.server_tls,
        ca: &b.server_tls_ca,
        certificate: &b.server_tls_certificate,
        private_key: &b.server_tls_private_key,
        channel_binding: &b.server_channel_binding,
    }
}

/// `[[cluster.backend]]`: addresses valid and unique, at most one
/// `primary`, at least one that may take writes; each with its `server_tls`.
pub(super) fn backends(
    t: &Table,
    c: &RawCluster,
    cluster: &str,
    base: &std::path::Path,
) -> Result<Vec<Backend>, Problem> {
    let raw = &c.backend;
    let cluster_tls = RawServerTls {
        mode: &c.server_tls,
        ca: &c.server_tls_ca,
        certificate: &c.server_tls_certificate,
        private_key: &c.server_tls_private_key,
        channel_binding: &c.server_channel_binding,
    };
    let reason = format!("cluster {cluster:?} has no backends; add a [[cluster.backend]]");
    let items = non_empty(t, raw, "backend", reason)?;
    let mut out: Vec<Backend> = Vec::with_capacity(items.len());
    let mut lines: Vec<usize> = Vec::with_capacity(items.len()); // line of each address
    let mut primary: Option<(usize, usize)> = None; // (index, line)
    for (i, raw) in items.iter().enumerate() {
        let bt = t.child(&format!("backend[{i}]"), raw.span());
        let b = raw.get_ref();

        let address = bt.required(&b.address, "address")?;
        check_backend_address(address.get_ref()).map_err(|e| bt.error(address, "address", e))?;
        // Host names are case-insensitive; different names for one server can't be caught here.
        if let Some(j) = out
            .iter()
            .position(|o| o.address.eq_ignore_ascii_case(address.get_ref()))
        {
            let reason = format!(
                "{:?} is already backend[{j}] (line {})",
                address.get_ref(),
                lines[j]
            );
            return Err(bt.error(address, "address", reason));
        }
        lines.push(bt.line(&address.span()));

        let role = bt.choice(&b.role, "role", ROLES, None)?;
        if let (Role::Primary, Some(role_value)) = (role, &b.role) {
            if let Some((j, line)) = primary {
                let reason = format!(
                    "backend[{j}] (line {line}) is already the primary; a cluster has at most one backend with role \"primary\""
                );
                return Err(bt.error(role_value, "role", reason));
            }
            primary = Some((i, bt.line(&role_value.span())));
        }

        let weight = bt.u32_at_least(&b.weight, "weight", 0, defaults::WEIGHT)?;
        let tls = crate::server_tls::server_tls(&bt, &server_tls_keys(b), t, &cluster_tls, base)?;
        out.push(Backend {
            address: address.get_ref().clone(),
            role,
            weight,
            tls,
        });
    }
    if !out
        .iter()
        .any(|b| matches!(b.role, Role::Primary | Role::Auto))
    {
        let reason = format!(
            "cluster {cluster:?} has no backend with role \"primary\" or \"auto\", so writes would have nowhere to go"
        );
        return Err(t.error(&items[0], "backend", reason));
    }
    Ok(out)
}
