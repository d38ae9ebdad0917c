//! What `fulcrum import pgbouncer` knows of PgBouncer's own settings: the
//! `[pgbouncer]` keys with no Fulcrum equivalent (and why, for the notes),
//! `auth_type` in Fulcrum's words, PgBouncer's durations, and its Unix
//! socket keys. Pure.

/// `auth_type` (and `auth_hba_file`) as the config lines of Fulcrum's
/// `client_auth`; what cannot be carried is noted.
pub(super) fn client_auth<'a>(
    auth_type: Option<&str>,
    hba_file: Option<&'a str>,
    notes: &mut Vec<String>,
) -> (&'static str, Option<&'a str>) {
    let method = match auth_type.unwrap_or("md5") {
        "md5" => "md5",
        "scram-sha-256" => "scram-sha-256",
        "trust" => "trust",
        "cert" => "cert",
        "hba" => match hba_file {
            Some(file) => return ("hba", Some(file)),
            None => {
                notes.push("auth_type = hba without auth_hba_file (PgBouncer then refuses every login): took md5".into());
                "md5"
            }
        },
        "any" => {
            notes.push("auth_type = any (any user name, no password): Fulcrum checks the user name; took trust".into());
            "trust"
        }
        other => {
            notes.push(format!(
                "auth_type = {other}: not in Fulcrum (scram-sha-256, md5, trust, cert, hba); took md5"
            ));
            "md5"
        }
    };
    if hba_file.is_some() {
        notes.push(
            "auth_hba_file: read only with auth_type = hba (as in PgBouncer); left out".into(),
        );
    }
    (method, None)
}

/// `[pgbouncer]` keys with no Fulcrum equivalent, and why.
pub(super) const NOT_CARRIED: &[(&str, &str)] = &[
    ("logfile", "Fulcrum logs to stderr (journald under systemd)"),
    (
        "pidfile",
        "Fulcrum does not daemonize; systemd tracks its pid",
    ),
    ("syslog", "Fulcrum logs to stderr (journald under systemd)"),
    ("syslog_facility", "Fulcrum logs to stderr"),
    ("syslog_ident", "Fulcrum logs to stderr"),
    ("user", "run Fulcrum as the user you want (systemd User=)"),
    (
        "ignore_startup_parameters",
        "not needed: Fulcrum tracks every startup parameter per client",
    ),
    (
        "track_extra_parameters",
        "not needed: Fulcrum tracks every parameter the client sets",
    ),
    ("application_name_add_host", "no equivalent"),
    (
        "server_check_query",
        "Fulcrum checks a connection's state, not with a query",
    ),
    (
        "server_round_robin",
        "reads are balanced by `balance` (default least_connections)",
    ),
    (
        "server_fast_close",
        "RECONNECT closes connections at their next idle moment",
    ),
    (
        "server_login_retry",
        "a failed login is retried at the next client's need",
    ),
    ("stats_period", "metrics are scraped live at /metrics"),
    ("log_connections", "Fulcrum logs connections at debug level"),
    (
        "log_disconnections",
        "Fulcrum logs disconnections at debug level",
    ),
    (
        "log_pooler_errors",
        "errors Fulcrum sends are logged at info level",
    ),
    ("log_stats", "metrics are scraped live at /metrics"),
    ("verbose", "set [fulcrum] log = \"debug\""),
    ("pkt_buf", "buffers are sized per message"),
    (
        "listen_backlog",
        "Fulcrum asks for 4,096 (capped by net.core.somaxconn)",
    ),
    ("sbuf_loopcnt", "no equivalent"),
    (
        "max_packet_size",
        "see max_message_size (a size, e.g. \"1GB\")",
    ),
    (
        "so_reuseport",
        "one Fulcrum process uses every core (workers)",
    ),
    ("tcp_defer_accept", "no equivalent"),
    ("tcp_socket_buffer", "no equivalent"),
    ("tcp_keepalive", "no equivalent"),
    ("tcp_keepcnt", "no equivalent"),
    ("tcp_keepidle", "no equivalent"),
    ("tcp_keepintvl", "no equivalent"),
    ("tcp_user_timeout", "no equivalent"),
    (
        "dns_max_ttl",
        "no DNS cache: names are resolved at each connect",
    ),
    ("dns_nxdomain_ttl", "no DNS cache"),
    ("dns_zone_check_period", "no DNS cache"),
    ("suspend_timeout", "no online restart (SUSPEND) in Fulcrum"),
    ("autodb_idle_timeout", "no automatic databases"),
    ("client_tls_ciphers", "rustls' default suites"),
    ("client_tls_protocols", "see tls_min_version"),
    ("client_tls_dheparams", "rustls has no DHE"),
    ("client_tls_ecdhcurve", "rustls' default groups"),
    ("server_tls_ciphers", "rustls' default suites"),
    ("server_tls_protocols", "rustls' default versions"),
    ("conffile", "no equivalent"),
    ("service_name", "no equivalent"),
    ("job_name", "no equivalent"),
    (
        "peer_id",
        "no peering: several Fulcrums coordinate through etcd (topology)",
    ),
    ("disable_pqexec", "no equivalent"),
    ("resolv_conf", "no equivalent"),
];

/// A PgBouncer duration (seconds, or with a unit) as Fulcrum's text; `None` for 0.
pub(super) fn duration(value: &str) -> Option<String> {
    let v = value.trim();
    let (number, unit) = match v.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&v[..i], v[i..].trim()),
        None => (v, "s"),
    };
    let n: f64 = number.trim().parse().ok()?;
    let ms = match unit {
        "us" => n / 1000.0,
        "ms" => n,
        "s" => n * 1000.0,
        "min" => n * 60_000.0,
        "h" => n * 3_600_000.0,
        "d" => n * 86_400_000.0,
        _ => return None,
    };
    if ms <= 0.0 {
        return None;
    }
    let ms = ms.round() as u64;
    Some(if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    })
}

/// PgBouncer's `unix_socket_dir`, `unix_socket_mode` and
/// `unix_socket_group` as every cluster's lines (the keys have the same
/// names). An empty directory is off, as in PgBouncer; an unset one is
/// PgBouncer's `/tmp`, which is not carried over (a mode or group given
/// without it is said in `notes`).
pub(super) fn unix_socket_lines(
    dir: Option<&str>,
    mode: Option<&str>,
    group: Option<&str>,
    notes: &mut Vec<String>,
) -> String {
    let q = |v: &str| format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""));
    match dir.map(str::trim) {
        Some("") => String::new(),
        None => {
            if mode.is_some() || group.is_some() {
                notes.push("unix_socket_mode / unix_socket_group without unix_socket_dir (PgBouncer: /tmp): not carried over; set unix_socket_dir to listen on a Unix socket".into());
            }
            String::new()
        }
        Some(dir) => {
            let mut lines = format!("unix_socket_dir = {}\n", q(dir));
            for (key, value) in [("unix_socket_mode", mode), ("unix_socket_group", group)] {
                if let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) {
                    lines.push_str(&format!("{key} = {}\n", q(v)));
                }
            }
            lines
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_socket_keys_are_carried_when_a_directory_is_set() {
        let mut notes = Vec::new();
        assert_eq!(
            unix_socket_lines(Some("/var/run/pgbouncer"), Some("0770"), Some("app"), &mut notes),
            "unix_socket_dir = \"/var/run/pgbouncer\"\nunix_socket_mode = \"0770\"\nunix_socket_group = \"app\"\n"
        );
        assert!(notes.is_empty());
        assert_eq!(
            unix_socket_lines(Some(""), Some("0770"), None, &mut notes),
            ""
        );
        assert!(notes.is_empty(), "empty: off, as in PgBouncer");
        assert_eq!(unix_socket_lines(None, None, None, &mut notes), "");
        assert!(
            notes.is_empty(),
            "unset: PgBouncer's /tmp, not carried over"
        );
        assert_eq!(unix_socket_lines(None, Some("0700"), None, &mut notes), "");
        assert_eq!(notes.len(), 1, "a mode without a directory is named");
    }

    #[test]
    fn durations_take_pgbouncer_units() {
        assert_eq!(duration("15"), Some("15s".into()));
        assert_eq!(duration("0.5"), Some("500ms".into()));
        assert_eq!(duration("2min"), Some("120s".into()));
        assert_eq!(duration("0"), None);
        assert_eq!(duration("soon"), None);
    }
}
