//! The command-line options every test `mariadbd` gets (there is no option
//! file: the servers run with `--no-defaults`). Pure rendering, so the choices
//! are unit-tested here and commented where they are not the obvious ones.

use std::path::Path;

/// Options for `mariadb-install-db` that shape the files it creates, so the
/// server later starts with the same InnoDB geometry (no redo log resize).
pub(crate) fn storage_options() -> Vec<(String, String)> {
    let s = |k: &str, v: &str| (k.to_string(), v.to_string());
    vec![
        s("innodb-buffer-pool-size", "32M"),
        s("innodb-log-file-size", "32M"),
        // tmpfs and some sandboxes support neither O_DIRECT-style native AIO
        // nor io_uring; the simulated AIO works everywhere.
        s("innodb-use-native-aio", "0"),
    ]
}

/// Options shared by every node: small memory, speed over durability (the
/// data is thrown away), GTID replication with row-based binlogs.
pub(crate) fn cluster_options() -> Vec<(String, String)> {
    let s = |k: &str, v: &str| (k.to_string(), v.to_string());
    let mut options = storage_options();
    options.extend([
        s("bind-address", "127.0.0.1"),
        // Accounts are matched by IP; no DNS lookups per connection.
        s("skip-name-resolve", ""),
        s("max-connections", "200"),
        // With --no-defaults the server default is latin1; Debian's packaged
        // configuration (what real deployments run) uses utf8mb4.
        s("character-set-server", "utf8mb4"),
        s("collation-server", "utf8mb4_general_ci"),
        // Memory: the defaults reserve 128M each for MyISAM keys and the Aria
        // page cache (internal temporary tables), 16M for the redo buffer.
        s("key-buffer-size", "1M"),
        s("aria-pagecache-buffer-size", "8M"),
        s("innodb-log-buffer-size", "2M"),
        s("table-open-cache", "400"),
        s("innodb-buffer-pool-dump-at-shutdown", "0"),
        s("innodb-buffer-pool-load-at-startup", "0"),
        // Durability: =2 writes the redo log to the OS at each commit, so a
        // SIGKILLed server (stop_immediate) loses nothing; only an OS crash
        // would. =0 could lose committed transactions that are already in the
        // binlog, leaving replicas ahead of a restarted primary.
        s("innodb-flush-log-at-trx-commit", "2"),
        s("sync-binlog", "0"),
        s("innodb-doublewrite", "0"),
        // Replication: every node (replicas too) writes a binlog with the
        // transactions it applies, so any of them can become a primary.
        s("log-bin", "mariadb-bin"),
        s("relay-log", "relay-bin"),
        s("log-slave-updates", "1"),
        s("binlog-format", "ROW"),
        s("gtid-strict-mode", "1"),
    ]);
    options
}

/// What makes one node itself; placed after the cluster options and the
/// builder's settings, so nothing can override them. Replicas are read-only
/// from the first start on.
pub(crate) struct NodeIdentity<'a> {
    pub(crate) data_dir: &'a Path,
    pub(crate) port: u16,
    pub(crate) socket: &'a Path,
    pub(crate) pid_file: &'a Path,
    pub(crate) log_file: &'a Path,
    pub(crate) server_id: u32,
    pub(crate) read_only: bool,
    /// `--user=root`: mariadbd refuses to run as root without it.
    pub(crate) as_root: bool,
}

pub(crate) fn node_options(node: &NodeIdentity<'_>) -> Vec<(String, String)> {
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let mut options = vec![
        ("datadir".to_string(), path(node.data_dir)),
        ("port".to_string(), node.port.to_string()),
        ("socket".to_string(), path(node.socket)),
        ("pid-file".to_string(), path(node.pid_file)),
        ("log-error".to_string(), path(node.log_file)),
        // Temporary files beside the node, never in a shared /tmp.
        (
            "tmpdir".to_string(),
            path(node.data_dir.parent().unwrap_or(node.data_dir)),
        ),
        ("server-id".to_string(), node.server_id.to_string()),
        (
            "read-only".to_string(),
            if node.read_only { "1" } else { "0" }.to_string(),
        ),
    ];
    if node.as_root {
        options.push(("user".to_string(), "root".to_string()));
    }
    options
}

/// `--key=value` arguments (`--key` for an empty value). Values go into argv
/// as they are: nothing to quote.
pub(crate) fn render(options: &[(String, String)]) -> Vec<String> {
    options
        .iter()
        .map(|(key, value)| {
            if value.is_empty() {
                format!("--{key}")
            } else {
                format!("--{key}={value}")
            }
        })
        .collect()
}

/// Validates an option name given by a test (without the leading `--`).
pub(crate) fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && !key.starts_with('-')
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_render_as_arguments() {
        let args = render(&[
            ("skip-name-resolve".into(), String::new()),
            ("server-id".into(), "3".into()),
            ("init-connect".into(), "SET @a = 'x y'".into()),
        ]);
        assert_eq!(
            args,
            [
                "--skip-name-resolve",
                "--server-id=3",
                "--init-connect=SET @a = 'x y'"
            ]
        );
    }

    #[test]
    fn replicas_are_read_only_and_root_runs_as_root() {
        let dir = Path::new("/x");
        let node = |read_only, as_root| {
            render(&node_options(&NodeIdentity {
                data_dir: dir,
                port: 4000,
                socket: dir,
                pid_file: dir,
                log_file: dir,
                server_id: 2,
                read_only,
                as_root,
            }))
        };
        assert!(node(true, false).contains(&"--read-only=1".to_string()));
        assert!(node(false, false).contains(&"--read-only=0".to_string()));
        assert!(node(false, true).contains(&"--user=root".to_string()));
        assert!(!node(false, false).iter().any(|a| a.starts_with("--user")));
    }

    #[test]
    fn every_node_writes_a_gtid_row_binlog() {
        let args = render(&cluster_options());
        for needed in [
            "--log-bin=mariadb-bin",
            "--log-slave-updates=1",
            "--binlog-format=ROW",
            "--gtid-strict-mode=1",
            "--bind-address=127.0.0.1",
        ] {
            assert!(args.contains(&needed.to_string()), "{needed} missing");
        }
    }

    #[test]
    fn option_keys_cannot_smuggle_values() {
        assert!(valid_key("innodb_buffer_pool_size"));
        assert!(valid_key("slave-parallel-threads"));
        assert!(valid_key("loose-foo.bar"));
        assert!(!valid_key("--port"));
        assert!(!valid_key("port=1 --datadir"));
        assert!(!valid_key(""));
    }
}
