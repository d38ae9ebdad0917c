//! One MariaDB server of a test cluster (primary or replica): a `mariadbd`
//! child process with its own data directory, loopback port, unix socket, pid
//! file and error log inside the cluster's temp dir; start, SIGKILL and
//! SIGTERM stops; and SQL as root over the node's socket with the real
//! `mariadb` client. The process handle sits behind a mutex, so a node is
//! `Sync` and can live in a `static` shared by a whole test binary.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{file_tail, Result, TestkitError};
use crate::maria_conf::{self, NodeIdentity};
use crate::ports::free_port;
use crate::process::{self, is_root, maria_command};
use crate::roles::{APP_DB, MARIA_SUPERUSER};

/// How long a start or a graceful stop may take.
const SERVER_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts at binding a fresh port when another process grabbed ours.
const PORT_ATTEMPTS: usize = 4;
const POLL: Duration = Duration::from_millis(20);
/// What mariadbd logs once it accepts connections.
const READY_LINE: &str = "ready for connections";
/// What mariadbd logs when its TCP port is taken.
const PORT_TAKEN_LINE: &str = "Bind on TCP/IP port";
/// The longest unix socket path the kernel accepts (`sun_path` minus the NUL).
pub(crate) const MAX_SOCKET_PATH: usize = 107;

#[derive(Debug)]
pub struct MariaNode {
    name: String,
    server_id: u32,
    port: u16,
    data_dir: PathBuf,
    socket: PathBuf,
    pid_file: PathBuf,
    log_file: PathBuf,
    /// The cluster's temp dir: the working directory of every command.
    cluster_dir: PathBuf,
    /// Cluster options plus the builder's settings; the node's identity
    /// (paths, port, server id, read-only) is appended at each start.
    options: Vec<(String, String)>,
    read_only: bool,
    /// The running server, if this node started one and it was not stopped.
    child: Mutex<Option<Child>>,
}

impl MariaNode {
    /// A node whose data directory is `<cluster_dir>/<name>` (not created
    /// here), with socket `<name>.sock` and error log `<name>.log` next to it
    /// and pid file `<name>/mariadbd.pid` (where the reaper looks).
    pub(crate) fn new(
        name: &str,
        server_id: u32,
        cluster_dir: &Path,
        options: Vec<(String, String)>,
        read_only: bool,
    ) -> MariaNode {
        let data_dir = cluster_dir.join(name);
        MariaNode {
            name: name.to_string(),
            server_id,
            port: 0,
            pid_file: data_dir.join("mariadbd.pid"),
            data_dir,
            socket: cluster_dir.join(format!("{name}.sock")),
            log_file: cluster_dir.join(format!("{name}.log")),
            cluster_dir: cluster_dir.to_path_buf(),
            options,
            read_only,
            child: Mutex::new(None),
        }
    }

    /// `primary`, `replica1`, `replica2`, ...
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `server_id`: 1 for the primary, `i + 1` for `replica<i>`; the middle
    /// part of the GTIDs this node originates.
    pub fn server_id(&self) -> u32 {
        self.server_id
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

    /// This node's unix socket (`<cluster dir>/<name>.sock`).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The error log (`--log-error`; the server's stdout and stderr go there too).
    pub fn log_file(&self) -> &Path {
        &self.log_file
    }

    /// The whole error log so far (empty if unreadable).
    pub fn log_contents(&self) -> String {
        std::fs::read(&self.log_file)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Whether this node was started as a replica (`read_only=1` in its
    /// start options).
    pub fn is_replica(&self) -> bool {
        self.read_only
    }

    /// The server's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        let mut slot = self.lock_child();
        self.running(&mut slot).map(|child| child.id())
    }

    /// Starts `mariadbd` on this node's port and waits until it is ready for
    /// connections. A replica resumes replication by itself (its replication
    /// settings are stored in its data directory).
    pub fn start(&self) -> Result<()> {
        // Held throughout, so nobody sees the node half started.
        let mut slot = self.lock_child();
        if self.running(&mut slot).is_some() {
            return Err(TestkitError::Invalid(format!(
                "{} is already running",
                self.target()
            )));
        }
        let before = log_len(&self.log_file);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_file)
            .and_then(|f| Ok((f.try_clone()?, f)))
            .map_err(|e| TestkitError::io(format!("opening {}", self.log_file.display()), e))?;
        let identity = maria_conf::node_options(&NodeIdentity {
            data_dir: &self.data_dir,
            port: self.port,
            socket: &self.socket,
            pid_file: &self.pid_file,
            log_file: &self.log_file,
            server_id: self.server_id,
            read_only: self.read_only,
            as_root: is_root(),
        });
        let mut cmd = maria_command("mariadbd");
        cmd.args(maria_conf::render(&self.options))
            .args(maria_conf::render(&identity))
            .current_dir(&self.cluster_dir)
            .stdin(Stdio::null())
            .stdout(log.0)
            .stderr(log.1)
            // Like pg_ctl's setsid: a Ctrl-C aimed at the test run must not
            // race the reaper for the server.
            .process_group(0);
        let child = cmd.spawn().map_err(|e| {
            TestkitError::io(
                format!("spawning `{}` for {}", process::describe(&cmd), self.name),
                e,
            )
        })?;
        let child = slot.insert(child);

        let deadline = Instant::now() + SERVER_TIMEOUT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                *slot = None;
                self.remove_pid_file();
                let new_lines = self.log_since(before);
                let reason = if new_lines.contains(PORT_TAKEN_LINE) {
                    "port already in use".to_string()
                } else {
                    format!("mariadbd exited with {status}")
                };
                return Err(self.start_error(reason));
            }
            // Logged once the TCP and socket listeners are up. (No TCP probe:
            // the server would log each one as an aborted connection.)
            if self.log_since(before).contains(READY_LINE) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                *slot = None;
                self.remove_pid_file();
                return Err(self.start_error(format!(
                    "not ready for connections after {SERVER_TIMEOUT:?} (killed)"
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// SIGKILLs the server: like a crash (no InnoDB shutdown, clients cut).
    /// Committed transactions survive: the redo log reaches the OS at commit.
    pub fn stop_immediate(&self) -> Result<()> {
        let mut slot = self.lock_child();
        let Some(child) = self.running(&mut slot) else {
            return Err(self.not_running());
        };
        child
            .kill()
            .and_then(|()| child.wait())
            .map_err(|e| TestkitError::io(format!("SIGKILL {}", self.target()), e))?;
        *slot = None;
        // A killed server leaves it behind; the reaper and the stale-directory
        // sweep must not mistake it for a live one.
        self.remove_pid_file();
        Ok(())
    }

    /// SIGTERM and waits for the clean shutdown (clients disconnected, InnoDB
    /// flushed); SIGKILL and an error if that takes over a minute.
    pub fn stop_fast(&self) -> Result<()> {
        let mut slot = self.lock_child();
        let Some(child) = self.running(&mut slot) else {
            return Err(self.not_running());
        };
        // SAFETY: kill has no memory-safety preconditions; the pid is our
        // unreaped child (we hold the lock), so it cannot have been recycled.
        if unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) } != 0 {
            return Err(TestkitError::io(
                format!("SIGTERM {}", self.target()),
                std::io::Error::last_os_error(),
            ));
        }
        let deadline = Instant::now() + SERVER_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    *slot = None;
                    self.remove_pid_file();
                    return Err(TestkitError::Timeout {
                        what: format!("{} to shut down after SIGTERM (then killed)", self.target()),
                        waited: SERVER_TIMEOUT,
                        last: file_tail(&self.log_file, 10),
                    });
                }
                Err(e) => {
                    return Err(TestkitError::io(
                        format!("waiting for {}", self.target()),
                        e,
                    ))
                }
            }
        }
        *slot = None;
        self.remove_pid_file();
        Ok(())
    }

    /// Whether the server this node started is still running.
    pub fn is_running(&self) -> bool {
        let mut slot = self.lock_child();
        self.running(&mut slot).is_some()
    }

    /// Runs `query` as root in database `app`; stdout, trimmed (`--batch
    /// --skip-column-names`: tab between columns, `NULL` for nulls).
    pub fn sql(&self, query: &str) -> Result<String> {
        self.sql_db(APP_DB, query)
    }

    /// Like [`MariaNode::sql`], in database `db` (`mysql` always exists).
    /// `query` may hold several statements separated by `;`.
    pub fn sql_db(&self, db: &str, query: &str) -> Result<String> {
        let mut cmd = self.client(db, false);
        cmd.arg("--execute").arg(query);
        self.run_client(cmd, None)
    }

    /// Runs a script through the client's stdin, stopping at the first error.
    pub fn sql_script(&self, db: &str, script: &str) -> Result<String> {
        let cmd = self.client(db, false);
        self.run_client(cmd, Some(script))
    }

    /// The global status counters `names` (e.g. `Com_select`, `Questions`),
    /// in that order, read with one `SHOW GLOBAL STATUS` (which, with the
    /// client's `COM_QUIT`, `Questions` counts).
    pub fn global_status(&self, names: &[&str]) -> Result<Vec<u64>> {
        let list: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
        let query = format!(
            "SHOW GLOBAL STATUS WHERE Variable_name IN ({})",
            list.join(", ")
        );
        let out = self.sql(&query)?;
        parse_global_status(&out, names).ok_or_else(|| TestkitError::Parse {
            what: format!("{} on {}", names.join(", "), self.target()),
            reason: "a counter missing or not a number".into(),
            output: out,
        })
    }

    /// `@@global.read_only`: true on a replica.
    pub fn read_only(&self) -> Result<bool> {
        let value = self.sql_db("mysql", "SELECT @@global.read_only")?;
        match value.as_str() {
            "1" => Ok(true),
            "0" => Ok(false),
            _ => Err(TestkitError::Parse {
                what: format!("@@read_only of {}", self.target()),
                reason: "expected 0 or 1".into(),
                output: value,
            }),
        }
    }

    /// `@@global.gtid_binlog_pos`: the last GTID this node wrote to its binlog
    /// per replication domain, e.g. `0-1-42` (empty before the first write).
    pub fn gtid_binlog_pos(&self) -> Result<String> {
        self.sql_db("mysql", "SELECT @@global.gtid_binlog_pos")
    }

    /// `@@global.gtid_slave_pos`: the last GTID this replica applied.
    pub fn gtid_slave_pos(&self) -> Result<String> {
        self.sql_db("mysql", "SELECT @@global.gtid_slave_pos")
    }

    /// `SHOW SLAVE STATUS` as column -> value (e.g. `Slave_IO_Running` ->
    /// `Yes`), or `None` when no replication is configured on this node.
    pub fn slave_status(&self) -> Result<Option<BTreeMap<String, String>>> {
        let mut cmd = self.client("mysql", true);
        cmd.arg("--execute").arg("SHOW SLAVE STATUS");
        // Not trimmed: the last column may be empty (a trailing tab).
        let out = process::run(&mut cmd, None, &self.target())?;
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut lines = out.lines();
        let (Some(header), Some(values)) = (lines.next(), lines.next()) else {
            return Ok(None);
        };
        let columns: Vec<&str> = header.split('\t').collect();
        let values: Vec<&str> = values.split('\t').collect();
        if columns.len() != values.len() {
            return Err(TestkitError::Parse {
                what: format!("SHOW SLAVE STATUS on {}", self.target()),
                reason: format!("{} columns but {} values", columns.len(), values.len()),
                output: out,
            });
        }
        Ok(Some(
            columns
                .into_iter()
                .zip(values)
                .map(|(c, v)| (c.to_string(), v.to_string()))
                .collect(),
        ))
    }

    fn run_client(&self, mut cmd: Command, stdin: Option<&str>) -> Result<String> {
        let out = process::run(&mut cmd, stdin, &self.target())?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// The `mariadb` client as root over this node's socket, never TCP.
    fn client(&self, db: &str, column_names: bool) -> Command {
        let mut cmd = maria_command("mariadb");
        cmd.arg("--protocol=SOCKET")
            .arg(format!("--socket={}", self.socket.display()))
            .arg(format!("--user={MARIA_SUPERUSER}"))
            .args(["--batch", "--connect-timeout=10"])
            .arg(format!("--database={db}"))
            .current_dir(&self.cluster_dir);
        if !column_names {
            cmd.arg("--skip-column-names");
        }
        cmd
    }

    /// `replica1 (port 41235)`, for error messages.
    fn target(&self) -> String {
        format!("{} (port {})", self.name, self.port)
    }

    fn lock_child(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn not_running(&self) -> TestkitError {
        TestkitError::Invalid(format!("{} is not running", self.target()))
    }

    fn start_error(&self, reason: String) -> TestkitError {
        TestkitError::NodeStart {
            node: self.name.clone(),
            port: self.port,
            reason,
            log: self.log_file.clone(),
            log_tail: file_tail(&self.log_file, 30),
        }
    }

    fn log_since(&self, offset: usize) -> String {
        let log = self.log_contents();
        log.get(offset..).unwrap_or(&log).to_string()
    }

    /// The child in `slot` if it has not exited. One that exited (crashed,
    /// or was killed from outside) is reaped and forgotten, with its pid file.
    fn running<'a>(&self, slot: &'a mut Option<Child>) -> Option<&'a mut Child> {
        if slot
            .as_mut()
            .is_some_and(|child| !matches!(child.try_wait(), Ok(None)))
        {
            *slot = None;
            self.remove_pid_file();
        }
        slot.as_mut()
    }

    fn remove_pid_file(&self) {
        let _ = std::fs::remove_file(&self.pid_file);
    }

    /// Picks a free port and starts; on a lost port race, tries another.
    pub(crate) fn start_on_free_port(&mut self) -> Result<()> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.port = free_port();
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
}

fn log_len(path: &Path) -> usize {
    std::fs::metadata(path).map_or(0, |m| m.len() as usize)
}

/// The values of `names` (matched whatever their case) in `SHOW GLOBAL
/// STATUS` rows printed `name<TAB>value` a line; `None` when one is missing
/// or not a number.
fn parse_global_status(text: &str, names: &[&str]) -> Option<Vec<u64>> {
    names
        .iter()
        .map(|name| {
            text.lines().find_map(|line| {
                let (n, v) = line.split_once('\t')?;
                n.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().parse().ok())?
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::parse_global_status;

    #[test]
    fn global_status_values_come_in_the_order_asked_whatever_the_case() {
        let text = "Com_select\t987\nQuestions\t1234";
        assert_eq!(
            parse_global_status(text, &["Questions", "Com_select"]),
            Some(vec![1234, 987])
        );
        assert_eq!(
            parse_global_status("COM_SELECT\t5\n", &["Com_select"]),
            Some(vec![5])
        );
    }

    #[test]
    fn global_status_without_a_counter_or_with_a_bad_value_is_none() {
        let names = ["Com_select", "Questions"];
        assert_eq!(parse_global_status("Com_select\t5", &names), None);
        assert_eq!(
            parse_global_status("Com_select\t5\nQuestions\tmany", &names),
            None
        );
        assert_eq!(parse_global_status("", &names), None);
    }
}
