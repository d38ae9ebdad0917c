//! PgBouncer as a load-bench target: [`PgBouncer`] starts one in a private
//! temp dir in front of the primary, with the same pool settings as Fulcrum,
//! and stops it and removes the dir on drop (a watchdog shell does the same
//! if the bench dies without dropping it).

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fulcrum_testkit::{free_port, is_root, wait_for_tcp, APP_DB, APP_PASSWORD, APP_USER};

use crate::daemon;
use crate::process::tail;
use crate::{Result, POOL_SIZE};

pub(crate) const PGBOUNCER: &str = "/usr/sbin/pgbouncer";

/// A PgBouncer in a temp dir, in front of the primary with the same pool
/// settings as Fulcrum. Stopped (and its dir removed) on drop.
pub(crate) struct PgBouncer {
    pub(crate) addr: String,
    dir: PathBuf,
    /// PgBouncer itself, or `runuser` running it when we are root.
    child: Mutex<Child>,
    /// A shell that kills PgBouncer if this process dies without dropping us.
    watchdog: Option<Child>,
}

impl PgBouncer {
    /// PgBouncer in front of the primary on `pg_port`, accepting up to `max_clients` clients.
    pub(crate) fn start_with(pg_port: u16, max_clients: u32) -> Result<PgBouncer> {
        PgBouncer::start_configured(pg_port, max_clients, None)
    }

    /// As [`PgBouncer::start_with`]; with `tls`, clients must use TLS
    /// with that certificate and server connections use TLS (both `require`).
    pub(crate) fn start_configured(
        pg_port: u16,
        max_clients: u32,
        tls: Option<&fulcrum_testkit::TestCerts>,
    ) -> Result<PgBouncer> {
        let dir =
            std::env::temp_dir().join(format!("fulcrum-bench-pgbouncer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let port = free_port();
        let ini = dir.join("pgbouncer.ini");
        let users = dir.join("userlist.txt");
        // Copied into the private dir, which PgBouncer's user owns.
        let tls_ini = match tls {
            None => String::new(),
            Some(certs) => {
                let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
                std::fs::copy(&certs.cert, &cert)?;
                std::fs::copy(&certs.key, &key)?;
                std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
                format!(
                    "client_tls_sslmode = require\nclient_tls_cert_file = {}\n\
                     client_tls_key_file = {}\nserver_tls_sslmode = require\n",
                    cert.display(),
                    key.display()
                )
            }
        };
        std::fs::write(
            &ini,
            format!(
                "[databases]\n{APP_DB} = host=127.0.0.1 port={pg_port} dbname={APP_DB}\n\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = scram-sha-256\nauth_file = {}\npool_mode = transaction\n\
                 default_pool_size = {POOL_SIZE}\nmax_client_conn = {max_clients}\n\
                 logfile = {}\npidfile = {}\n{tls_ini}",
                users.display(),
                dir.join("pgbouncer.log").display(),
                dir.join("pgbouncer.pid").display()
            ),
        )?;
        // A plain password: PgBouncer needs it to log in to PostgreSQL with SCRAM.
        std::fs::write(&users, format!("\"{APP_USER}\" \"{APP_PASSWORD}\"\n"))?;
        // PgBouncer refuses to run as root.
        let mut cmd = if is_root() {
            daemon::chown_to_postgres(&dir)?;
            // runuser's PAM session resets the soft descriptor limit to
            // 1,024: raise it again for thousands of clients.
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", "sh", "-c"])
                .arg(format!(
                    "ulimit -n {} 2>/dev/null; exec \"$0\" \"$@\"",
                    max_clients + 100
                ))
                .arg(PGBOUNCER);
            c
        } else {
            Command::new(PGBOUNCER)
        };
        let child = cmd
            .arg(&ini)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawning {PGBOUNCER}: {e}"))?;
        // From here, an early return drops `bouncer`, which stops it.
        let mut bouncer = PgBouncer {
            addr: format!("127.0.0.1:{port}"),
            dir,
            child: Mutex::new(child),
            watchdog: None,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !wait_for_tcp(&bouncer.addr, Duration::from_millis(100)) {
            bouncer.check_alive()?;
            if Instant::now() >= deadline {
                return Err(format!(
                    "PgBouncer not listening on {} after 10 s{}",
                    bouncer.addr,
                    bouncer.log_tail()
                )
                .into());
            }
        }
        // Polls for this process; once it is gone, stops PgBouncer and removes its dir.
        let script = format!(
            "while [ -d /proc/{me} ]; do sleep 1; done; \
             pid=$(cat '{pidfile}' 2>/dev/null) && kill \"$pid\" 2>/dev/null; \
             i=0; while [ $i -lt 50 ] && [ -n \"$pid\" ] && kill -0 \"$pid\" 2>/dev/null; \
             do sleep 0.1; i=$((i + 1)); done; rm -rf '{dir}'",
            me = std::process::id(),
            pidfile = bouncer.pidfile().display(),
            dir = bouncer.dir.display()
        );
        bouncer.watchdog = Some(daemon::spawn_watchdog(&script)?);
        Ok(bouncer)
    }

    fn pidfile(&self) -> PathBuf {
        self.dir.join("pgbouncer.pid")
    }

    /// PgBouncer's own pid (from its pidfile), for its CPU figures.
    pub(crate) fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.pidfile())
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    pub(crate) fn check_alive(&self) -> Result<()> {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        match child.try_wait()? {
            None => Ok(()),
            Some(status) => {
                Err(format!("PgBouncer exited with {status}{}", self.log_tail()).into())
            }
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default();
        format!("; log tail:\n{}", tail(&log, 20))
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let pidfile = self.pidfile();
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        // Killing runuser would leave PgBouncer running: signal PgBouncer by
        // the pid it wrote (SIGTERM is its immediate shutdown). The pidfile is
        // removed when it exits, so a stale pid is not signalled.
        if matches!(child.try_wait(), Ok(None)) {
            if let Ok(pid) = std::fs::read_to_string(&pidfile) {
                let _ = Command::new("kill")
                    .args(["-TERM", pid.trim()])
                    .stderr(Stdio::null())
                    .status();
            }
        }
        daemon::wait_exit(child, Duration::from_secs(5));
        daemon::reap(child, self.watchdog.take(), &self.dir);
    }
}
