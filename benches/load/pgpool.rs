//! Pgpool-II as a load-bench target: [`Pgpool`] starts one in a private temp
//! dir in front of a primary and its streaming replicas (loopback only, its
//! own ports and sockets, never the system service), checks that it found the
//! primary, and stops it and removes the dir on drop (a watchdog shell does
//! the same if the bench dies without dropping it).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fulcrum_testkit::{free_port, is_root, pg_bin, wait_for_tcp, APP_DB, APP_PASSWORD, APP_USER};

use crate::daemon;
use crate::process::{run_bounded, tail};
use crate::Result;

/// Where Debian's `pgpool2` package installs the server.
pub const PGPOOL: &str = "/usr/sbin/pgpool";
/// Children beyond the benchmark's clients: room for the bench's own checks
/// (`SHOW pool_nodes`) and a reconnecting client while another child is still
/// resetting its session.
pub const SPARE_CHILDREN: u32 = 4;
/// Cached backend connection sets per child (`max_pool`). The bench uses one
/// (user, database) pair, so one cached set per child is all it can reuse.
const MAX_POOL: u32 = 1;
/// How long Pgpool-II may take to listen and to find the primary.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// Fast shutdown gets this long before the whole process group is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Numbers the temp dirs, so two instances in one process never share one.
static INSTANCES: AtomicU32 = AtomicU32::new(0);

/// A Pgpool-II in streaming-replication mode with load balancing, in a temp
/// dir. Stopped (fast shutdown, then killed) and its dir removed on drop.
pub struct Pgpool {
    pub addr: String,
    dir: PathBuf,
    /// Pgpool-II's main process (`-n`: not detached), or `runuser` running it
    /// when we are root; the leader of its own process group either way.
    child: Mutex<Child>,
    /// A shell that stops Pgpool-II if this process dies without dropping us.
    watchdog: Option<Child>,
}

impl Pgpool {
    /// Pgpool-II in streaming-replication mode with load balancing, in front of
    /// `primary` and `replicas` ("127.0.0.1:PORT" each), `children` =
    /// num_init_children (how many clients it can serve at once), each child
    /// caching [`MAX_POOL`] backend connection set.
    pub fn start(primary: &str, replicas: &[String], children: u32) -> Result<Pgpool> {
        let dir = std::env::temp_dir().join(format!(
            "fulcrum-bench-pgpool-{}-{}",
            std::process::id(),
            INSTANCES.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let port = free_port();
        let conf = dir.join("pgpool.conf");
        let backends: Vec<&str> = std::iter::once(primary)
            .chain(replicas.iter().map(String::as_str))
            .collect();
        std::fs::write(&conf, config(&dir, port, free_port(), &backends, children)?)?;
        // Clients log in to Pgpool-II with SCRAM, as they do to PostgreSQL,
        // Fulcrum and PgBouncer here. Pgpool-II then logs in to each backend
        // with SCRAM itself, which needs the password, not a hash: pool_passwd
        // holds it in plain text (the `TEXT` prefix; an md5 entry cannot do
        // SCRAM, and AES would only add a key file to this throwaway dir).
        let hba = dir.join("pool_hba.conf");
        std::fs::write(
            &hba,
            "local all all scram-sha-256\nhost all all 127.0.0.1/32 scram-sha-256\n",
        )?;
        let passwd = dir.join("pool_passwd");
        std::fs::write(&passwd, format!("{APP_USER}:TEXT{APP_PASSWORD}\n"))?;
        std::fs::set_permissions(&passwd, std::fs::Permissions::from_mode(0o600))?;
        // No PCP users: nothing here uses PCP, but pgpool wants the file.
        let pcp = dir.join("pcp.conf");
        std::fs::write(&pcp, "# no PCP users\n")?;
        // Created by us, written by pgpool through the inherited descriptors.
        let log = std::fs::File::create(dir.join("pgpool.log"))?;
        let mut cmd = if is_root() {
            // Like PostgreSQL and PgBouncer in this bench: not as root.
            daemon::chown_to_postgres(&dir)?;
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", PGPOOL]);
            c
        } else {
            Command::new(PGPOOL)
        };
        // -n: stay in the foreground, so `child` is (or runs) the main
        // process; -D: no pgpool_status from an earlier run (there is none in
        // a fresh dir, but a stale one would mark nodes down).
        cmd.arg("-n")
            .arg("-D")
            .arg("-f")
            .arg(&conf)
            .arg("-F")
            .arg(&pcp)
            .arg("-a")
            .arg(&hba)
            // Its own process group, so a stuck Pgpool-II and its children
            // can be killed together (and nothing else).
            .process_group(0)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd.spawn().map_err(|e| format!("spawning {PGPOOL}: {e}"))?;
        // From here, an early return drops `pgpool`, which stops it.
        let mut pgpool = Pgpool {
            addr: format!("127.0.0.1:{port}"),
            dir,
            child: Mutex::new(child),
            watchdog: None,
        };
        pgpool.watchdog = Some(pgpool.spawn_watchdog()?);
        let deadline = Instant::now() + START_TIMEOUT;
        while !wait_for_tcp(&pgpool.addr, Duration::from_millis(100)) {
            pgpool.check_alive()?;
            if Instant::now() >= deadline {
                return Err(format!(
                    "Pgpool-II not listening on {} after {} s{}",
                    pgpool.addr,
                    START_TIMEOUT.as_secs(),
                    pgpool.log_tail()
                )
                .into());
            }
        }
        pgpool.wait_primary_found(deadline)?;
        Ok(pgpool)
    }

    /// Fails if Pgpool-II has exited.
    pub fn check_alive(&self) -> Result<()> {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        match child.try_wait()? {
            None => Ok(()),
            Some(status) => {
                Err(format!("Pgpool-II exited with {status}{}", self.log_tail()).into())
            }
        }
    }

    /// Waits until `SHOW pool_nodes` says node 0 is the primary, so writes go
    /// there (Pgpool-II finds it with `pg_is_in_recovery()` as `sr_check_user`
    /// and sends writes to whichever node that found).
    fn wait_primary_found(&self, deadline: Instant) -> Result<()> {
        loop {
            let nodes = self.pool_nodes();
            match &nodes {
                Ok(table) if primary_is_node_0(table) => return Ok(()),
                _ if Instant::now() < deadline => {
                    self.check_alive()?;
                    std::thread::sleep(Duration::from_millis(200));
                }
                Ok(table) => {
                    return Err(format!(
                        "Pgpool-II on {} did not find node 0 as the primary within {} s; \
                         SHOW pool_nodes:\n{table}{}",
                        self.addr,
                        START_TIMEOUT.as_secs(),
                        self.log_tail()
                    )
                    .into())
                }
                Err(e) => {
                    return Err(format!(
                        "SHOW pool_nodes through Pgpool-II on {}: {e}{}",
                        self.addr,
                        self.log_tail()
                    )
                    .into())
                }
            }
        }
    }

    /// `SHOW pool_nodes` as the app user: unaligned, `|`-separated, with the
    /// header line.
    fn pool_nodes(&self) -> Result<String> {
        let (host, port) = self.addr.rsplit_once(':').ok_or("address without port")?;
        let mut cmd = Command::new(pg_bin("psql"));
        for var in ["PGHOST", "PGHOSTADDR", "PGSERVICE", "PGOPTIONS"] {
            cmd.env_remove(var);
        }
        cmd.env("PGPASSWORD", APP_PASSWORD)
            .env("PGCONNECT_TIMEOUT", "5")
            .env("LC_MESSAGES", "C")
            .args([
                "-X", "-A", "-F", "|", "-h", host, "-p", port, "-U", APP_USER,
            ])
            .args(["-d", APP_DB, "-c", "SHOW pool_nodes"]);
        let (status, stdout, stderr) = run_bounded(cmd, "psql", Duration::from_secs(10))?;
        if !status.success() {
            return Err(format!("psql exited with {status}: {}", stderr.trim()).into());
        }
        Ok(stdout)
    }

    /// Polls for this process; once it is gone, stops Pgpool-II like
    /// [`Drop`] does and removes its dir.
    fn spawn_watchdog(&self) -> Result<Child> {
        let pgid = self.child.lock().unwrap_or_else(|p| p.into_inner()).id();
        let script = format!(
            "while [ -d /proc/{me} ]; do sleep 1; done; \
             pid=$(tr -cd 0-9 < '{pidfile}' 2>/dev/null) && [ -n \"$pid\" ] && \
             kill -INT \"$pid\" 2>/dev/null; \
             i=0; while [ $i -lt {ticks} ] && kill -0 -{pgid} 2>/dev/null; \
             do sleep 0.1; i=$((i + 1)); done; \
             kill -0 -{pgid} 2>/dev/null && kill -KILL -{pgid}; rm -rf '{dir}'",
            me = std::process::id(),
            pidfile = self.pidfile().display(),
            ticks = STOP_TIMEOUT.as_millis() / 100,
            dir = self.dir.display()
        );
        daemon::spawn_watchdog(&script)
    }

    fn pidfile(&self) -> PathBuf {
        self.dir.join("pgpool.pid")
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("pgpool.log")).unwrap_or_default();
        format!("; log tail:\n{}", tail(&log, 20))
    }
}

impl Drop for Pgpool {
    fn drop(&mut self) {
        let pidfile = self.pidfile();
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        let pgid = child.id().to_string();
        // Killing runuser would leave Pgpool-II running: signal its main
        // process by the pid it wrote. SIGINT is its fast shutdown (what
        // `pgpool -m fast stop` sends): clients are disconnected, the
        // children stopped, the pid file removed.
        if matches!(child.try_wait(), Ok(None)) {
            if let Some(pid) = read_pid(&pidfile) {
                let _ = Command::new("kill")
                    .args(["-INT", &pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
        }
        daemon::wait_exit(child, STOP_TIMEOUT);
        // Still running (or it never wrote its pid): the group is ours and
        // only ours, children included.
        if matches!(child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{pgid}")])
                .stderr(Stdio::null())
                .status();
        }
        daemon::reap(child, self.watchdog.take(), &self.dir);
    }
}

/// The pid in Pgpool-II's pid file, which ends in a NUL byte, not a newline.
fn read_pid(pidfile: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(pidfile).ok()?;
    let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// `pgpool --version` as e.g. `pgpool-II 4.3.5`, or `unknown`.
pub fn pgpool_version() -> String {
    let Ok(out) = Command::new(PGPOOL).arg("--version").output() else {
        return "unknown".into();
    };
    // It prints `pgpool-II version 4.3.5 (tamahomeboshi)`, on stderr.
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    text.split_once("pgpool-II version ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .map_or_else(|| "unknown".into(), |v| format!("pgpool-II {v}"))
}

/// pgpool.conf: everything not set here is Pgpool-II 4.3's default.
fn config(
    dir: &Path,
    port: u16,
    pcp_port: u16,
    backends: &[&str],
    children: u32,
) -> Result<String> {
    let dir = dir.display();
    let mut out = format!(
        "# Streaming replication: writes go to the primary, reads are load\n\
         # balanced over every node, the primary included.\n\
         backend_clustering_mode = 'streaming_replication'\n\
         listen_addresses = '127.0.0.1'\n\
         port = {port}\n\
         socket_dir = '{dir}'\n\
         pcp_listen_addresses = '127.0.0.1'\n\
         pcp_port = {pcp_port}\n\
         pcp_socket_dir = '{dir}'\n\
         # One child serves one client at a time; connections beyond this\n\
         # many wait in the listen queue.\n\
         num_init_children = {children}\n\
         reserved_connections = 0\n\
         max_pool = {MAX_POOL}\n\
         connection_cache = on\n\
         enable_pool_hba = on\n\
         pool_passwd = '{dir}/pool_passwd'\n\
         load_balance_mode = on\n\
         # Choose a node per SELECT, not once per session: with a handful of\n\
         # long pgbench sessions a per-session pick leaves the nodes unevenly\n\
         # loaded; Fulcrum also routes each transaction on its own.\n\
         statement_level_load_balance = on\n\
         # Pgpool-II finds the primary by asking each node\n\
         # pg_is_in_recovery() as sr_check_user (even with the periodic\n\
         # check off), and routes writes to it; the password comes from\n\
         # pool_passwd. No replication-delay checks: Fulcrum's bench runs\n\
         # without a lag bound too.\n\
         sr_check_period = 0\n\
         sr_check_user = '{APP_USER}'\n\
         sr_check_password = ''\n\
         sr_check_database = '{APP_DB}'\n\
         # Nothing fails over: no health checks, no commands, a backend error\n\
         # fails the session instead of detaching the node.\n\
         health_check_period = 0\n\
         failover_command = ''\n\
         failback_command = ''\n\
         follow_primary_command = ''\n\
         failover_on_backend_error = off\n\
         auto_failback = off\n\
         use_watchdog = off\n\
         wd_ipc_socket_dir = '{dir}'\n\
         memory_cache_enabled = off\n\
         pid_file_name = '{dir}/pgpool.pid'\n\
         logdir = '{dir}'\n\
         log_destination = 'stderr'\n\
         logging_collector = off\n\
         log_min_messages = warning\n"
    );
    for (i, backend) in backends.iter().enumerate() {
        let (host, port) = backend
            .rsplit_once(':')
            .ok_or_else(|| format!("backend {backend}: expected host:port"))?;
        out.push_str(&format!(
            "backend_hostname{i} = '{host}'\n\
             backend_port{i} = {port}\n\
             # Equal weights: reads spread evenly over all nodes.\n\
             backend_weight{i} = 1\n\
             backend_flag{i} = 'DISALLOW_TO_FAILOVER'\n"
        ));
    }
    Ok(out)
}

/// Whether `SHOW pool_nodes` output (unaligned, `|`, with a header) has node
/// 0 in the `role` column as `primary`.
fn primary_is_node_0(table: &str) -> bool {
    let mut lines = table.lines();
    let Some(header) = lines.next() else {
        return false;
    };
    let columns: Vec<&str> = header.split('|').collect();
    let (Some(id), Some(role)) = (
        columns.iter().position(|c| *c == "node_id"),
        columns.iter().position(|c| *c == "role"),
    ) else {
        return false;
    };
    lines.any(|line| {
        let fields: Vec<&str> = line.split('|').collect();
        fields.get(id) == Some(&"0") && fields.get(role) == Some(&"primary")
    })
}
