//! What the harness writes into a test cluster's `postgresql.conf` and
//! `pg_hba.conf`. Pure text rendering, so the choices are unit-tested here and
//! commented where they are not the obvious ones.

use std::path::Path;

use crate::roles::{APP_MD5_USER, APP_PLAIN_USER, APP_TRUST_USER, SUPERUSER};

/// `pg_hba.conf`: first match wins, so the per-method roles come before the
/// catch-all SCRAM line. Only loopback: the servers listen nowhere else.
pub(crate) fn hba() -> String {
    format!(
        "# Written by fulcrum-testkit.\n\
         local all all trust\n\
         host all {SUPERUSER} 127.0.0.1/32 trust\n\
         host replication all 127.0.0.1/32 trust\n\
         host all {APP_MD5_USER} 127.0.0.1/32 md5\n\
         host all {APP_PLAIN_USER} 127.0.0.1/32 password\n\
         host all {APP_TRUST_USER} 127.0.0.1/32 trust\n\
         host all all 127.0.0.1/32 scram-sha-256\n"
    )
}

/// [`hba`] with every TCP line but replication's as `hostssl`: a server
/// that only takes TLS logins, as managed services configure them.
pub(crate) fn hba_ssl_only() -> String {
    hba()
        .lines()
        .map(|l| match l.strip_prefix("host all ") {
            Some(rest) => format!("hostssl all {rest}\n"),
            None => format!("{l}\n"),
        })
        .collect()
}

/// Cluster-wide settings, written before the replicas are cloned so they
/// inherit them. Speed over durability: these clusters are thrown away.
pub(crate) fn cluster_settings(max_connections: u32) -> Vec<(String, String)> {
    let s = |k: &str, v: &str| (k.to_string(), v.to_string());
    vec![
        s("listen_addresses", "127.0.0.1"),
        s("max_connections", &max_connections.to_string()),
        s("fsync", "off"),
        // Synchronous mode turns this on (with ALTER SYSTEM on the primary only)
        // once the standbys stream; see pg_cluster.rs.
        s("synchronous_commit", "off"),
        s("full_page_writes", "off"),
        s("shared_buffers", "32MB"),
        // Logical: the cache's change stream decodes the primary's WAL
        // (a superset of replica; replicas are unaffected).
        s("wal_level", "logical"),
        s("hot_standby", "on"),
        s("max_wal_senders", "10"),
        s("max_replication_slots", "10"),
        s("wal_keep_size", "256MB"),
        // A walsender only ships flushed WAL; with synchronous_commit=off the
        // walwriter flushes every wal_writer_delay (200 ms by default), which
        // would be the floor of every replica-lag wait in the tests.
        s("wal_writer_delay", "10ms"),
        // Replies from standbys feed pg_stat_replication's lag columns.
        s("wal_receiver_status_interval", "1s"),
        s("checkpoint_timeout", "30min"),
        s("max_wal_size", "1GB"),
        s("jit", "off"),
        s("huge_pages", "off"),
        s("logging_collector", "off"),
        s("log_line_prefix", "%m [%p] %q%u@%d "),
    ]
}

/// Settings that differ per node, appended after the cluster ones. PostgreSQL
/// takes the last occurrence of a key, so a replica cloned from the primary
/// just gets its own block appended.
pub(crate) fn node_settings(name: &str, port: u16, socket_dir: &Path) -> Vec<(String, String)> {
    vec![
        ("port".to_string(), port.to_string()),
        (
            "unix_socket_directories".to_string(),
            socket_dir.to_string_lossy().into_owned(),
        ),
        // A walreceiver uses cluster_name as its application_name, which is
        // how pg_stat_replication on the primary names each replica.
        ("cluster_name".to_string(), name.to_string()),
    ]
}

/// `key = 'value'` lines. Every GUC accepts a quoted value, so quoting all of
/// them is safe; embedded quotes are doubled.
pub(crate) fn render(heading: &str, settings: &[(String, String)]) -> String {
    let mut out = format!("\n# {heading} (fulcrum-testkit)\n");
    for (key, value) in settings {
        out.push_str(&format!("{key} = '{}'\n", value.replace('\'', "''")));
    }
    out
}

/// Validates a setting name given by a test, so it cannot inject lines.
pub(crate) fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_quoted_and_quotes_doubled() {
        let text = render(
            "t",
            &[
                ("a".into(), "on".into()),
                ("b".into(), "it's".into()),
                ("c".into(), "32MB".into()),
            ],
        );
        assert!(text.contains("a = 'on'\n"));
        assert!(text.contains("b = 'it''s'\n"));
        assert!(text.contains("c = '32MB'\n"));
    }

    #[test]
    fn per_method_roles_precede_the_scram_catch_all() {
        let hba = hba();
        let pos = |needle: &str| hba.find(needle).unwrap_or_else(|| panic!("{needle}"));
        let scram = pos("host all all 127.0.0.1/32 scram-sha-256");
        assert!(pos("app_md5 127.0.0.1/32 md5") < scram);
        assert!(pos("app_plain 127.0.0.1/32 password") < scram);
        assert!(pos("app_trust 127.0.0.1/32 trust") < scram);
        assert!(hba.contains("host replication all 127.0.0.1/32 trust"));
    }

    #[test]
    fn ssl_only_hba_keeps_local_and_replication_lines() {
        let hba = hba_ssl_only();
        assert!(hba.contains("local all all trust"));
        assert!(hba.contains("host replication all 127.0.0.1/32 trust"));
        assert!(hba.contains("hostssl all all 127.0.0.1/32 scram-sha-256"));
        assert!(!hba.contains("\nhost all"), "{hba}");
    }

    #[test]
    fn setting_keys_cannot_inject_lines() {
        assert!(valid_key("work_mem"));
        assert!(valid_key("auto_explain.log_min_duration"));
        assert!(!valid_key("a = 1\nfsync"));
        assert!(!valid_key(""));
    }
}
