//! A real etcd cluster for the coordination tests: `n` members of Debian's
//! etcd (3.4, v3 API) on free loopback ports, one directory each under a
//! temporary directory, started as one cluster; members can be killed and
//! started again on the same ports and data. Each member is reaped if the
//! test process dies first. [`EtcdCluster::start_tls`] adds a TLS client
//! port beside the plain one (the plain one serves the harness's own
//! calls), and [`EtcdCluster::enable_auth`] turns etcd's authentication on.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Result, TestkitError};
use crate::ports::free_port;
use crate::reaper::Reaper;

/// How long a start may take before it is an error.
const START_TIMEOUT: Duration = Duration::from_secs(30);

struct Member {
    name: String,
    dir: PathBuf,
    client: u16,
    /// The TLS client port (`start_tls`).
    tls_client: Option<u16>,
    peer: u16,
    child: Option<Child>,
    reaper: Option<Reaper>,
}

pub struct EtcdCluster {
    dir: PathBuf,
    members: Vec<Member>,
    keep: bool,
    /// The members' certificate and key, when they serve TLS.
    tls: Option<(PathBuf, PathBuf)>,
}

impl EtcdCluster {
    /// Starts `members` members as one cluster; returns once every one
    /// answers on its client port.
    pub fn start(members: usize) -> Result<EtcdCluster> {
        Self::start_with(members, None)
    }

    /// As [`start`](Self::start), each member also serving TLS with
    /// `certificate` and `key` on a port of its own
    /// ([`tls_endpoints`](Self::tls_endpoints)).
    pub fn start_tls(members: usize, certificate: &Path, key: &Path) -> Result<EtcdCluster> {
        Self::start_with(members, Some((certificate.to_owned(), key.to_owned())))
    }

    fn start_with(members: usize, tls: Option<(PathBuf, PathBuf)>) -> Result<EtcdCluster> {
        let keep = std::env::var(crate::KEEP_ENV).is_ok_and(|v| v == "1");
        let dir = crate::scratch::create("etcd", false)?;
        let members = (0..members)
            .map(|i| {
                let name = format!("etcd{i}");
                let dir = dir.join(&name);
                std::fs::create_dir_all(&dir).map_err(|source| TestkitError::Io {
                    context: format!("creating {}", dir.display()),
                    source,
                })?;
                Ok(Member {
                    name,
                    dir,
                    client: free_port(),
                    tls_client: tls.as_ref().map(|_| free_port()),
                    peer: free_port(),
                    child: None,
                    reaper: None,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut cluster = EtcdCluster {
            dir,
            members,
            keep,
            tls,
        };
        for i in 0..cluster.members.len() {
            cluster.spawn(i, "new")?;
        }
        for i in 0..cluster.members.len() {
            cluster.wait_ready(i)?;
        }
        Ok(cluster)
    }

    /// `127.0.0.1:PORT` of each member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client))
            .collect()
    }

    /// `127.0.0.1:PORT` of each member's TLS client URL (`start_tls`).
    pub fn tls_endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .filter_map(|m| Some(format!("127.0.0.1:{}", m.tls_client?)))
            .collect()
    }

    /// Turns etcd's authentication on, with `root` (password
    /// `root_password`) as its only user: from then on every call needs a
    /// token from `/v3/auth/authenticate`.
    pub fn enable_auth(&self, root_password: &str) -> Result<()> {
        let port = self.members[0].client;
        let password = root_password.replace('\\', "\\\\").replace('"', "\\\"");
        for (path, body) in [
            (
                "/v3/auth/user/add",
                format!("{{\"name\":\"root\",\"password\":\"{password}\"}}"),
            ),
            ("/v3/auth/role/add", "{\"name\":\"root\"}".to_owned()),
            (
                "/v3/auth/user/grant",
                "{\"user\":\"root\",\"role\":\"root\"}".to_owned(),
            ),
            ("/v3/auth/enable", "{}".to_owned()),
        ] {
            let answer = post(port, path, &body);
            if !answer.starts_with("HTTP/1.1 200") {
                return Err(TestkitError::Invalid(format!("etcd {path}: {answer}")));
            }
        }
        Ok(())
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, i: usize, state: &str) -> Result<()> {
        let initial = self.initial_cluster();
        let tls = self.tls.clone();
        let m = &mut self.members[i];
        let mut clients = format!("http://127.0.0.1:{}", m.client);
        let mut extra: Vec<String> = Vec::new();
        if let (Some((cert, key)), Some(port)) = (&tls, m.tls_client) {
            clients.push_str(&format!(",https://127.0.0.1:{port}"));
            extra.extend([
                "--cert-file".into(),
                cert.display().to_string(),
                "--key-file".into(),
                key.display().to_string(),
            ]);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(m.dir.join("etcd.log"))
            .map_err(|source| TestkitError::Io {
                context: format!("opening {}/etcd.log", m.dir.display()),
                source,
            })?;
        let err = log.try_clone().map_err(|source| TestkitError::Io {
            context: "etcd log".into(),
            source,
        })?;
        let child = Command::new(crate::tool("/usr/bin/etcd", "etcd-server"))
            .current_dir(&m.dir)
            .args([
                "--name",
                &m.name,
                "--data-dir",
                "data",
                "--listen-client-urls",
                &clients,
                "--advertise-client-urls",
                &clients,
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{}", m.peer),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{}", m.peer),
                "--initial-cluster",
                &initial,
                "--initial-cluster-state",
                state,
                "--initial-cluster-token",
                &format!("fulcrum-test-{}", std::process::id()),
                "--heartbeat-interval",
                "50",
                "--election-timeout",
                "500",
                "--log-level",
                "warn",
            ])
            .args(&extra)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|source| TestkitError::Io {
                context: "spawning etcd".into(),
                source,
            })?;
        m.reaper = Some(Reaper::for_process(&m.dir, child.id(), self.keep)?);
        m.child = Some(child);
        Ok(())
    }

    /// Waits until member `i` answers `GET /health` with its cluster healthy.
    fn wait_ready(&mut self, i: usize) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        let m = &mut self.members[i];
        loop {
            if health(m.client) {
                return Ok(());
            }
            if let Some(status) = m.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                return Err(start_error(m, format!("exited with {status}")));
            }
            if Instant::now() > deadline {
                return Err(start_error(
                    m,
                    format!("not healthy after {START_TIMEOUT:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills member `i` (SIGKILL), keeping its data.
    pub fn kill_member(&mut self, i: usize) {
        let m = &mut self.members[i];
        if let Some(mut c) = m.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(r) = m.reaper.take() {
            r.disarm();
        }
    }

    /// Starts member `i` again on its ports and data; returns once the
    /// cluster answers through it (a quorum must be up).
    pub fn start_member(&mut self, i: usize) -> Result<()> {
        if self.members[i].child.is_none() {
            self.spawn(i, "existing")?;
        }
        self.wait_ready(i)
    }

    /// Kills every member, keeping their data.
    pub fn stop_all(&mut self) {
        for i in 0..self.members.len() {
            self.kill_member(i);
        }
    }

    /// Starts every stopped member again; returns once all answer.
    pub fn start_all(&mut self) -> Result<()> {
        for i in 0..self.members.len() {
            if self.members[i].child.is_none() {
                self.spawn(i, "existing")?;
            }
        }
        for i in 0..self.members.len() {
            self.wait_ready(i)?;
        }
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.stop_all();
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

/// One `POST` of a JSON body to the member's plain client port: the whole
/// answer, status line first (empty when it cannot be reached).
fn post(port: u16, path: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(req.as_bytes()).is_err() {
        return String::new();
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// `GET /health` says `"health":"true"` (the member sees a leader).
fn health(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req =
        format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.contains("\"health\":\"true\"")
}

fn start_error(m: &Member, reason: String) -> TestkitError {
    let log = m.dir.join("etcd.log");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(20).collect();
    TestkitError::NodeStart {
        node: m.name.clone(),
        port: m.client,
        reason,
        log,
        log_tail: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
    }
}
