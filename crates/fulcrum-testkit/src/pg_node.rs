//! One PostgreSQL server of a test cluster (primary or replica): its port,
//! directories and log, `pg_ctl` operations, and SQL as the superuser over the
//! node's unix socket. All state lives on disk, so a node is `Sync` and can
//! sit in a `static` shared by a whole test binary.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{file_tail, Result, TestkitError};
use crate::pg_conf;
use crate::ports::free_port;
use crate::process::{self, client_command, server_command};
use crate::roles::{APP_DB, SUPERUSER};

/// How long `pg_ctl` may wait for a start, stop or promotion (seconds).
const PG_CTL_TIMEOUT_SECS: &str = "60";
/// Attempts at binding a fresh port when another process grabbed ours.
const PORT_ATTEMPTS: usize = 4;

#[derive(Debug)]
pub struct PgNode {
    name: String,
    port: u16,
    data_dir: PathBuf,
    socket_dir: PathBuf,
    log_file: PathBuf,
    /// The cluster's temp dir: the working directory of every command.
    cluster_dir: PathBuf,
}

impl PgNode {
    /// A node whose data directory is `<cluster_dir>/<name>` (not created here).
    pub(crate) fn new(name: &str, cluster_dir: &Path, socket_dir: &Path) -> PgNode {
        PgNode {
            name: name.to_string(),
            port: 0,
            data_dir: cluster_dir.join(name),
            socket_dir: socket_dir.to_path_buf(),
            log_file: cluster_dir.join(format!("{name}.log")),
            cluster_dir: cluster_dir.to_path_buf(),
        }
    }

    /// `primary`, `replica1`, `replica2`, ... (also its `cluster_name` and, on
    /// the primary, its `application_name` in `pg_stat_replication`).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Directory holding this node's `.s.PGSQL.PORT` socket.
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// The server log (`pg_ctl -l`).
    pub fn log_file(&self) -> &Path {
        &self.log_file
    }

    /// The whole server log so far (empty if unreadable).
    pub fn log_contents(&self) -> String {
        std::fs::read(&self.log_file)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// A libpq/tokio-postgres key=value connection string over TCP.
    pub fn conn_string(&self, user: &str, password: &str, db: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={user} password={password} dbname={db}",
            self.port
        )
    }

    /// Starts the server on its port and waits until it accepts connections
    /// (for a replica: until it has reached a consistent state).
    pub fn start(&self) -> Result<()> {
        let before = log_len(&self.log_file);
        let mut cmd = self.pg_ctl();
        cmd.arg("-l")
            .arg(&self.log_file)
            .args(["-w", "-t", PG_CTL_TIMEOUT_SECS, "start"]);
        let out = process::output(&mut cmd, None)?;
        if out.status.success() {
            return Ok(());
        }
        let log = self.log_contents();
        let new_lines = log.get(before..).unwrap_or(&log);
        let reason = if new_lines.contains("could not bind") {
            "port already in use".to_string()
        } else {
            process::failed(&cmd, &out, &self.target()).to_string()
        };
        Err(TestkitError::NodeStart {
            node: self.name.clone(),
            port: self.port,
            reason,
            log: self.log_file.clone(),
            log_tail: file_tail(&self.log_file, 30),
        })
    }

    /// `pg_ctl stop -m immediate`: like a crash (no checkpoint, clients cut).
    pub fn stop_immediate(&self) -> Result<()> {
        self.stop("immediate")
    }

    /// `pg_ctl stop -m fast`: clients disconnected, clean shutdown checkpoint.
    pub fn stop_fast(&self) -> Result<()> {
        self.stop("fast")
    }

    fn stop(&self, mode: &str) -> Result<()> {
        let mut cmd = self.pg_ctl();
        cmd.args(["-m", mode, "-w", "-t", PG_CTL_TIMEOUT_SECS, "stop"]);
        process::run(&mut cmd, None, &self.target()).map(|_| ())
    }

    /// Whether a postmaster is running on this data directory (`pg_ctl status`).
    pub fn is_running(&self) -> bool {
        let mut cmd = self.pg_ctl();
        cmd.arg("status");
        process::output(&mut cmd, None).is_ok_and(|out| out.status.success())
    }

    /// Promotes a replica to primary and waits until it accepts writes.
    pub fn promote(&self) -> Result<()> {
        let mut cmd = self.pg_ctl();
        cmd.args(["-w", "-t", PG_CTL_TIMEOUT_SECS, "promote"]);
        process::run(&mut cmd, None, &self.target()).map(|_| ())
    }

    /// Runs `query` as the superuser in database `app`; stdout, trimmed
    /// (`psql -X -At`: unaligned, tuples only, `|` between columns).
    pub fn sql(&self, query: &str) -> Result<String> {
        self.sql_db(APP_DB, query)
    }

    /// Like [`PgNode::sql`], in database `db`. Several statements in one
    /// `query` run in one implicit transaction.
    pub fn sql_db(&self, db: &str, query: &str) -> Result<String> {
        let mut cmd = self.psql(db);
        cmd.arg("-c").arg(query);
        self.run_psql(cmd, None)
    }

    /// Runs a script through psql's stdin, statement by statement (so it may
    /// contain `CREATE DATABASE` and the like), stopping at the first error.
    pub fn sql_script(&self, db: &str, script: &str) -> Result<String> {
        let mut cmd = self.psql(db);
        cmd.args(["-f", "-"]);
        self.run_psql(cmd, Some(script))
    }

    /// `pg_is_in_recovery()`: true on a replica (until promoted).
    pub fn is_in_recovery(&self) -> Result<bool> {
        Ok(self.sql_db("postgres", "SELECT pg_is_in_recovery()")? == "t")
    }

    fn run_psql(&self, mut cmd: Command, stdin: Option<&str>) -> Result<String> {
        let out = process::run(&mut cmd, stdin, &self.target())?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    fn psql(&self, db: &str) -> Command {
        let mut cmd = client_command("psql");
        cmd.env("PGCONNECT_TIMEOUT", "10")
            .args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.socket_dir)
            .args(["-p", &self.port.to_string(), "-U", SUPERUSER, "-d", db]);
        cmd
    }

    fn pg_ctl(&self) -> Command {
        let mut cmd = server_command("pg_ctl", &self.cluster_dir);
        cmd.arg("-D").arg(&self.data_dir);
        cmd
    }

    /// `replica1 (port 41235)`, for error messages.
    fn target(&self) -> String {
        format!("{} (port {})", self.name, self.port)
    }

    /// Picks a free port, writes it (and the socket dir and name) into this
    /// node's postgresql.conf and starts; on a lost port race, tries another.
    pub(crate) fn start_on_free_port(&mut self) -> Result<()> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.port = free_port();
            let block = pg_conf::render(
                &format!("node {}", self.name),
                &pg_conf::node_settings(&self.name, self.port, &self.socket_dir),
            );
            self.append_conf(&block)?;
            match self.start() {
                Err(TestkitError::NodeStart { reason, .. })
                    if reason == "port already in use" && attempt < PORT_ATTEMPTS =>
                {
                    continue
                }
                other => return other,
            }
        }
    }

    /// Appends text to this node's postgresql.conf (last setting wins).
    /// Makes this node (a killed old primary, say) a fresh streaming
    /// replica of `primary`, on its own port: its data directory is cloned
    /// again with `pg_basebackup -R`, as an operator re-joins a failed
    /// primary without pg_rewind, and it starts. It does not ask to be a
    /// synchronous standby of anyone itself (`synchronous_standby_names`
    /// inherited from the clone is cleared).
    pub fn rebuild_as_replica_of(&self, primary: &PgNode) -> Result<()> {
        if self.is_running() {
            self.stop_immediate()?;
        }
        if self.data_dir.exists() {
            std::fs::remove_dir_all(&self.data_dir).map_err(|e| {
                TestkitError::io(format!("removing {}", self.data_dir.display()), e)
            })?;
        }
        let mut cmd = server_command("pg_basebackup", &self.cluster_dir);
        cmd.args([
            "-h",
            "127.0.0.1",
            "-p",
            &primary.port().to_string(),
            "-U",
            SUPERUSER,
        ])
        .arg("-D")
        .arg(&self.data_dir)
        .args(["-R", "-X", "stream", "-c", "fast", "--no-sync"]);
        process::run(&mut cmd, None, &format!("pg_basebackup for {}", self.name))?;
        let block = pg_conf::render(
            &format!("node {}", self.name),
            &pg_conf::node_settings(&self.name, self.port, &self.socket_dir),
        );
        self.append_conf(&block)?;
        let auto = self.data_dir.join("postgresql.auto.conf");
        OpenOptions::new()
            .append(true)
            .open(&auto)
            .and_then(|mut f| f.write_all(b"synchronous_standby_names = ''\n"))
            .map_err(|e| TestkitError::io(format!("appending to {}", auto.display()), e))?;
        self.start()
    }

    pub(crate) fn append_conf(&self, text: &str) -> Result<()> {
        let path = self.data_dir.join("postgresql.conf");
        OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| TestkitError::io(format!("appending to {}", path.display()), e))
    }
}

fn log_len(path: &Path) -> usize {
    std::fs::metadata(path).map_or(0, |m| m.len() as usize)
}
