//! Validates a `[[cluster]]`'s `topology` and the keys of its source:
//! `etcd_*`, `patroni_*`, `on_coordinator_loss` and `instance_name`. A key
//! of one source set while the cluster uses another is an error, not a
//! silent no-op.

use std::path::Path;

use super::table::Table;
use crate::error::Problem;
use crate::raw::RawCluster;
use crate::types::{defaults, CoordinatorLoss, Etcd, Failover, Health, Patroni, Topology};

const SOURCES: &[(&str, u8)] = &[("probe", 0), ("etcd", 1), ("patroni", 2)];
const LOSSES: &[(&str, CoordinatorLoss)] = &[
    ("hold", CoordinatorLoss::Hold),
    ("last_known", CoordinatorLoss::LastKnown),
];

pub(super) fn topology(
    t: &Table,
    c: &RawCluster,
    health: &Health,
    base: &Path,
) -> Result<Topology, Problem> {
    let source = t.choice(&c.topology, "topology", SOURCES, Some(0))?;
    let etcd_keys: [(&str, Option<std::ops::Range<usize>>); 9] = [
        (
            "etcd_endpoints",
            c.etcd_endpoints.as_ref().map(|v| v.span()),
        ),
        ("etcd_prefix", c.etcd_prefix.as_ref().map(|v| v.span())),
        ("etcd_lease", c.etcd_lease.as_ref().map(|v| v.span())),
        ("etcd_user", c.etcd_user.as_ref().map(|v| v.span())),
        ("etcd_password", c.etcd_password.as_ref().map(|v| v.span())),
        ("etcd_tls_ca", c.etcd_tls_ca.as_ref().map(|v| v.span())),
        (
            "etcd_tls_certificate",
            c.etcd_tls_certificate.as_ref().map(|v| v.span()),
        ),
        (
            "etcd_tls_private_key",
            c.etcd_tls_private_key.as_ref().map(|v| v.span()),
        ),
        ("instance_name", c.instance_name.as_ref().map(|v| v.span())),
    ];
    let patroni_keys: [(&str, Option<std::ops::Range<usize>>); 2] = [
        (
            "patroni_endpoints",
            c.patroni_endpoints.as_ref().map(|v| v.span()),
        ),
        (
            "patroni_timeout",
            c.patroni_timeout.as_ref().map(|v| v.span()),
        ),
    ];
    let stray =
        |keys: &[(&str, Option<std::ops::Range<usize>>)], wanted: &str| -> Result<(), Problem> {
            match keys.iter().find_map(|(key, at)| Some((key, at.clone()?))) {
                Some((key, at)) => Err(Problem::new(
                    t.line(&at),
                    t.key(key),
                    format!(
                        "is set but topology is not \"{wanted}\" (it is {:?})",
                        SOURCES[source as usize].0
                    ),
                )),
                None => Ok(()),
            }
        };
    if source != 1 {
        stray(&etcd_keys, "etcd")?;
    }
    if source != 2 {
        stray(&patroni_keys, "patroni")?;
    }
    if source == 0 {
        if let Some(v) = &c.on_coordinator_loss {
            return Err(t.error(
                v,
                "on_coordinator_loss",
                "is set but topology is \"probe\": there is no coordinator to lose",
            ));
        }
        return Ok(Topology::Probe);
    }
    let on_loss = t.choice(
        &c.on_coordinator_loss,
        "on_coordinator_loss",
        LOSSES,
        Some(defaults::ON_COORDINATOR_LOSS),
    )?;
    if source == 2 {
        if health.failover == Failover::Promote {
            let reason = "failover = \"promote\" cannot go with topology = \"patroni\": Patroni promotes, Fulcrum follows (use failover = \"follow\")";
            return Err(match &c.failover {
                Some(v) => t.error(v, "failover", reason),
                None => t.error_at_header("failover", reason),
            });
        }
        let endpoints = endpoint_list(t, &c.patroni_endpoints, "patroni_endpoints", true)?;
        let timeout = t.duration(
            &c.patroni_timeout,
            "patroni_timeout",
            defaults::PATRONI_TIMEOUT,
        )?;
        return Ok(Topology::Patroni(Patroni {
            endpoints,
            timeout,
            on_loss,
        }));
    }
    let endpoints = endpoint_list(t, &c.etcd_endpoints, "etcd_endpoints", false)?;
    let prefix = t.text(&c.etcd_prefix, "etcd_prefix", Some(defaults::ETCD_PREFIX))?;
    if !prefix.starts_with('/') {
        let v = c.etcd_prefix.as_ref().expect("the default starts with /");
        return Err(t.error(v, "etcd_prefix", "must start with \"/\""));
    }
    let lease = t.duration(&c.etcd_lease, "etcd_lease", defaults::ETCD_LEASE)?;
    if lease < std::time::Duration::from_secs(2) {
        let v = c.etcd_lease.as_ref().expect("the default is 5s");
        return Err(t.error(
            v,
            "etcd_lease",
            "must be at least 2s (etcd's own minimum lease)",
        ));
    }
    let user = match &c.etcd_user {
        None => None,
        Some(_) => Some(t.text(&c.etcd_user, "etcd_user", None)?),
    };
    let password = match &c.etcd_password {
        Some(p) => t.secret(p, "etcd_password", base)?,
        None => String::new(),
    };
    match (&c.etcd_user, &c.etcd_password) {
        (Some(u), None) => return Err(t.error(u, "etcd_user", "needs etcd_password as well")),
        (None, Some(p)) => return Err(t.error(p, "etcd_password", "needs etcd_user as well")),
        _ => {}
    }
    let (tls, tls_digest) = tls(t, c, base)?;
    let instance = match &c.instance_name {
        Some(_) => t.text(&c.instance_name, "instance_name", None)?,
        None => format!("{}-{}", host_name(), std::process::id()),
    };
    Ok(Topology::Etcd(Etcd {
        endpoints,
        prefix: prefix.trim_end_matches('/').to_owned(),
        lease,
        user,
        password,
        tls,
        tls_digest,
        on_loss,
        instance,
    }))
}

/// A non-empty list of endpoints; `urls` wants `http://host:port`
/// (Patroni), otherwise `host:port` (etcd; TLS is `etcd_tls_ca`'s).
fn endpoint_list(
    t: &Table,
    raw: &crate::raw::Value<Vec<String>>,
    name: &str,
    urls: bool,
) -> Result<Vec<String>, Problem> {
    let Some(list) = raw else {
        return Err(t.error_at_header(name, "required key is missing"));
    };
    if list.get_ref().is_empty() {
        return Err(t.error(list, name, "must list at least one endpoint"));
    }
    let mut out = Vec::new();
    for e in list.get_ref() {
        let rest = if urls {
            match e.strip_prefix("http://") {
                Some(rest) => rest,
                None => {
                    return Err(t.error(
                        list,
                        name,
                        format!("{e:?} is not a Patroni REST URL (http://host:port)"),
                    ))
                }
            }
        } else {
            e.as_str()
        };
        let rest = rest.trim_end_matches('/');
        let ok = rest.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !ok {
            let want = if urls {
                "http://host:port"
            } else {
                "host:port"
            };
            return Err(t.error(list, name, format!("{e:?} is not {want}")));
        }
        out.push(if urls {
            format!("http://{rest}")
        } else {
            rest.to_owned()
        });
    }
    Ok(out)
}

/// TLS to etcd: on when `etcd_tls_ca` is set (the server's certificate is
/// checked against it, name included); `etcd_tls_certificate` and
/// `etcd_tls_private_key` add a client identity.
fn tls(
    t: &Table,
    c: &RawCluster,
    base: &Path,
) -> Result<
    (
        Option<std::sync::Arc<fulcrum_tls::rustls::ClientConfig>>,
        u64,
    ),
    Problem,
> {
    let (ca, cert, key) = (
        &c.etcd_tls_ca,
        &c.etcd_tls_certificate,
        &c.etcd_tls_private_key,
    );
    let Some(ca) = ca else {
        if let Some(v) = cert.as_ref().or(key.as_ref()) {
            let name = if cert.is_some() {
                "etcd_tls_certificate"
            } else {
                "etcd_tls_private_key"
            };
            return Err(t.error(
                v,
                name,
                "needs etcd_tls_ca as well (TLS to etcd is on when it is set)",
            ));
        }
        return Ok((None, 0));
    };
    let path = |v: &toml::Spanned<String>| base.join(v.get_ref());
    let identity = match (cert, key) {
        (Some(c), Some(k)) => {
            crate::private_file::check(&path(k))
                .map_err(|why| t.error(k, "etcd_tls_private_key", why))?;
            Some((path(c), path(k)))
        }
        (Some(c), None) => {
            return Err(t.error(
                c,
                "etcd_tls_certificate",
                "needs etcd_tls_private_key as well",
            ))
        }
        (None, Some(k)) => {
            return Err(t.error(
                k,
                "etcd_tls_private_key",
                "needs etcd_tls_certificate as well",
            ))
        }
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
            t.error(ca, "etcd_tls_ca", e.to_string())
        }
        (_, Some(c)) => t.error(c, "etcd_tls_certificate", e.to_string()),
        _ => t.error(ca, "etcd_tls_ca", e.to_string()),
    })?;
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in std::iter::once(&ca_path).chain(identity.iter().flat_map(|(c, k)| [c, k])) {
        std::fs::read(p).unwrap_or_default().hash(&mut h);
    }
    Ok((Some(config), h.finish()))
}

/// The machine's name (Linux), for the default instance name.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "fulcrum".into())
}
