//! `fulcrum import pgbouncer`: a PgBouncer ini (and its auth file) turned
//! into an equivalent `fulcrum.toml`, with every setting that could not be
//! carried over listed and why. Pure: the caller reads the files and
//! writes the result; `fulcrum check` validates it like any config.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::ini::{conn_params, Ini};
use super::pgbouncer_databases::{self as databases, Db};
use super::pgbouncer_keys::{client_auth, duration, unix_socket_lines, NOT_CARRIED};

/// The result: the TOML text, and one note per setting not carried over
/// (or carried over with a change worth knowing).
#[derive(Debug, Default)]
pub struct Imported {
    pub toml: String,
    pub notes: Vec<String>,
}

/// A comma-separated list of names (`admin_users = a, b`).
fn name_list(value: Option<&str>) -> Vec<String> {
    value.map_or_else(Vec::new, |v| {
        v.split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect()
    })
}

pub(super) fn quote(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// A cluster name from `text`: lowercase letters, digits and `_`.
fn name_of(text: &str) -> String {
    let n: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    if n.is_empty() || n.starts_with(|c: char| c.is_ascii_digit()) {
        format!("db_{n}")
    } else {
        n
    }
}

/// Whether the auth file's `password` is a SCRAM secret or md5 hash (a
/// malformed SCRAM secret included) rather than a clear-text password, by
/// the rule Fulcrum applies to a config password
/// ([`fulcrum_config::PasswordHash::detect`]): `md5` followed by 32
/// characters that are not all hex digits is a password.
pub(super) fn is_hash(password: &str) -> bool {
    fulcrum_config::PasswordHash::detect(password).is_some()
}

/// One server group: the `[databases]` entries on one host list and port.
#[derive(Default)]
struct Group {
    hosts: Vec<String>,
    port: String,
    /// The named entries.
    databases: Vec<Db>,
    wildcard: bool,
    /// The `*` entry, for its own keys.
    star: Option<Db>,
    params: BTreeMap<String, String>,
}

/// Converts `ini` (and the auth file's `users`) to a Fulcrum config.
pub fn import(ini: &Ini, users: &[(String, String)], source: &str) -> Result<Imported, String> {
    let mut notes: Vec<String> = ini
        .includes
        .iter()
        .map(|(line, file)| format!("{source}:{line}: %include {file}: not followed; its settings are not imported (merge them into {source} and import again)"))
        .collect();
    let mut handled: Vec<&str> = Vec::new();
    let mut take = |k: &'static str| {
        handled.push(k);
        ini.get(k)
    };

    // Where clients connect.
    let port = take("listen_port").unwrap_or("6432").to_owned();
    let addr = match take("listen_addr").map(str::trim) {
        None | Some("") => {
            notes.push("listen_addr is empty (PgBouncer: unix socket only): Fulcrum listens on TCP, 127.0.0.1".into());
            "127.0.0.1".to_owned()
        }
        Some(a) => {
            let first = a.split(',').next().unwrap_or("").trim();
            if a.contains(',') {
                notes.push(format!("listen_addr = {a:?}: Fulcrum listens on one address per cluster; took {first:?}"));
            }
            match first {
                "*" => "0.0.0.0".to_owned(),
                "localhost" => "127.0.0.1".to_owned(),
                other => other.to_owned(),
            }
        }
    };
    let listen = if addr.contains(':') {
        format!("[{addr}]:{port}")
    } else {
        format!("{addr}:{port}")
    };

    // Cluster-wide settings, PgBouncer's key -> Fulcrum's line.
    let mut common = String::new();
    let pool_mode = match take("pool_mode").unwrap_or("session") {
        "session" => "session",
        "transaction" => "transaction",
        "statement" => "statement",
        other => {
            return Err(format!(
                "{source}: pool_mode = {other:?} is not a PgBouncer pool mode"
            ))
        }
    };
    let _ = writeln!(common, "pool_mode = {}", quote(pool_mode));
    let (dir, mode, group) = (
        take("unix_socket_dir"),
        take("unix_socket_mode"),
        take("unix_socket_group"),
    );
    common.push_str(&unix_socket_lines(dir, mode, group, &mut notes));
    let _ = writeln!(
        common,
        "pool_size = {}",
        take("default_pool_size").unwrap_or("20")
    );
    for (pgb, ours) in [
        ("min_pool_size", "min_pool_size"),
        ("reserve_pool_size", "reserve_pool_size"),
        ("max_db_connections", "max_db_connections"),
        ("max_user_connections", "max_user_connections"),
        ("max_client_conn", "max_client_connections"),
    ] {
        if let Some(v) = take(pgb) {
            if v.parse::<u64>().is_ok() {
                let _ = writeln!(common, "{ours} = {v}");
            } else {
                notes.push(format!("{pgb} = {v:?}: not a number; left out"));
            }
        }
    }
    for (pgb, ours) in [
        ("reserve_pool_timeout", "reserve_pool_timeout"),
        ("server_check_delay", "server_check_delay"),
        ("server_lifetime", "server_lifetime"),
        ("server_idle_timeout", "server_idle_timeout"),
        ("server_connect_timeout", "connect_timeout"),
        ("query_timeout", "query_timeout"),
        ("client_idle_timeout", "client_idle_timeout"),
        ("idle_transaction_timeout", "idle_transaction_timeout"),
    ] {
        if let Some(v) = take(pgb) {
            match duration(v) {
                Some(d) => {
                    let _ = writeln!(common, "{ours} = {}", quote(&d));
                }
                None if v.trim().parse::<f64>() == Ok(0.0) => {}
                None => notes.push(format!("{pgb} = {v:?}: not a duration; left out")),
            }
        }
    }
    match take("client_login_timeout").map(|v| (v, duration(v))) {
        Some((_, Some(d))) => {
            let _ = writeln!(common, "client_login_timeout = {}", quote(&d));
        }
        Some((v, None)) if v.trim().parse::<f64>() == Ok(0.0) => {
            let _ = writeln!(common, "client_login_timeout = \"0s\"");
        }
        _ => {}
    }
    match take("query_wait_timeout").map(|v| (v, duration(v))) {
        Some((_, Some(d))) => {
            let _ = writeln!(common, "pool_timeout = {}", quote(&d));
        }
        Some((v, None)) if v.trim().parse::<f64>() == Ok(0.0) => {
            notes.push("query_wait_timeout = 0 (wait forever): Fulcrum needs a bound; pool_timeout = \"1h\"".into());
            let _ = writeln!(common, "pool_timeout = \"1h\"");
        }
        None => {
            // PgBouncer's default: 120 s.
            let _ = writeln!(common, "pool_timeout = \"120s\"");
        }
        Some((v, None)) => notes.push(format!(
            "query_wait_timeout = {v:?}: not a duration; left out"
        )),
    }
    if let Some(q) = take("server_reset_query") {
        let _ = writeln!(common, "server_reset_query = {}", quote(q));
    }
    if let Some(v) = take("server_reset_query_always") {
        let _ = writeln!(common, "server_reset_query_always = {}", v.trim() == "1");
    }
    // As `fulcrum check` reads it: an integer from 0 to u32::MAX.
    match take("max_prepared_statements").map(|v| (v, v.trim().parse::<u32>())) {
        Some((_, Ok(0))) => notes.push("max_prepared_statements = 0 (PgBouncer: protocol-level prepared statements not supported in transaction pooling): Fulcrum always supports them; its default cap applies".into()),
        Some((_, Ok(n))) => {
            let _ = writeln!(common, "max_prepared_statements = {n}");
        }
        Some((v, Err(_))) => notes.push(format!(
            "max_prepared_statements = {v:?}: not an integer from 0 to {}; left out",
            u32::MAX
        )),
        None => {}
    }
    // Read by the caller (its users are `users`).
    take("auth_file");
    // Client authentication.
    let (client_auth, hba_file) = client_auth(take("auth_type"), take("auth_hba_file"), &mut notes);
    // TLS.
    if let Some(mode) = take("client_tls_sslmode") {
        let (tls_mode, verify) = match mode {
            "disable" => (None, false),
            "allow" | "prefer" => (Some("allow"), false),
            "require" => (Some("require"), false),
            "verify-ca" | "verify-full" => (Some("require"), true),
            other => {
                notes.push(format!(
                    "client_tls_sslmode = {other:?}: unknown; TLS left off"
                ));
                (None, false)
            }
        };
        if let Some(m) = tls_mode {
            let _ = writeln!(common, "tls_mode = {}", quote(m));
            if let Some(f) = take("client_tls_cert_file") {
                let _ = writeln!(common, "tls_certificate = {}", quote(f));
            }
            if let Some(f) = take("client_tls_key_file") {
                let _ = writeln!(common, "tls_private_key = {}", quote(f));
            }
            if verify {
                if let Some(f) = take("client_tls_ca_file") {
                    let _ = writeln!(common, "tls_client_ca = {}", quote(f));
                }
            }
        }
    }
    if let Some(mode) = take("server_tls_sslmode") {
        let ours = match mode {
            "allow" => {
                notes.push("server_tls_sslmode = allow: Fulcrum's closest is prefer (TLS when the server offers it)".into());
                "prefer"
            }
            m @ ("disable" | "prefer" | "require" | "verify-ca" | "verify-full") => m,
            other => {
                return Err(format!(
                    "{source}: server_tls_sslmode = {other:?} is not an sslmode"
                ))
            }
        };
        let _ = writeln!(common, "server_tls = {}", quote(ours));
        for (pgb, f) in [
            ("server_tls_ca_file", "server_tls_ca"),
            ("server_tls_cert_file", "server_tls_certificate"),
            ("server_tls_key_file", "server_tls_private_key"),
        ] {
            if let Some(v) = take(pgb) {
                let _ = writeln!(common, "{f} = {}", quote(v));
            }
        }
    }
    // auth_query.
    let password_of = |u: &str| users.iter().find(|(n, _)| n == u).map(|(_, p)| p.clone());
    let mut auth_lines = String::new();
    if let Some(q) = take("auth_query") {
        match take("auth_user") {
            Some(u) => match password_of(u) {
                Some(p) if !is_hash(&p) => {
                    let _ = writeln!(auth_lines, "auth_user = {}\nauth_password = {}\nauth_query = {}", quote(u), quote(&p), quote(q));
                }
                _ => notes.push(format!("auth_user {u:?}: its password is not in the auth file in clear: Fulcrum logs in as it with a password; auth_query left out")),
            },
            None => notes.push("auth_query without auth_user: left out (Fulcrum logs in as auth_user to run it)".into()),
        }
    } else if take("auth_user").is_some() {
        notes.push("auth_user without auth_query: PgBouncer's default query reads pg_shadow; set auth_query to use it (docs/configuration.md, auth_query)".into());
    }

    // Users: the auth file's passwords, SCRAM secrets and md5 hashes that
    // client_auth can check, each with its [users] pool settings.
    let mut pools = super::pgbouncer_user_pools::user_pools(ini, &mut notes);
    let carried = super::pgbouncer_users::carry(
        users,
        client_auth,
        !auth_lines.is_empty(),
        &mut pools,
        &mut notes,
    );
    super::pgbouncer_user_pools::unplaced(pools, &mut notes);
    let _ = writeln!(common, "client_auth = {}", quote(carried.client_auth));
    if let Some(file) = hba_file {
        let _ = writeln!(common, "auth_hba_file = {}", quote(file));
    }
    common.push_str(&carried.health);
    let user_lines = carried.lines;
    if carried.count == 0 && auth_lines.is_empty() {
        return Err(format!(
            "{source}: no user could be carried over (no auth file given or read, or no password, SCRAM secret or md5 hash the client authentication can check): Fulcrum needs [[cluster.user]] entries or auth_query; pass --userlist"
        ));
    }

    // [databases]: one cluster per server (host list and port).
    let mut groups: Vec<Group> = Vec::new();
    for (alias, value) in ini.section("databases") {
        let params = conn_params(value);
        let p = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let host = p("host").unwrap_or_else(|| {
            notes.push(format!(
                "[databases] {alias}: no host (PgBouncer: the local unix socket); took 127.0.0.1"
            ));
            "127.0.0.1".into()
        });
        let hosts: Vec<String> = host
            .split(',')
            .map(|h| {
                if h.trim() == "localhost" {
                    "127.0.0.1".into()
                } else {
                    h.trim().to_owned()
                }
            })
            .collect();
        let port = p("port").unwrap_or_else(|| "5432".into());
        let group = match groups
            .iter_mut()
            .position(|g| g.hosts == hosts && g.port == port)
        {
            Some(i) => &mut groups[i],
            None => {
                groups.push(Group {
                    hosts,
                    port,
                    ..Default::default()
                });
                groups.last_mut().expect("just pushed")
            }
        };
        let mut db = Db::new(alias.clone(), p("dbname").unwrap_or_else(|| alias.clone()));
        for (k, v) in &params {
            match k.as_str() {
                "host" | "port" | "dbname" => {}
                k if db.take(k, v) => {}
                "pool_size" | "pool_mode" | "reserve_pool" | "max_db_connections" | "min_pool_size" => {
                    if group.params.insert(k.clone(), v.clone()).is_some_and(|old| old != *v) {
                        notes.push(format!("[databases] {alias}: {k} differs between databases on one server; Fulcrum sets it per cluster (took {v})"));
                    }
                }
                "auth_user" => notes.push(format!("[databases] {alias}: auth_user per database is per cluster in Fulcrum (auth_user, auth_query)")),
                other => notes.push(format!("[databases] {alias}: {other}={v} not carried over (set it on the server or per role)")),
            }
        }
        if alias == "*" {
            group.wildcard = true;
            group.star = Some(db);
        } else {
            group.databases.push(db);
        }
    }
    if groups.is_empty() {
        notes.push("[databases] is empty: wrote one cluster for 127.0.0.1:5432 serving any database (as a `*` entry would); edit its backend".into());
        groups.push(Group {
            hosts: vec!["127.0.0.1".into()],
            port: "5432".into(),
            wildcard: true,
            ..Default::default()
        });
    }

    // Admin console.
    let admins = name_list(take("admin_users"));
    let stats = name_list(take("stats_users"));
    let mut console = Vec::new();
    for u in admins.iter().chain(&stats) {
        if console.iter().any(|(n, _): &(String, String)| n == u) {
            continue;
        }
        match password_of(u) {
            Some(p) if !is_hash(&p) => console.push((u.clone(), p)),
            _ => notes.push(format!("admin/stats user {u:?}: no clear-text password in the auth file; not a console user")),
        }
    }

    // Everything else in [pgbouncer].
    for (key, value) in ini.section("pgbouncer") {
        if handled.contains(&key.as_str()) {
            continue;
        }
        match NOT_CARRIED.iter().find(|(k, _)| k == key) {
            Some((_, why)) => notes.push(format!("{key} = {value}: {why}")),
            None => notes.push(format!("{key} = {value}: no Fulcrum equivalent known")),
        }
    }

    // The file.
    let mut out = String::new();
    let _ = writeln!(out, "# Imported from {source} by `fulcrum import pgbouncer`.\n# What could not be carried over was listed on stderr; every key: docs/configuration.md.\n");
    let _ = writeln!(out, "[fulcrum]\nlog = \"info\"");
    if !console.is_empty() {
        let admin_port = port.parse::<u16>().map_or(6433, |p| p.saturating_add(1));
        notes.push(format!("PgBouncer's console is the `pgbouncer` database on the client port; Fulcrum's is its own listener: admin = \"127.0.0.1:{admin_port}\" (psql -h 127.0.0.1 -p {admin_port} -U <admin user> fulcrum)"));
        let _ = writeln!(out, "admin = \"127.0.0.1:{admin_port}\"");
        if !stats.is_empty() {
            let list: Vec<String> = stats
                .iter()
                .filter(|s| !admins.contains(s) && console.iter().any(|(n, _)| n == *s))
                .map(|s| quote(s))
                .collect();
            let _ = writeln!(out, "stats_users = [{}]", list.join(", "));
        }
        for (name, password) in &console {
            let _ = writeln!(
                out,
                "\n[[fulcrum.admin_user]]\nname = {}\npassword = {}",
                quote(name),
                quote(password)
            );
        }
    }
    let mut names: Vec<String> = Vec::new();
    for g in &groups {
        let mut name = if g.databases.len() == 1 && !g.wildcard {
            name_of(&g.databases[0].alias)
        } else if groups.len() == 1 {
            "main".to_owned()
        } else {
            name_of(&format!("{}_{}", g.hosts[0], g.port))
        };
        while names.contains(&name) {
            name.push('_');
        }
        names.push(name.clone());
        let _ = writeln!(
            out,
            "\n[[cluster]]\nname = {}\nprotocol = \"postgres\"\nlisten = {}",
            quote(&name),
            quote(&listen)
        );
        // The common settings, with this server's own (from its
        // [databases] entries) in their place.
        let mut lines: Vec<String> = common.lines().map(str::to_owned).collect();
        for (k, v) in &g.params {
            let line = match k.as_str() {
                "pool_size" => format!("pool_size = {v}"),
                "min_pool_size" => format!("min_pool_size = {v}"),
                "reserve_pool" => format!("reserve_pool_size = {v}"),
                "max_db_connections" => format!("max_db_connections = {v}"),
                "pool_mode" => format!("pool_mode = {}", quote(v)),
                _ => continue,
            };
            let key = format!("{} = ", line.split(' ').next().unwrap_or(""));
            lines.retain(|l| !l.starts_with(&key));
            lines.push(line);
        }
        for l in lines {
            let _ = writeln!(out, "{l}");
        }
        let star = g.star.as_ref();
        if let Some(q) = star.and_then(|s| databases::wildcard(s, g.databases.len(), &mut notes)) {
            let _ = writeln!(out, "connect_query = {}", quote(&q));
        }
        out.push_str(&auth_lines);
        for h in &g.hosts {
            // A unix socket directory stays one: `/dir:port`.
            let address = if h.contains(':') && !h.starts_with('/') {
                format!("[{h}]:{}", g.port)
            } else {
                format!("{h}:{}", g.port)
            };
            let _ = writeln!(
                out,
                "\n[[cluster.backend]]\naddress = {}\nrole = {}",
                quote(&address),
                quote("auto")
            );
        }
        if !g.wildcard {
            databases::write(&mut out, &g.databases, password_of, &mut notes);
        } else if !g.databases.is_empty() {
            notes.push(format!("the `*` entry shares {}:{} with named databases: the cluster serves any database; renamed ones ({}), their logins and connect_query are not carried over", g.hosts[0], g.port, g.databases.iter().filter(|d| d.alias != d.server).map(|d| d.alias.as_str()).collect::<Vec<_>>().join(", ")));
        }
        out.push_str(&user_lines);
    }
    Ok(Imported { toml: out, notes })
}

#[cfg(test)]
mod tests;
