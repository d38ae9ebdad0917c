//! Validates `[[cluster.mirror]]`: a target (`cluster`, or `address` with
//! `user` and `password`, never both), `exposure` in 0..=1, `mirror_queue`
//! at least 1, `mirror_max_transaction_bytes` a size, `mirror_mode` async
//! or sync; then, once every cluster is read, resolves `cluster = "name"`
//! to that cluster's primary (its address and server TLS) and logins.

use toml::Spanned;

use super::table::Table;
use crate::addr::check_backend_address;
use crate::error::{Lines, Problem};
use crate::raw::{RawCluster, RawMirror};
use crate::types::{defaults, Cluster, Mirror, MirrorLogin, MirrorMode, Role};

const MODES: &[(&str, MirrorMode)] = &[("async", MirrorMode::Async), ("sync", MirrorMode::Sync)];

fn items(c: &RawCluster) -> &[Spanned<RawMirror>] {
    c.mirror
        .as_ref()
        .map_or(&[][..], |m| m.get_ref().0.as_slice())
}

/// A cluster's mirrors; a `cluster` target is resolved later (`resolve`).
pub(super) fn mirrors(
    t: &Table,
    c: &RawCluster,
    base: &std::path::Path,
) -> Result<Vec<Mirror>, Problem> {
    let mut out = Vec::new();
    for (j, raw) in items(c).iter().enumerate() {
        let mt = t.child(&format!("mirror[{j}]"), raw.span());
        let m = raw.get_ref();
        let (name, address, login) = match (&m.cluster, &m.address) {
            (Some(cluster), None) => {
                for (key, given) in [("user", m.user.is_some()), ("password", m.password.is_some())] {
                    if given {
                        return Err(mt.error(cluster, key, "only with address (a cluster target logs in as the client's user, with that cluster's login)"));
                    }
                }
                let name = mt.text(&m.cluster, "cluster", None)?;
                (name, String::new(), MirrorLogin::ClientUser { users: Vec::new() })
            }
            (None, Some(address)) => {
                let text = mt.text(&m.address, "address", None)?;
                check_backend_address(&text).map_err(|why| mt.error(address, "address", why))?;
                let user = mt.text(&m.user, "user", None)?;
                let password = match &m.password {
                    Some(p) => mt.secret(p, "password", base)?,
                    None => String::new(),
                };
                (text.clone(), text, MirrorLogin::Fixed { user, password })
            }
            (Some(_), Some(address)) => {
                return Err(mt.error(address, "address", "give cluster or address, not both"))
            }
            (None, None) => {
                return Err(mt.error_at_header("cluster", "required key is missing: the target, cluster = \"name\" or address = \"host:port\""))
            }
        };
        let exposure = match &m.exposure {
            None => 1.0,
            Some(v) if (0.0..=1.0).contains(&v.get_ref().0) => v.get_ref().0,
            Some(v) => {
                return Err(mt.error(
                    v,
                    "exposure",
                    format!(
                        "must be from 0 to 1 (the share of clients mirrored), got {}",
                        v.get_ref().0
                    ),
                ))
            }
        };
        out.push(Mirror {
            name,
            address,
            login,
            tls: crate::ServerTls::disabled(),
            exposure,
            mirror_writes: m.mirror_writes.as_ref().is_some_and(|v| *v.get_ref()),
            mirror_queue: mt.u32_at_least(
                &m.mirror_queue,
                "mirror_queue",
                1,
                defaults::MIRROR_QUEUE,
            )?,
            mirror_max_transaction_bytes: mt.size(
                &m.mirror_max_transaction_bytes,
                "mirror_max_transaction_bytes",
                defaults::MIRROR_MAX_TRANSACTION_BYTES,
            )?,
            mirror_mode: mt.choice(
                &m.mirror_mode,
                "mirror_mode",
                MODES,
                Some(MirrorMode::Async),
            )?,
        });
    }
    Ok(out)
}

/// Resolves each `cluster = "name"` target: another cluster of the file,
/// of the same protocol, with a backend to send to.
pub(super) fn resolve(
    clusters: &mut [Cluster],
    raw: &[Spanned<RawCluster>],
    lines: &Lines,
) -> Result<(), Problem> {
    for i in 0..clusters.len() {
        for j in 0..clusters[i].mirrors.len() {
            let MirrorLogin::ClientUser { .. } = clusters[i].mirrors[j].login else {
                continue;
            };
            let name = clusters[i].mirrors[j].name.clone();
            let raw_mirror = &items(raw[i].get_ref())[j];
            let Some(value) = raw_mirror.get_ref().cluster.as_ref() else {
                continue; // An address target: nothing to resolve.
            };
            let problem = |why: String| {
                Problem::new(
                    lines.line(value.span().start),
                    format!("cluster[{i}].mirror[{j}].cluster"),
                    why,
                )
            };
            let Some(k) = clusters.iter().position(|c| c.name == name) else {
                let known: Vec<&str> = clusters.iter().map(|c| c.name.as_str()).collect();
                return Err(problem(format!(
                    "no [[cluster]] is named {name:?} (there are: {})",
                    known.join(", ")
                )));
            };
            if k == i {
                return Err(problem("a cluster cannot mirror to itself".into()));
            }
            if clusters[k].protocol != clusters[i].protocol {
                return Err(problem(format!("cluster {name:?} speaks another protocol")));
            }
            let target = &clusters[k];
            let backend = target
                .backends
                .iter()
                .find(|b| b.role == Role::Primary)
                .or(target.backends.first())
                .ok_or_else(|| problem(format!("cluster {name:?} has no backend")))?;
            let (address, tls) = (backend.address.clone(), backend.tls.clone());
            // A user whose password is a hash logs in only with what its
            // client proved to the target's own listener: not mirrored.
            let users = target
                .users
                .iter()
                .filter(|u| u.server_hash().is_none())
                .map(|u| {
                    (
                        u.name.clone(),
                        u.server_user().to_owned(),
                        u.server_password().to_owned(),
                    )
                })
                .collect();
            let m = &mut clusters[i].mirrors[j];
            m.address = address;
            m.tls = tls;
            m.login = MirrorLogin::ClientUser { users };
        }
    }
    Ok(())
}
