//! A throwaway PostgreSQL cluster: one primary and N streaming replicas in one
//! temp dir, with the test roles of `roles.rs`. Built by [`PgClusterBuilder`];
//! torn down by `Drop`, or by the reaper when the test process dies without
//! dropping it (the intended use is one `static` cluster per test binary).
//!
//! ```no_run
//! use std::sync::LazyLock;
//! use fulcrum_testkit::PgCluster;
//!
//! static CLUSTER: LazyLock<PgCluster> =
//!     LazyLock::new(|| PgCluster::builder().replicas(2).start().expect("test cluster"));
//!
//! let primary = CLUSTER.primary();
//! primary.sql("CREATE TABLE IF NOT EXISTS t (id int)").unwrap();
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{file_tail, Result, TestkitError};
use crate::pg_conf;
use crate::pg_node::PgNode;
use crate::process::{self, server_command};
use crate::reaper::Reaper;
use crate::roles::{self, SUPERUSER};
use crate::scratch;

/// Set to `1` to keep cluster and daemon directories (data, logs) after the
/// tests; the servers are still stopped. The next run's sweep removes them.
pub const KEEP_ENV: &str = "FULCRUM_TESTKIT_KEEP";

/// Set to `1` to print start-up phase timings.
pub const VERBOSE_ENV: &str = "FULCRUM_TESTKIT_VERBOSE";

/// How long start-up waits for replicas to stream.
const STREAMING_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);

/// Options for [`PgCluster`]; see [`PgCluster::builder`].
#[derive(Debug, Clone)]
pub struct PgClusterBuilder {
    replicas: usize,
    synchronous_standby: bool,
    max_connections: u32,
    settings: Vec<(String, String)>,
    tls: Option<(crate::TestCerts, bool)>,
}

impl Default for PgClusterBuilder {
    fn default() -> Self {
        PgClusterBuilder {
            replicas: 0,
            synchronous_standby: false,
            max_connections: 200,
            settings: Vec::new(),
            tls: None,
        }
    }
}

impl PgClusterBuilder {
    /// Number of streaming replicas (default 0).
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n;
        self
    }

    /// Make commits wait for one standby (`synchronous_standby_names = '*'`,
    /// `synchronous_commit = on`, primary only). Needs at least one replica;
    /// with every replica stopped, commits on the primary then hang.
    pub fn synchronous_standby(mut self, on: bool) -> Self {
        self.synchronous_standby = on;
        self
    }

    /// `max_connections` on every node (default 200).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// Any other `postgresql.conf` setting, on every node; applied after the
    /// harness's own, so it overrides them. The value is quoted for you.
    pub fn setting(mut self, key: &str, value: &str) -> Self {
        self.settings.push((key.to_string(), value.to_string()));
        self
    }

    /// Creates, starts and waits for the whole cluster.
    pub fn start(self) -> Result<PgCluster> {
        self.validate()?;
        let keep = std::env::var(KEEP_ENV).is_ok_and(|v| v == "1");
        let dir = scratch::create("pg", true)?;
        // Armed before anything can be left running.
        let reaper = Reaper::for_cluster(&dir, keep)?;
        // The sockets live in the cluster dir itself: it is postgres-owned and
        // its path is short enough for a unix socket name.
        let primary = PgNode::new("primary", &dir, &dir);
        // From here, an early return drops `cluster`, which stops what started.
        let mut cluster = PgCluster {
            dir,
            primary,
            replicas: Vec::new(),
            reaper: Some(reaper),
            keep,
        };
        let mut phases = Phases::new();
        cluster.init_primary(&self)?;
        phases.done("initdb");
        cluster.primary.start_on_free_port()?;
        phases.done("primary start");
        cluster
            .primary
            .sql_script("postgres", &roles::bootstrap_sql())?;
        phases.done("roles");
        cluster.add_replicas(self.replicas)?;
        phases.done("replicas cloned and started");
        cluster.wait_streaming(self.replicas, STREAMING_TIMEOUT)?;
        phases.done("streaming");
        if self.synchronous_standby {
            cluster.enable_synchronous_standby()?;
            phases.done("synchronous standby");
        }
        phases.report(&cluster.dir);
        Ok(cluster)
    }

    /// `ssl = on` with `certs`' server certificate and key (and its CA as
    /// `ssl_ca_file`); with `only`, every TCP login but replication must
    /// use TLS (`hostssl` lines in pg_hba.conf).
    pub fn tls(mut self, certs: &crate::TestCerts, only: bool) -> Self {
        self.tls = Some((certs.clone(), only));
        self
    }

    fn validate(&self) -> Result<()> {
        if self.synchronous_standby && self.replicas == 0 {
            return Err(TestkitError::Invalid(
                "synchronous_standby(true) needs at least one replica, or every commit hangs"
                    .into(),
            ));
        }
        if self.max_connections < 10 {
            return Err(TestkitError::Invalid(format!(
                "max_connections({}) leaves no room for the harness and walsenders",
                self.max_connections
            )));
        }
        if let Some((key, _)) = self.settings.iter().find(|(k, _)| !pg_conf::valid_key(k)) {
            return Err(TestkitError::Invalid(format!(
                "setting name {key:?} is not a PostgreSQL parameter name"
            )));
        }
        Ok(())
    }
}

/// Start-up phase timings, printed when `FULCRUM_TESTKIT_VERBOSE=1` (also
/// used by `maria_cluster.rs`).
pub(crate) struct Phases {
    last: Instant,
    start: Instant,
    lines: Vec<String>,
}

impl Phases {
    pub(crate) fn new() -> Phases {
        let now = Instant::now();
        Phases {
            last: now,
            start: now,
            lines: Vec::new(),
        }
    }

    pub(crate) fn done(&mut self, phase: &str) {
        let now = Instant::now();
        self.lines
            .push(format!("{phase} {:?}", now.duration_since(self.last)));
        self.last = now;
    }

    pub(crate) fn report(&self, dir: &Path) {
        if std::env::var(VERBOSE_ENV).is_ok_and(|v| v == "1") {
            eprintln!(
                "fulcrum-testkit: cluster {} up in {:?}: {}",
                dir.display(),
                self.start.elapsed(),
                self.lines.join(", ")
            );
        }
    }
}

/// A running primary with its replicas. See the module docs.
#[derive(Debug)]
pub struct PgCluster {
    dir: PathBuf,
    primary: PgNode,
    replicas: Vec<PgNode>,
    reaper: Option<Reaper>,
    keep: bool,
}

impl PgCluster {
    pub fn builder() -> PgClusterBuilder {
        PgClusterBuilder::default()
    }

    /// The node started as primary (still this node after a promotion).
    pub fn primary(&self) -> &PgNode {
        &self.primary
    }

    /// Replicas in order: `replica1` is `replicas()[0]`.
    pub fn replicas(&self) -> &[PgNode] {
        &self.replicas
    }

    /// Primary first, then the replicas.
    pub fn nodes(&self) -> impl Iterator<Item = &PgNode> {
        std::iter::once(&self.primary).chain(&self.replicas)
    }

    /// The temp dir holding every data directory, socket and log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Waits until every running replica that is still in recovery has
    /// replayed the primary's WAL up to its insert position at call time.
    /// Stopped and promoted replicas are skipped: they cannot catch up.
    pub fn wait_replicas_caught_up(&self, timeout: Duration) -> Result<()> {
        // The insert position, not pg_current_wal_lsn(): with
        // synchronous_commit=off the last commits may not be written yet.
        let target = self
            .primary
            .sql_db("postgres", "SELECT pg_current_wal_insert_lsn()")?;
        let deadline = Instant::now() + timeout;
        for replica in &self.replicas {
            if !replica.is_running() {
                continue;
            }
            let query = format!(
                "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn() >= '{target}'::pg_lsn, \
                 pg_last_wal_replay_lsn()"
            );
            loop {
                let row = replica.sql_db("postgres", &query)?;
                if !row.starts_with("t|") || row.starts_with("t|t|") {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(TestkitError::Timeout {
                        what: format!("{} to replay up to {target}", replica.name()),
                        waited: timeout,
                        last: format!("replayed up to {}", row.rsplit('|').next().unwrap_or("")),
                    });
                }
                std::thread::sleep(POLL);
            }
        }
        Ok(())
    }

    /// `initdb` plus the harness's pg_hba.conf and settings.
    fn init_primary(&self, opts: &PgClusterBuilder) -> Result<()> {
        let mut cmd = server_command("initdb", &self.dir);
        cmd.arg("-D")
            .arg(self.primary.data_dir())
            .args([
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--no-sync",
                "--no-instructions",
            ])
            .args(["-E", "UTF8", "--locale=C"]);
        process::run(&mut cmd, None, "initdb of primary")?;

        let hba = self.primary.data_dir().join("pg_hba.conf");
        let hba_text = match &opts.tls {
            Some((_, true)) => pg_conf::hba_ssl_only(),
            _ => pg_conf::hba(),
        };
        std::fs::write(&hba, hba_text)
            .map_err(|e| TestkitError::io(format!("writing {}", hba.display()), e))?;
        if let Some((certs, _)) = &opts.tls {
            self.install_certs(certs)?;
        }
        self.primary.append_conf(&pg_conf::render(
            "cluster",
            &pg_conf::cluster_settings(opts.max_connections),
        ))?;
        if !opts.settings.is_empty() {
            self.primary
                .append_conf(&pg_conf::render("builder settings", &opts.settings))?;
        }
        Ok(())
    }

    /// Copies the certificate, key and CA into the primary's data directory
    /// (replicas clone them), owned by the server's user, the key private.
    fn install_certs(&self, certs: &crate::TestCerts) -> Result<()> {
        let data = self.primary.data_dir();
        for (from, to) in [
            (&certs.cert, "server.crt"),
            (&certs.key, "server.key"),
            (&certs.ca, "root.crt"),
        ] {
            let dest = data.join(to);
            std::fs::copy(from, &dest)
                .map_err(|e| TestkitError::io(format!("copying {}", from.display()), e))?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| TestkitError::io(format!("chmod {}", dest.display()), e))?;
            if process::is_root() {
                let (uid, gid) = process::postgres_ids()?;
                std::os::unix::fs::chown(&dest, Some(uid), Some(gid))
                    .map_err(|e| TestkitError::io(format!("chown {}", dest.display()), e))?;
            }
        }
        let s = |k: &str, v: &str| (k.to_string(), v.to_string());
        self.primary.append_conf(&pg_conf::render(
            "tls",
            &[
                s("ssl", "on"),
                s("ssl_cert_file", "server.crt"),
                s("ssl_key_file", "server.key"),
                s("ssl_ca_file", "root.crt"),
            ],
        ))
    }

    /// Clones the primary with `pg_basebackup -R` and starts each clone.
    /// The clones are taken in parallel; each is a few tens of MB.
    fn add_replicas(&mut self, n: usize) -> Result<()> {
        let mut replicas: Vec<PgNode> = (1..=n)
            .map(|i| PgNode::new(&format!("replica{i}"), &self.dir, &self.dir))
            .collect();
        let primary_port = self.primary.port().to_string();
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = replicas
                .iter()
                .map(|replica| {
                    let primary_port = &primary_port;
                    let dir = &self.dir;
                    s.spawn(move || {
                        let mut cmd = server_command("pg_basebackup", dir);
                        cmd.args(["-h", "127.0.0.1", "-p", primary_port, "-U", SUPERUSER])
                            .arg("-D")
                            .arg(replica.data_dir())
                            .args(["-R", "-X", "stream", "-c", "fast", "--no-sync"]);
                        let target = format!("pg_basebackup for {}", replica.name());
                        process::run(&mut cmd, None, &target).map(|_| ())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("basebackup thread panicked"))
                .collect()
        });
        results.into_iter().collect::<Result<Vec<()>>>()?;

        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = replicas
                .iter_mut()
                .map(|replica| s.spawn(move || replica.start_on_free_port()))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("replica start thread panicked"))
                .collect()
        });
        // Keep every replica (started or not) so Drop stops the started ones.
        self.replicas = replicas;
        results.into_iter().collect::<Result<Vec<()>>>()?;
        Ok(())
    }

    /// Waits until `n` walsenders on the primary report `streaming`.
    fn wait_streaming(&self, n: usize, timeout: Duration) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let query = "SELECT count(*) FILTER (WHERE state = 'streaming'), \
                     string_agg(application_name || '=' || state, ', ') FROM pg_stat_replication";
        self.poll_primary(query, timeout, &format!("{n} replicas streaming"), |row| {
            row.split('|').next() == Some(&n.to_string())
        })
    }

    /// Turns on synchronous replication on the primary only (a promoted
    /// replica must not wait for standbys it does not have).
    fn enable_synchronous_standby(&self) -> Result<()> {
        self.primary.sql_script(
            "postgres",
            "ALTER SYSTEM SET synchronous_standby_names = '*';\n\
             ALTER SYSTEM SET synchronous_commit = 'on';\n\
             SELECT pg_reload_conf();\n",
        )?;
        let query = "SELECT count(*) FILTER (WHERE sync_state = 'sync'), \
                     string_agg(application_name || '=' || sync_state, ', ') FROM pg_stat_replication";
        self.poll_primary(query, STREAMING_TIMEOUT, "a synchronous standby", |row| {
            row.split('|').next().is_some_and(|c| c != "0")
        })
    }

    fn poll_primary(
        &self,
        query: &str,
        timeout: Duration,
        what: &str,
        done: impl Fn(&str) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let row = self.primary.sql_db("postgres", query)?;
            if done(&row) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(TestkitError::Timeout {
                    what: what.to_string(),
                    waited: timeout,
                    last: format!("pg_stat_replication: {row}"),
                });
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for PgCluster {
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
        // Stop in parallel: each pg_ctl stop polls at 100 ms granularity.
        std::thread::scope(|s| {
            for node in self.nodes() {
                if node.data_dir().join("postmaster.pid").exists() {
                    s.spawn(move || {
                        if let Err(e) = node.stop_immediate() {
                            eprintln!("fulcrum-testkit: stopping {}: {e}", node.name());
                        }
                    });
                }
            }
        });
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
