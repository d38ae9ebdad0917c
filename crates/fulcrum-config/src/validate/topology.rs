//! Validates a `[[cluster]]`'s `topology` and the keys of its source:
//! `etcd_*`, `patroni_*`, `on_coordinator_loss` and `instance_name`. A key
//! of one source set while the cluster uses another is an error, not a
//! silent no-op.

use std::path::Path;

use super::access;
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
    let patroni_keys: [(&str, Option<std::ops::Range<usize>>); 7] = [
        (
            "patroni_endpoints",
            c.patroni_endpoints.as_ref().map(|v| v.span()),
        ),
        (
            "patroni_timeout",
            c.patroni_timeout.as_ref().map(|v| v.span()),
        ),
        ("patroni_user", c.patroni_user.as_ref().map(|v| v.span())),
        (
            "patroni_password",
            c.patroni_password.as_ref().map(|v| v.span()),
        ),
        (
            "patroni_tls_ca",
            c.patroni_tls_ca.as_ref().map(|v| v.span()),
        ),
        (
            "patroni_tls_certificate",
            c.patroni_tls_certificate.as_ref().map(|v| v.span()),
        ),
        (
            "patroni_tls_private_key",
            c.patroni_tls_private_key.as_ref().map(|v| v.span()),
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
        return patroni(t, c, base, endpoints, timeout, on_loss);
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
    let keys = access::Keys {
        source: "etcd",
        user: &c.etcd_user,
        password: &c.etcd_password,
        ca: &c.etcd_tls_ca,
        certificate: &c.etcd_tls_certificate,
        private_key: &c.etcd_tls_private_key,
        ca_is: "TLS to etcd is on when it is set",
    };
    let (user, password) = access::credentials(t, &keys, base)?;
    let (tls, tls_digest) = access::tls(t, &keys, base)?;
    if let (Some(p), None) = (&c.etcd_password, &tls) {
        return Err(t.error(
            p,
            "etcd_password",
            "etcd_password over plain http sends it (and the token etcd answers with) in clear: \
             set etcd_tls_ca and use etcd's https client URLs",
        ));
    }
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

/// `topology = "patroni"`'s settings past its endpoints and timeout:
/// basic authentication and TLS for `https://` endpoints. A password never
/// goes to an `http://` endpoint, and an `https://` one needs the CA
/// (Fulcrum's TLS has no system roots: the CA is always named).
fn patroni(
    t: &Table,
    c: &RawCluster,
    base: &Path,
    endpoints: Vec<String>,
    timeout: std::time::Duration,
    on_loss: CoordinatorLoss,
) -> Result<Topology, Problem> {
    let keys = access::Keys {
        source: "patroni",
        user: &c.patroni_user,
        password: &c.patroni_password,
        ca: &c.patroni_tls_ca,
        certificate: &c.patroni_tls_certificate,
        private_key: &c.patroni_tls_private_key,
        ca_is: "https:// endpoints are checked against it",
    };
    let (user, password) = access::credentials(t, &keys, base)?;
    let plain = endpoints.iter().find(|e| e.starts_with("http://"));
    if let (Some(p), Some(e)) = (&c.patroni_password, plain) {
        return Err(t.error(
            p,
            "patroni_password",
            format!(
                "patroni_password over http:// sends it in clear: use https:// endpoints \
                 ({e:?} is plain http)"
            ),
        ));
    }
    let (tls, tls_digest) = access::tls(t, &keys, base)?;
    let secure = endpoints.iter().find(|e| e.starts_with("https://"));
    match (&tls, secure, &c.patroni_tls_ca, &c.patroni_endpoints) {
        (None, Some(e), _, Some(list)) => {
            return Err(t.error(
                list,
                "patroni_endpoints",
                format!(
                    "{e:?} needs patroni_tls_ca (the CA that signed Patroni's restapi.certfile; \
                     Fulcrum does not use the system's roots)"
                ),
            ))
        }
        (Some(_), None, Some(ca), _) => {
            return Err(t.error(
                ca,
                "patroni_tls_ca",
                "is set but no patroni_endpoints is https://",
            ))
        }
        _ => {}
    }
    Ok(Topology::Patroni(Patroni {
        endpoints,
        timeout,
        on_loss,
        tls,
        tls_digest,
        user,
        password,
    }))
}

/// A non-empty list of endpoints; `urls` wants `http://host:port` or
/// `https://host:port` (Patroni), otherwise `host:port` (etcd; TLS is
/// `etcd_tls_ca`'s).
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
        let (scheme, rest) = if urls {
            let scheme = ["http://", "https://"]
                .into_iter()
                .find(|s| e.starts_with(s));
            match scheme {
                Some(s) => (s, &e[s.len()..]),
                None => {
                    return Err(t.error(
                        list,
                        name,
                        format!(
                        "{e:?} is not a Patroni REST URL (http://host:port or https://host:port)"
                    ),
                    ))
                }
            }
        } else {
            ("", e.as_str())
        };
        let rest = rest.trim_end_matches('/');
        let ok = rest.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !ok {
            let want = if urls {
                format!("{scheme}host:port")
            } else {
                "host:port".to_owned()
            };
            return Err(t.error(list, name, format!("{e:?} is not {want}")));
        }
        out.push(format!("{scheme}{rest}"));
    }
    Ok(out)
}

/// The machine's name (Linux), for the default instance name.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "fulcrum".into())
}
