//! A throwaway MariaDB cluster: one primary and N replicas using GTID
//! replication in one temp dir, with the users of `roles.rs`. Built by
//! [`MariaClusterBuilder`]; torn down by `Drop`, or by the reaper when the test
//! process dies without dropping it (the intended use is one `static` cluster
//! per test binary).
//!
//! ```no_run
//! use std::sync::LazyLock;
//! use fulcrum_testkit::MariaCluster;
//!
//! static CLUSTER: LazyLock<MariaCluster> =
//!     LazyLock::new(|| MariaCluster::builder().replicas(2).start().expect("test cluster"));
//!
//! let primary = CLUSTER.primary();
//! primary.sql("CREATE TABLE IF NOT EXISTS t (id int PRIMARY KEY)").unwrap();
//! ```
//!
//! Start-up: `mariadb-install-db` once, a copy of that fresh data directory
//! per replica, every server started in parallel; then, on the primary, the
//! database and users (binlogged), and on each replica `CHANGE MASTER TO ...
//! MASTER_USE_GTID=slave_pos; START SLAVE`. The replicas begin from an empty
//! GTID position on identical system tables, so replication itself carries the
//! users and the database to them: no dump, no snapshot.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::error::{file_tail, Result, TestkitError};
use crate::maria_conf;
use crate::maria_node::{MariaNode, MAX_SOCKET_PATH};
use crate::pg_cluster::{Phases, KEEP_ENV};
use crate::process::{self, is_root, maria_command};
use crate::reaper::Reaper;
use crate::roles::{self, MARIA_REPL_PASSWORD, MARIA_REPL_USER};
use crate::scratch::{self, TMPDIR_ENV};

/// How long start-up waits for the replicas to apply the bootstrap.
const REPLICATION_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);

/// Options for [`MariaCluster`]; see [`MariaCluster::builder`].
#[derive(Debug, Clone, Default)]
pub struct MariaClusterBuilder {
    replicas: usize,
    settings: Vec<(String, String)>,
}

impl MariaClusterBuilder {
    /// Number of GTID replicas (default 0).
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n;
        self
    }

    /// Any other server option, on every node, passed as `--key=value`
    /// (`--key` when `value` is empty), e.g. `("max-connections", "50")`.
    /// Applied after the harness's own options, so it overrides them, but
    /// before each node's identity (paths, port, `server-id`, `read-only`),
    /// which it cannot override.
    pub fn setting(mut self, key: &str, value: &str) -> Self {
        self.settings.push((key.to_string(), value.to_string()));
        self
    }

    /// Creates, starts and waits for the whole cluster.
    pub fn start(self) -> Result<MariaCluster> {
        self.validate()?;
        let keep = std::env::var(KEEP_ENV).is_ok_and(|v| v == "1");
        let dir = scratch::create("maria", false)?;
        // Armed before anything can be left running.
        let reaper = Reaper::for_cluster(&dir, keep)?;
        let mut options = maria_conf::cluster_options();
        options.extend(self.settings.iter().cloned());
        let primary = MariaNode::new("primary", 1, &dir, options.clone(), false);
        let replicas: Vec<MariaNode> = (1..=self.replicas)
            .map(|i| {
                let name = format!("replica{i}");
                MariaNode::new(&name, i as u32 + 1, &dir, options.clone(), true)
            })
            .collect();
        // From here, an early return drops `cluster`, which stops what started.
        let mut cluster = MariaCluster {
            dir,
            primary,
            replicas: Vec::new(),
            reaper: Some(reaper),
            keep,
        };
        check_socket_paths(std::iter::once(&cluster.primary).chain(&replicas))?;
        let mut phases = Phases::new();
        cluster.install_primary()?;
        phases.done("install-db");
        cluster.copy_fresh_install(&replicas)?;
        phases.done("data dirs copied");
        cluster.start_all(replicas)?;
        phases.done("servers started");
        cluster
            .primary
            .sql_script("mysql", &roles::maria_bootstrap_sql())?;
        phases.done("users");
        cluster.attach_replicas()?;
        cluster.wait_replicas_caught_up(REPLICATION_TIMEOUT)?;
        phases.done("replicas caught up");
        phases.report(&cluster.dir);
        Ok(cluster)
    }

    fn validate(&self) -> Result<()> {
        if let Some((key, _)) = self
            .settings
            .iter()
            .find(|(k, _)| !maria_conf::valid_key(k))
        {
            return Err(TestkitError::Invalid(format!(
                "setting name {key:?} is not a MariaDB option name (give it without `--`)"
            )));
        }
        Ok(())
    }
}

/// A running primary with its replicas. See the module docs.
#[derive(Debug)]
pub struct MariaCluster {
    dir: PathBuf,
    primary: MariaNode,
    replicas: Vec<MariaNode>,
    reaper: Option<Reaper>,
    keep: bool,
}

impl MariaCluster {
    pub fn builder() -> MariaClusterBuilder {
        MariaClusterBuilder::default()
    }

    /// The node started as primary.
    pub fn primary(&self) -> &MariaNode {
        &self.primary
    }

    /// Replicas in order: `replica1` is `replicas()[0]`.
    pub fn replicas(&self) -> &[MariaNode] {
        &self.replicas
    }

    /// Primary first, then the replicas.
    pub fn nodes(&self) -> impl Iterator<Item = &MariaNode> {
        std::iter::once(&self.primary).chain(&self.replicas)
    }

    /// The temp dir holding every data directory, socket and log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Waits until every running replica has applied the primary's binlog up
    /// to its `@@gtid_binlog_pos` at call time (its `@@gtid_slave_pos` reaches
    /// that sequence number in every domain). Stopped replicas and nodes
    /// without replication configured are skipped: they cannot catch up.
    pub fn wait_replicas_caught_up(&self, timeout: Duration) -> Result<()> {
        let target = self.primary.gtid_binlog_pos()?;
        let deadline = Instant::now() + timeout;
        for replica in &self.replicas {
            if !replica.is_running() || replica.slave_status()?.is_none() {
                continue;
            }
            loop {
                let applied = replica.gtid_slave_pos()?;
                if gtid_covers(&applied, &target) {
                    break;
                }
                if Instant::now() >= deadline {
                    let status = match replica.slave_status() {
                        Ok(Some(status)) => summarize(&status),
                        Ok(None) => "no replication configured".to_string(),
                        Err(e) => format!("SHOW SLAVE STATUS failed: {e}"),
                    };
                    return Err(TestkitError::Timeout {
                        what: format!(
                            "{} (port {}) to apply GTID {target}",
                            replica.name(),
                            replica.port()
                        ),
                        waited: timeout,
                        last: format!("gtid_slave_pos {applied:?}; {status}"),
                    });
                }
                std::thread::sleep(POLL);
            }
        }
        Ok(())
    }

    /// `mariadb-install-db` into the primary's data directory.
    fn install_primary(&self) -> Result<()> {
        let mut cmd = maria_command("mariadb-install-db");
        cmd.arg(format!("--datadir={}", self.primary.data_dir().display()))
            // Not /tmp: two clusters bootstrapping at once collide there on
            // the names of their temporary tables.
            .arg(format!("--tmpdir={}", self.dir.display()))
            .args([
                // root@localhost with an (empty) password, not unix_socket
                // auth tied to the OS user.
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
            ])
            .args(maria_conf::render(&maria_conf::storage_options()))
            .current_dir(&self.dir);
        if is_root() {
            cmd.arg("--user=root");
        }
        process::run(&mut cmd, None, "mariadb-install-db of primary").map(|_| ())
    }

    /// Copies the primary's fresh, cleanly shut down data directory for each
    /// replica: a copy of ~30 MB on tmpfs is faster than another install.
    fn copy_fresh_install(&self, replicas: &[MariaNode]) -> Result<()> {
        for replica in replicas {
            let mut cmd = Command::new("cp");
            cmd.arg("-a")
                .arg(self.primary.data_dir())
                .arg(replica.data_dir());
            let target = format!("copying the fresh data directory for {}", replica.name());
            process::run(&mut cmd, None, &target)?;
        }
        Ok(())
    }

    /// Starts the primary and the replicas in parallel, each on a free port.
    fn start_all(&mut self, mut replicas: Vec<MariaNode>) -> Result<()> {
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = std::iter::once(&mut self.primary)
                .chain(replicas.iter_mut())
                .map(|node| s.spawn(move || node.start_on_free_port()))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("server start thread panicked"))
                .collect()
        });
        // Keep every replica (started or not) so Drop stops the started ones.
        self.replicas = replicas;
        results.into_iter().collect::<Result<Vec<()>>>()?;
        Ok(())
    }

    /// Points each replica at the primary (GTID mode, starting from its empty
    /// `gtid_slave_pos`) and starts its replication threads. A one-second
    /// reconnect interval lets replicas follow a restarted primary quickly.
    fn attach_replicas(&self) -> Result<()> {
        let change_master = format!(
            "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={}, \
             MASTER_USER='{MARIA_REPL_USER}', MASTER_PASSWORD='{MARIA_REPL_PASSWORD}', \
             MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1; START SLAVE;",
            self.primary.port()
        );
        for replica in &self.replicas {
            replica.sql_db("mysql", &change_master)?;
        }
        Ok(())
    }
}

/// The kernel refuses unix socket paths over 107 bytes; say so up front.
fn check_socket_paths<'a>(nodes: impl Iterator<Item = &'a MariaNode>) -> Result<()> {
    for node in nodes {
        let len = node.socket().as_os_str().len();
        if len > MAX_SOCKET_PATH {
            return Err(TestkitError::Invalid(format!(
                "the socket path {} is {len} bytes, over the {MAX_SOCKET_PATH} a unix socket \
                 allows; set {TMPDIR_ENV} to a shorter directory",
                node.socket().display()
            )));
        }
    }
    Ok(())
}

/// Whether GTID position `applied` has reached `target` in every domain of
/// `target`: `D-S-N` entries, comma-separated, one per replication domain D
/// (S, the originating server, does not matter for ordering within D).
fn gtid_covers(applied: &str, target: &str) -> bool {
    let parse = |pos: &str| -> Vec<(u64, u64)> {
        pos.split(',')
            .filter_map(|gtid| {
                let mut parts = gtid.trim().splitn(3, '-');
                let domain = parts.next()?.parse().ok()?;
                let _server = parts.next()?;
                let seq = parts.next()?.parse().ok()?;
                Some((domain, seq))
            })
            .collect()
    };
    let applied = parse(applied);
    parse(target)
        .into_iter()
        .all(|(domain, seq)| applied.iter().any(|&(d, s)| d == domain && s >= seq))
}

/// The replication threads' state and last errors, for timeout messages.
fn summarize(status: &std::collections::BTreeMap<String, String>) -> String {
    [
        "Slave_IO_Running",
        "Slave_SQL_Running",
        "Last_IO_Error",
        "Last_SQL_Error",
    ]
    .iter()
    .map(|key| {
        let value = status.get(*key).map_or("?", String::as_str);
        format!("{key}={value}")
    })
    .collect::<Vec<_>>()
    .join(", ")
}

impl Drop for MariaCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for node in self.nodes() {
                eprintln!(
                    "--- {} log ({}) tail ---\n{}",
                    node.name(),
                    node.log_file().display(),
                    file_tail(node.log_file(), 30)
                );
            }
        }
        // SIGKILL is immediate: no need to stop the nodes in parallel.
        for node in self.nodes() {
            if node.is_running() {
                if let Err(e) = node.stop_immediate() {
                    eprintln!("fulcrum-testkit: stopping {}: {e}", node.name());
                }
            }
        }
        if self.keep {
            eprintln!(
                "fulcrum-testkit: kept {} ({KEEP_ENV}=1)",
                self.dir.display()
            );
        } else if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("fulcrum-testkit: removing {}: {e}", self.dir.display());
        }
        if let Some(reaper) = self.reaper.take() {
            reaper.disarm();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::gtid_covers;

    #[test]
    fn gtid_positions_compare_per_domain() {
        assert!(gtid_covers("0-1-5", "0-1-5"));
        assert!(gtid_covers("0-1-6", "0-1-5"));
        assert!(!gtid_covers("0-1-4", "0-1-5"));
        assert!(!gtid_covers("", "0-1-5"));
        // Nothing written yet: nothing to wait for.
        assert!(gtid_covers("", ""));
        // The originating server does not matter within a domain.
        assert!(gtid_covers("0-2-7", "0-1-7"));
        // Every domain of the target must be reached.
        assert!(gtid_covers("0-1-9,1-1-3", "1-1-3,0-1-9"));
        assert!(!gtid_covers("0-1-9", "0-1-9,1-1-3"));
        assert!(!gtid_covers("0-1-9,1-1-2", "0-1-9,1-1-3"));
    }
}
