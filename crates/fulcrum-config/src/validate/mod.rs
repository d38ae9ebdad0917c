//! Turns the file as written (`crate::raw`) into the validated [`Config`]: applies defaults,
//! checks each value and the rules that span keys (unique names, non-overlapping listeners).
//! Pure (no I/O); stops at the first problem found and reports that one.

mod access;
mod backends;
mod cache;
mod cluster;
mod credentials;
mod databases;
mod hba;
mod health;
mod mirror;
pub(crate) mod table;
mod topology;
mod unix_socket;
mod user_pool;

use std::net::SocketAddr;
use std::path::Path;

use toml::Spanned;

use crate::addr::listeners_conflict;
use crate::error::{Lines, Problem};
use crate::raw::{RawCluster, RawConfig, RawGlobal, Tables, Value};
use crate::types::{defaults, ClientAuth, Cluster, Config, Global, LogFormat};
use table::Table;

pub(crate) fn validate(raw: &RawConfig, lines: &Lines, source: &Path) -> Result<Config, Problem> {
    let base = source.parent().unwrap_or(Path::new("."));
    let fulcrum = global(raw.fulcrum.as_ref(), lines, base)?;
    let raw_clusters = raw.cluster.as_ref();
    let clusters = clusters(raw_clusters, lines, raw.fulcrum.as_ref(), base)?;

    let mut listeners = Vec::new();
    if let Some(g) = &raw.fulcrum {
        let g = g.get_ref();
        listeners.extend(listener("fulcrum.admin", &g.admin, fulcrum.admin, lines));
        listeners.extend(listener(
            "fulcrum.metrics",
            &g.metrics,
            fulcrum.metrics,
            lines,
        ));
    }
    let raw_clusters = raw_clusters.map_or(&[][..], |c| c.get_ref().0.as_slice());
    for (i, (raw, cluster)) in raw_clusters.iter().zip(&clusters).enumerate() {
        let key = format!("cluster[{i}].listen");
        // Port 0 lets the OS pick a port per listener: never shared.
        let shared = cluster.listen.port() != 0;
        if let Some(j) = clusters[..i]
            .iter()
            .position(|c| shared && c.listen == cluster.listen)
        {
            // The same address as an earlier cluster: one port, the
            // client's database picks the cluster.
            let line = raw
                .get_ref()
                .listen
                .as_ref()
                .map_or(1, |v| lines.line(v.span().start));
            shared_port(&clusters[..=i], j, line, &key)?;
            continue;
        }
        listeners.extend(listener(
            &key,
            &raw.get_ref().listen,
            Some(cluster.listen),
            lines,
        ));
    }
    check_listeners(&listeners)?;
    unix_socket::distinct(raw_clusters, &clusters, lines)?;

    Ok(Config {
        source: source.to_owned(),
        fulcrum,
        clusters,
    })
}

fn global(raw: Option<&Spanned<RawGlobal>>, lines: &Lines, base: &Path) -> Result<Global, Problem> {
    let Some(raw) = raw else {
        return Ok(Global {
            admin: None,
            metrics: None,
            log: defaults::LOG.to_string(),
            workers: defaults::WORKERS,
            log_format: defaults::LOG_FORMAT,
            slow_query_threshold: None,
            shutdown_timeout: defaults::SHUTDOWN_TIMEOUT,
            upgrade_timeout: defaults::UPGRADE_TIMEOUT,
            dns_max_ttl: defaults::DNS_MAX_TTL,
            admin_users: Vec::new(),
            admin_auth: defaults::ADMIN_AUTH,
            stats_users: Vec::new(),
            status_key: None,
            admin_tls: None,
        });
    };
    let t = Table::new(lines, "fulcrum", raw.span());
    let g = raw.get_ref();
    let addr =
        |value: &Value<String>, name| value.as_ref().map(|v| t.socket_addr(v, name)).transpose();
    Ok(Global {
        admin: addr(&g.admin, "admin")?,
        metrics: addr(&g.metrics, "metrics")?,
        log: log_filter(&t, &g.log)?,
        workers: t.u32_at_least(&g.workers, "workers", 0, defaults::WORKERS)?,
        log_format: t.choice(
            &g.log_format,
            "log_format",
            &[("text", LogFormat::Text), ("json", LogFormat::Json)],
            Some(defaults::LOG_FORMAT),
        )?,
        slow_query_threshold: match &g.slow_query_threshold {
            None => None,
            Some(_) => Some(t.duration(
                &g.slow_query_threshold,
                "slow_query_threshold",
                std::time::Duration::ZERO,
            )?),
        },
        shutdown_timeout: t.duration(
            &g.shutdown_timeout,
            "shutdown_timeout",
            defaults::SHUTDOWN_TIMEOUT,
        )?,
        upgrade_timeout: t.duration(
            &g.upgrade_timeout,
            "upgrade_timeout",
            defaults::UPGRADE_TIMEOUT,
        )?,
        dns_max_ttl: match &g.dns_max_ttl {
            None => defaults::DNS_MAX_TTL,
            Some(_) => t
                .duration_or_off(&g.dns_max_ttl, "dns_max_ttl")?
                .unwrap_or_default(),
        },
        stats_users: stats_users(&t, g)?,
        status_key: match &g.status_key {
            None => None,
            Some(k) => {
                let key = t.secret(k, "status_key", base)?;
                if key.len() < 16 {
                    return Err(t.error(k, "status_key", "must be at least 16 characters: it guards a page that may be on a public port"));
                }
                Some(crate::types::StatusKey(key))
            }
        },
        admin_tls: crate::tls::console_tls(&t, g, base)?,
        admin_users: admin_users(&t, g, base)?,
        // No "trust": the console can stop traffic and promote servers.
        admin_auth: t.choice(
            &g.admin_auth,
            "admin_auth",
            &[
                ("scram-sha-256", ClientAuth::ScramSha256),
                ("md5", ClientAuth::Md5),
            ],
            Some(defaults::ADMIN_AUTH),
        )?,
    })
}

/// `stats_users`: names of `[[fulcrum.admin_user]]` entries limited to SHOW.
fn stats_users(t: &Table, g: &RawGlobal) -> Result<Vec<String>, Problem> {
    let Some(list) = &g.stats_users else {
        return Ok(Vec::new());
    };
    let admins: Vec<&str> = g
        .admin_user
        .as_ref()
        .map_or(&[][..], |a| a.get_ref().0.as_slice())
        .iter()
        .filter_map(|u| u.get_ref().name.as_ref().map(|n| n.get_ref().as_str()))
        .collect();
    let mut out = Vec::new();
    for name in list.get_ref() {
        if !admins.contains(&name.get_ref().as_str()) {
            return Err(t.error(
                list,
                "stats_users",
                format!(
                    "{:?} is not a [[fulcrum.admin_user]]; stats users log in as admin users do",
                    name.get_ref()
                ),
            ));
        }
        out.push(name.get_ref().clone());
    }
    Ok(out)
}

/// `[[fulcrum.admin_user]]`: name and non-empty password. Without any, the
/// console refuses every login (it has no anonymous access).
fn admin_users(t: &Table, g: &RawGlobal, base: &Path) -> Result<Vec<crate::types::User>, Problem> {
    let items = g
        .admin_user
        .as_ref()
        .map_or(&[][..], |a| a.get_ref().0.as_slice());
    let mut out: Vec<crate::types::User> = Vec::new();
    for (i, raw) in items.iter().enumerate() {
        let ut = t.child(&format!("admin_user[{i}]"), raw.span());
        let u = raw.get_ref();
        let name = ut.text(&u.name, "name", None)?;
        if out.iter().any(|o| o.name == name) {
            let v = ut.required(&u.name, "name")?;
            return Err(ut.error(v, "name", format!("admin user {name:?} is defined twice")));
        }
        let value = ut.required(&u.password, "password")?;
        let password = ut.secret(value, "password", base)?;
        if password.trim().is_empty() {
            return Err(ut.error(value, "password", "must not be empty"));
        }
        out.push(crate::types::User::new(name, password));
    }
    Ok(out)
}

fn clusters(
    raw: Option<&Spanned<Tables<RawCluster>>>,
    lines: &Lines,
    global: Option<&Spanned<RawGlobal>>,
    base: &Path,
) -> Result<Vec<Cluster>, Problem> {
    let items = raw.map_or(&[][..], |c| c.get_ref().0.as_slice());
    if items.is_empty() {
        // Nothing to point at unless an empty `cluster = []` was written.
        let line = raw.map_or(1, |c| lines.line(c.span().start));
        return Err(Problem::new(
            line,
            "cluster",
            "at least one [[cluster]] is required",
        ));
    }
    let mut out: Vec<Cluster> = Vec::with_capacity(items.len());
    for (i, raw) in items.iter().enumerate() {
        let cluster = cluster::cluster(raw, i, lines, global, base)?;
        if let Some(j) = out.iter().position(|c| c.name == cluster.name) {
            let name_line = |c: &Spanned<RawCluster>| {
                lines.line(
                    c.get_ref()
                        .name
                        .as_ref()
                        .map_or(c.span(), |n| n.span())
                        .start,
                )
            };
            let reason = format!(
                "cluster name {:?} is already used by cluster[{j}] (line {})",
                cluster.name,
                name_line(&items[j])
            );
            return Err(Problem::new(
                name_line(raw),
                format!("cluster[{i}].name"),
                reason,
            ));
        }
        out.push(cluster);
    }
    mirror::resolve(&mut out, items, lines)?;
    Ok(out)
}

/// Clusters sharing a listen address (PgBouncer's `[databases]`, PgDog's
/// `[[databases]]`): the same protocol, the same client-facing TLS (and,
/// for MySQL, `client_auth`: the greeting is sent before the database is
/// known), at most one without a `[[cluster.database]]` list (it takes the
/// databases no other lists), and no database listed twice. The last
/// cluster of `on` is checked against the earlier ones; `first` is the
/// first cluster on the address.
fn shared_port(on: &[Cluster], first: usize, line: usize, key: &str) -> Result<(), Problem> {
    let (new, earlier) = on.split_last().expect("at least one cluster");
    let same: Vec<(usize, &Cluster)> = earlier
        .iter()
        .enumerate()
        .filter(|(_, c)| c.listen == new.listen)
        .collect();
    let head = &on[first];
    let fail = |reason: String| Err(Problem::new(line, key.to_string(), reason));
    if head.protocol != new.protocol {
        return fail(format!(
            "{} is already used by cluster {:?}, of the other protocol: only clusters of one protocol share a port",
            new.listen, head.name
        ));
    }
    if head.unix_socket != new.unix_socket {
        return fail(format!(
            "{} is shared with cluster {:?}, whose Unix socket (unix_socket_dir or unix_socket, its mode and group) differs: \
             clusters on one port share its socket, so they must have the same",
            new.listen, head.name
        ));
    }
    if head.tls != new.tls {
        return fail(format!(
            "{} is shared with cluster {:?}, whose TLS settings (tls_mode and its files) differ: \
             clusters on one port must have the same",
            new.listen, head.name
        ));
    }
    if new.protocol == crate::Protocol::Mysql && head.client_auth != new.client_auth {
        return fail(format!(
            "{} is shared with cluster {:?}, whose client_auth differs: MySQL clusters on one port must have the same \
             (the greeting names the method before the database is known)",
            new.listen, head.name
        ));
    }
    if new.databases.is_empty() {
        if let Some((_, c)) = same.iter().find(|(_, c)| c.databases.is_empty()) {
            return fail(format!(
                "{} is shared with cluster {:?}, and neither lists [[cluster.database]]: on a shared port \
                 each cluster but one must list the databases it serves",
                new.listen, c.name
            ));
        }
    }
    for d in &new.databases {
        if let Some((_, c)) = same
            .iter()
            .find(|(_, c)| c.databases.iter().any(|e| e.name == d.name))
        {
            return fail(format!(
                "{} is shared with cluster {:?}, which also lists database {:?}: a database picks one cluster",
                new.listen, c.name, d.name
            ));
        }
    }
    Ok(())
}

/// A listen address with the key and line it came from.
struct Listener {
    key: String,
    line: usize,
    addr: SocketAddr,
}

fn listener(
    key: &str,
    raw: &Value<String>,
    addr: Option<SocketAddr>,
    lines: &Lines,
) -> Option<Listener> {
    Some(Listener {
        key: key.to_string(),
        line: lines.line(raw.as_ref()?.span().start),
        addr: addr?,
    })
}

/// Reports the later of two listeners that would fight over a port.
fn check_listeners(listeners: &[Listener]) -> Result<(), Problem> {
    for (i, l) in listeners.iter().enumerate() {
        let Some(earlier) = listeners[..i]
            .iter()
            .find(|e| listeners_conflict(e.addr, l.addr))
        else {
            continue;
        };
        let reason = if earlier.addr == l.addr {
            format!(
                "{} is already used by {} (line {})",
                l.addr, earlier.key, earlier.line
            )
        } else {
            format!(
                "{} overlaps {} = {} (line {}): both would listen on port {}",
                l.addr,
                earlier.key,
                earlier.addr,
                earlier.line,
                l.addr.port()
            )
        };
        return Err(Problem::new(l.line, l.key.clone(), reason));
    }
    Ok(())
}

/// `log`: a filter the daemon's log subscriber accepts (`RUST_LOG` syntax);
/// a typo is an error here, not a silent `info` at start.
fn log_filter(t: &Table, value: &Value<String>) -> Result<String, Problem> {
    let text = t.text(value, "log", Some(defaults::LOG))?;
    if let Some(v) = value {
        crate::log_filter::check(&text).map_err(|why| t.error(v, "log", why))?;
    }
    Ok(text)
}
