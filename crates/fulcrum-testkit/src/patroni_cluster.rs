//! A real Patroni-managed PostgreSQL 15 cluster for the `topology =
//! "patroni"` tests: `n` Patroni members (Debian's patroni 3.0, its etcd3
//! store an [`EtcdCluster`]), each with its own REST and PostgreSQL port on
//! loopback and its data directory under one temporary directory; the
//! testkit's `app` role and database are created at bootstrap. Patroni and
//! its servers run as `postgres` when the tests run as root, and are reaped
//! if the test process dies first. [`PatroniCluster::start_secure`] serves
//! the REST API over TLS with basic authentication (the kit then talks to
//! it with curl).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Result, TestkitError};
use crate::ports::free_port;
use crate::process::{is_root, pg_bin, postgres_ids};
use crate::reaper::Reaper;
use crate::roles::{APP_DB, APP_PASSWORD, APP_USER, SUPERUSER};
use crate::EtcdCluster;

/// How long the whole cluster may take to bootstrap.
const START_TIMEOUT: Duration = Duration::from_secs(120);

struct Member {
    name: String,
    /// Patroni's working directory (its config and log).
    home: PathBuf,
    /// The PostgreSQL data directory (a direct child of the cluster's
    /// directory, so the cluster reaper finds its `postmaster.pid`).
    data: PathBuf,
    pg_port: u16,
    api_port: u16,
    child: Option<Child>,
    reaper: Option<Reaper>,
}

/// The REST API over TLS (`restapi.certfile`, `keyfile`) with basic
/// authentication on its unsafe endpoints (`restapi.authentication`).
struct Secure {
    ca: PathBuf,
    user: String,
    password: String,
}

pub struct PatroniCluster {
    dir: PathBuf,
    members: Vec<Member>,
    secure: Option<Secure>,
    _reaper: Reaper,
    keep: bool,
}

impl PatroniCluster {
    /// Starts `n` members on `etcd`; returns once one is the running
    /// leader, every other one streams from it, and the `app` role and
    /// database exist.
    pub fn start(etcd: &EtcdCluster, n: usize) -> Result<PatroniCluster> {
        PatroniCluster::start_with(etcd, n, None)
    }

    /// As [`PatroniCluster::start`], with every member's REST API on
    /// `https://` (the server certificate of `certs`, for `127.0.0.1`) and
    /// `user` / `password` guarding its unsafe endpoints.
    pub fn start_secure(
        etcd: &EtcdCluster,
        n: usize,
        certs: &crate::TestCerts,
        user: &str,
        password: &str,
    ) -> Result<PatroniCluster> {
        let secure = Secure {
            ca: certs.ca.clone(),
            user: user.to_owned(),
            password: password.to_owned(),
        };
        PatroniCluster::start_with(etcd, n, Some((secure, certs)))
    }

    fn start_with(
        etcd: &EtcdCluster,
        n: usize,
        secure: Option<(Secure, &crate::TestCerts)>,
    ) -> Result<PatroniCluster> {
        let keep = std::env::var(crate::KEEP_ENV).is_ok_and(|v| v == "1");
        let dir = crate::scratch::create("patroni", true)?;
        let reaper = Reaper::for_cluster(&dir, keep)?;
        let scope = dir
            .file_name()
            .map_or_else(|| "fulcrum".into(), |n| n.to_string_lossy().into_owned());
        let bootstrap = dir.join("post_bootstrap.sh");
        write(
            &bootstrap,
            &format!(
                "#!/bin/sh\nset -e\npsql -X -v ON_ERROR_STOP=1 \"$1\" <<'SQL'\n\
                 SET password_encryption = 'scram-sha-256';\n\
                 CREATE ROLE {APP_USER} LOGIN PASSWORD '{APP_PASSWORD}';\n\
                 CREATE DATABASE {APP_DB} OWNER {APP_USER};\nSQL\n"
            ),
        )?;
        std::fs::set_permissions(&bootstrap, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| TestkitError::io("chmod post_bootstrap.sh", e))?;
        let hosts = etcd.endpoints().join(",");
        // Copied into the cluster's directory, which is Patroni's (postgres).
        let restapi_tls = match &secure {
            None => String::new(),
            Some((s, certs)) => {
                let (cert, key) = (dir.join("restapi-cert.pem"), dir.join("restapi-key.pem"));
                // Patroni's own calls to the other members (the candidate's
                // health at a switchover) verify them against `cafile`.
                let ca = dir.join("restapi-ca.pem");
                std::fs::copy(&certs.ca, &ca).map_err(|e| TestkitError::io("restapi ca", e))?;
                std::fs::copy(&certs.cert, &cert)
                    .map_err(|e| TestkitError::io("restapi cert", e))?;
                std::fs::copy(&certs.key, &key).map_err(|e| TestkitError::io("restapi key", e))?;
                std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
                    .map_err(|e| TestkitError::io("chmod restapi key", e))?;
                format!(
                    "  certfile: {}\n  keyfile: {}\n  cafile: {}\n  authentication:\n    username: {}\n    password: {}\n",
                    cert.display(),
                    key.display(),
                    ca.display(),
                    s.user,
                    s.password
                )
            }
        };
        let mut members = Vec::new();
        for i in 0..n {
            let name = format!("pg{i}");
            let home = dir.join(format!("patroni{i}"));
            std::fs::create_dir_all(&home).map_err(|e| TestkitError::io("patroni home", e))?;
            let (pg_port, api_port) = (free_port(), free_port());
            let data = dir.join(&name);
            let config = format!(
                "scope: {scope}\nname: {name}\nnamespace: /patroni-test/\n\
                 log:\n  level: INFO\n  dir: {home}\n\
                 restapi:\n  listen: 127.0.0.1:{api_port}\n  connect_address: 127.0.0.1:{api_port}\n{restapi_tls}\
                 etcd3:\n  hosts: {hosts}\n\
                 bootstrap:\n  dcs:\n    ttl: 20\n    loop_wait: 1\n    retry_timeout: 5\n    maximum_lag_on_failover: 67108864\n\
                 \x20   postgresql:\n      use_pg_rewind: true\n      use_slots: true\n      parameters:\n\
                 \x20       wal_log_hints: 'on'\n        wal_retrieve_retry_interval: 100ms\n        max_connections: 100\n        max_wal_senders: 10\n\
                 \x20 initdb:\n  - encoding: UTF8\n  - auth-local: trust\n  - auth-host: scram-sha-256\n\
                 \x20 post_bootstrap: {bootstrap}\n\
                 postgresql:\n  listen: 127.0.0.1:{pg_port}\n  connect_address: 127.0.0.1:{pg_port}\n\
                 \x20 data_dir: {data}\n  bin_dir: {bin}\n  pgpass: {home}/pgpass\n  use_unix_socket: true\n\
                 \x20 authentication:\n    superuser:\n      username: {SUPERUSER}\n      password: postgres\n\
                 \x20   replication:\n      username: replicator\n      password: replicator\n\
                 \x20   rewind:\n      username: {SUPERUSER}\n      password: postgres\n\
                 \x20 pg_hba:\n  - local all all trust\n  - host replication replicator 127.0.0.1/32 trust\n\
                 \x20 - host all {SUPERUSER} 127.0.0.1/32 trust\n  - host all all 127.0.0.1/32 scram-sha-256\n\
                 \x20 basebackup:\n    - checkpoint: fast\n\
                 \x20 parameters:\n    unix_socket_directories: '{home}'\n\
                 \x20 remove_data_directory_on_rewind_failure: true\n  remove_data_directory_on_diverged_timelines: true\n",
                home = home.display(),
                data = data.display(),
                bootstrap = bootstrap.display(),
                bin = pg_bin("postgres").parent().unwrap_or(Path::new("/")).display(),
            );
            write(&home.join("patroni.yml"), &config)?;
            members.push(Member {
                name,
                home,
                data,
                pg_port,
                api_port,
                child: None,
                reaper: None,
            });
        }
        if is_root() {
            let (uid, gid) = postgres_ids()?;
            chown_tree(&dir, uid, gid)?;
        }
        let mut cluster = PatroniCluster {
            dir,
            members,
            secure: secure.map(|(s, _)| s),
            _reaper: reaper,
            keep,
        };
        // The first member bootstraps; the others clone from it.
        cluster.spawn(0)?;
        cluster.wait(START_TIMEOUT, "member pg0 to lead", |c| {
            c.leader() == Some(0)
        })?;
        for i in 1..n {
            cluster.spawn(i)?;
        }
        // `GET /cluster` shows a replica `running` with lag 0 as soon as it
        // has replayed its base backup, before it streams (its slot may not
        // exist yet); a switchover then would promote it without the
        // leader's latest commits. The leader's walsenders are the proof
        // (not the one of a base backup still being taken).
        let streaming = (n - 1).to_string();
        cluster.wait(START_TIMEOUT, "every replica to stream", |c| {
            c.psql(
                0,
                "SELECT count(*) FROM pg_stat_replication \
                 WHERE state = 'streaming' AND application_name <> 'pg_basebackup'",
            )
            .is_ok_and(|count| count == streaming)
        })?;
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> Result<()> {
        let m = &mut self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(m.home.join("patroni.out"))
            .map_err(|e| TestkitError::io("patroni.out", e))?;
        let err = log
            .try_clone()
            .map_err(|e| TestkitError::io("patroni.out", e))?;
        let mut cmd = Command::new(crate::tool("/usr/bin/patroni", "patroni"));
        cmd.arg(m.home.join("patroni.yml"))
            .current_dir(&m.home)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .env(
                "PATH",
                format!(
                    "{}:/usr/bin:/bin",
                    pg_bin("psql")
                        .parent()
                        .unwrap_or(Path::new("/usr/bin"))
                        .display()
                ),
            )
            .env("HOME", &m.home);
        for var in [
            "PGHOST",
            "PGPORT",
            "PGUSER",
            "PGDATABASE",
            "PGPASSWORD",
            "PGSERVICE",
        ] {
            cmd.env_remove(var);
        }
        if is_root() {
            let (uid, gid) = postgres_ids()?;
            cmd.uid(uid).gid(gid);
        }
        let child = cmd
            .spawn()
            .map_err(|e| TestkitError::io("spawning patroni", e))?;
        m.reaper = Some(Reaper::for_process(&m.home, child.id(), self.keep)?);
        m.child = Some(child);
        Ok(())
    }

    fn wait(
        &self,
        timeout: Duration,
        what: &str,
        cond: impl Fn(&PatroniCluster) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while !cond(self) {
            if Instant::now() > deadline {
                let mut tail = String::new();
                for m in &self.members {
                    let text =
                        std::fs::read_to_string(m.home.join("patroni.out")).unwrap_or_default();
                    let lines: Vec<&str> = text.lines().rev().take(15).collect();
                    tail.push_str(&format!(
                        "--- {} ---\n{}\n",
                        m.name,
                        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
                    ));
                }
                return Err(TestkitError::Invalid(format!(
                    "patroni: timed out after {timeout:?} waiting for {what}; GET /cluster: {:?}\n{tail}",
                    self.cluster_json()
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    /// `http://127.0.0.1:PORT` (`https://` when started secure) of each
    /// member's REST API.
    pub fn api_endpoints(&self) -> Vec<String> {
        let scheme = if self.secure.is_some() {
            "https"
        } else {
            "http"
        };
        self.members
            .iter()
            .map(|m| format!("{scheme}://127.0.0.1:{}", m.api_port))
            .collect()
    }

    /// One exchange with a member's REST API: status and body.
    fn api(
        &self,
        port: u16,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Option<(u16, String)> {
        match &self.secure {
            None => http(port, method, path, body),
            Some(s) => curl(s, port, method, path, body),
        }
    }

    /// `127.0.0.1:PORT` of each member's PostgreSQL, in member order.
    pub fn pg_addresses(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.pg_port))
            .collect()
    }

    /// `GET /cluster` from the first member that answers.
    fn cluster_json(&self) -> Option<String> {
        self.members
            .iter()
            .filter(|m| m.child.is_some())
            .find_map(|m| {
                self.api(m.api_port, "GET", "/cluster", None)
                    .filter(|(s, _)| *s == 200)
                    .map(|(_, b)| b)
            })
    }

    /// The member Patroni names leader, while it is running.
    pub fn leader(&self) -> Option<usize> {
        let json = self.cluster_json()?;
        for member in json.split('{').skip(2) {
            let field = |k: &str| {
                member
                    .split(&format!("\"{k}\": "))
                    .nth(1)
                    .or_else(|| member.split(&format!("\"{k}\":")).nth(1))
                    .map(|v| {
                        v.trim_start()
                            .trim_start_matches('"')
                            .split(['"', ',', '}'])
                            .next()
                            .unwrap_or("")
                            .to_owned()
                    })
            };
            if field("role").as_deref() == Some("leader")
                && field("state").as_deref() == Some("running")
            {
                let name = field("name")?;
                return self.members.iter().position(|m| m.name == name);
            }
        }
        None
    }

    /// A planned switchover to `candidate` through the REST API; returns
    /// once it is the running leader.
    pub fn switchover(&self, candidate: usize, timeout: Duration) -> Result<()> {
        let leader = self
            .leader()
            .ok_or_else(|| TestkitError::Invalid("patroni: no leader".into()))?;
        let body = format!(
            "{{\"leader\":\"{}\",\"candidate\":\"{}\"}}",
            self.members[leader].name, self.members[candidate].name
        );
        let (status, text) = self
            .api(
                self.members[leader].api_port,
                "POST",
                "/switchover",
                Some(&body),
            )
            .ok_or_else(|| TestkitError::Invalid("patroni: /switchover did not answer".into()))?;
        if status != 200 {
            return Err(TestkitError::Invalid(format!(
                "patroni: /switchover: HTTP {status}: {text}"
            )));
        }
        self.wait(timeout, "the switchover's candidate to lead", |c| {
            c.leader() == Some(candidate)
        })
    }

    /// SIGKILLs member `i`'s Patroni and its postmaster (a crashed node).
    pub fn kill_member(&mut self, i: usize) {
        let m = &mut self.members[i];
        if let Some(mut c) = m.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(r) = m.reaper.take() {
            r.disarm();
        }
        // Patroni starts PostgreSQL from a helper in a session of its own
        // (setsid), which may still be launching a postmaster after Patroni
        // is gone, before any postmaster.pid exists. Kill whatever runs in
        // Patroni's directory (the helper) or the data directory (the
        // postmaster and its children) until nothing does.
        let deadline = Instant::now() + Duration::from_secs(5);
        while kill_running_in(&[&m.home, &m.data]) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until a member other than `not` is the running leader.
    pub fn wait_new_leader(&self, not: usize, timeout: Duration) -> Result<usize> {
        self.wait(timeout, "a new leader", |c| {
            c.leader().is_some_and(|l| l != not)
        })?;
        self.leader()
            .ok_or_else(|| TestkitError::Invalid("patroni: leader lost again".into()))
    }

    /// Runs `sql` on member `i`'s database `app` as the superuser; stdout.
    pub fn psql(&self, i: usize, sql: &str) -> Result<String> {
        crate::run_psql(
            &format!("127.0.0.1:{}", self.members[i].pg_port),
            SUPERUSER,
            "",
            APP_DB,
            sql,
        )
    }
}

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill_member(i);
        }
        if self.keep {
            eprintln!(
                "fulcrum-testkit: kept {} ({}=1)",
                self.dir.display(),
                crate::KEEP_ENV
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// SIGKILLs every process whose working directory is one of `dirs`;
/// whether there was any. A zombie has no readable cwd, so a killed
/// process stops counting at once.
fn kill_running_in(dirs: &[&Path]) -> bool {
    let mut found = false;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(cwd) = std::fs::read_link(entry.path().join("cwd")) else {
            continue;
        };
        if dirs.iter().any(|d| cwd == *d) {
            found = true;
            // SAFETY: kill(2) has no memory preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    found
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text)
        .map_err(|e| TestkitError::io(format!("writing {}", path.display()), e))
}

fn chown_tree(dir: &Path, uid: u32, gid: u32) -> Result<()> {
    std::os::unix::fs::chown(dir, Some(uid), Some(gid))
        .map_err(|e| TestkitError::io("chown", e))?;
    for entry in std::fs::read_dir(dir).map_err(|e| TestkitError::io("read_dir", e))? {
        let path = entry.map_err(|e| TestkitError::io("read_dir", e))?.path();
        if path.is_dir() {
            chown_tree(&path, uid, gid)?;
        } else {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                .map_err(|e| TestkitError::io("chown", e))?;
        }
    }
    Ok(())
}

/// One HTTP/1.1 exchange with a member's REST API: status and body.
fn http(port: u16, method: &str, path: &str, body: Option<&str>) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    Some((status, body))
}

/// [`http`] over TLS with basic authentication, by curl.
fn curl(
    s: &Secure,
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Option<(u16, String)> {
    let mut cmd = Command::new(crate::tool("/usr/bin/curl", "curl"));
    cmd.args(["-sS", "--max-time", "60", "--cacert"])
        .arg(&s.ca)
        .args(["-u", &format!("{}:{}", s.user, s.password)])
        .args(["-X", method, "-H", "Content-Type: application/json"])
        .args(["-w", "\n%{http_code}"]);
    if let Some(body) = body {
        cmd.args(["--data-binary", body]);
    }
    let out = cmd
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, status) = text.rsplit_once('\n')?;
    let status: u16 = status.trim().parse().ok()?;
    (status != 0).then(|| (status, body.to_owned()))
}
