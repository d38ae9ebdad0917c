//! A plain TCP relay in front of one server: the control target of the
//! capped scale-out runs. It copies bytes both ways and understands nothing,
//! so whatever it costs the server is what any proxy's extra hop costs, and
//! Fulcrum's own share is the difference between the two rows. Two relays:
//! `socat` (a process per connection) and HAProxy in TCP mode (one
//! event-driven thread, as a production relay runs).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Result;

/// Where Debian's `socat` package puts the binary (`.ci/run` installs it).
const SOCAT: &str = "/usr/bin/socat";
/// Where Debian's `haproxy` package puts the binary (`.ci/run` installs it).
const HAPROXY: &str = "/usr/sbin/haproxy";

/// Which relay program (`--relay`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayKind {
    /// `socat TCP-LISTEN:...,fork`: one process per connection, each
    /// copying with its own read/write pair.
    Socat,
    /// HAProxy 2.x `mode tcp`, one thread (`nbthread 1`), TCP_NODELAY on
    /// both sides (its default): an event loop, as Fulcrum's own worker is.
    Haproxy,
}

impl RelayKind {
    /// `socat` or `haproxy`, as `--relay` takes it.
    pub fn parse(s: &str) -> Option<RelayKind> {
        match s {
            "socat" => Some(RelayKind::Socat),
            "haproxy" => Some(RelayKind::Haproxy),
            _ => None,
        }
    }

    /// The program's name, for reports.
    pub fn name(self) -> &'static str {
        match self {
            RelayKind::Socat => "socat",
            RelayKind::Haproxy => "haproxy",
        }
    }

    /// What the relay is, one sentence for the report.
    pub fn describe(self) -> &'static str {
        match self {
            RelayKind::Socat => {
                "`socat` copying bytes between the client and the primary (TCP_NODELAY \
                 both sides), one process per connection and no parsing"
            }
            RelayKind::Haproxy => {
                "HAProxy in TCP mode copying bytes between the client and the primary \
                 (one thread, TCP_NODELAY both sides), no parsing"
            }
        }
    }

    fn binary(self) -> &'static str {
        match self {
            RelayKind::Socat => SOCAT,
            RelayKind::Haproxy => HAPROXY,
        }
    }
}

/// A running relay; dropping it stops the relay and every connection it
/// forked. Its shell also stops it once the bench process is gone, so a
/// killed bench leaves no listener behind.
pub struct TcpRelay {
    /// The shell leading the relay's process group.
    group: Child,
    /// HAProxy's configuration file, removed on drop.
    config: Option<PathBuf>,
    /// `127.0.0.1:PORT` to connect to.
    pub addr: String,
    pub kind: RelayKind,
}

impl TcpRelay {
    /// Relays `127.0.0.1:port` to `target` (`host:port`) with `kind`.
    ///
    /// socat listens with a backlog of 128: its default of 5 dropped the
    /// SYNs of sysbench's 16 threads connecting at once while it forked, and
    /// their retries (1 s, 3 s, 7 s, ...) sometimes outlasted sysbench's 30 s
    /// for its threads to start.
    pub fn start(kind: RelayKind, port: u16, target: &str) -> Result<TcpRelay> {
        let binary = kind.binary();
        if !std::path::Path::new(binary).exists() {
            return Err(format!(
                "{binary} not found: install Debian's {} (.ci/run does)",
                kind.name()
            )
            .into());
        }
        let mut config = None;
        let command = match kind {
            RelayKind::Socat => format!(
                "{binary} TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr,nodelay,backlog=128 \
                 TCP:{target},nodelay"
            ),
            RelayKind::Haproxy => {
                let path = std::env::temp_dir().join(format!(
                    "fulcrum-bench-haproxy-{}-{port}.cfg",
                    std::process::id()
                ));
                std::fs::write(&path, haproxy_config(port, target))
                    .map_err(|e| format!("writing {}: {e}", path.display()))?;
                let cmd = format!("{binary} -db -f {}", path.display());
                config = Some(path);
                cmd
            }
        };
        let bench = std::process::id();
        let script = format!(
            "{command} & relay=$!; \
             while kill -0 {bench} 2>/dev/null && kill -0 $relay 2>/dev/null; do sleep 1; done; \
             kill 0"
        );
        let group = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", kind.name()))?;
        let relay = TcpRelay {
            group,
            config,
            addr: format!("127.0.0.1:{port}"),
            kind,
        };
        relay.wait_listening(Duration::from_secs(10))?;
        Ok(relay)
    }

    /// Waits until the relay accepts connections.
    fn wait_listening(&self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(&self.addr).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!(
            "{} did not listen on {} within {within:?}",
            self.kind.name(),
            self.addr
        )
        .into())
    }
}

/// HAProxy's configuration: one TCP listener on loopback relaying to
/// `target`, one thread, no health checks, timeouts longer than any run.
fn haproxy_config(port: u16, target: &str) -> String {
    format!(
        "global\n    nbthread 1\n    maxconn 4096\n\
         defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 1h\n    timeout server 1h\n\
         listen relay\n    bind 127.0.0.1:{port}\n    server primary {target}\n"
    )
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        let group = format!("-{}", self.group.id());
        let _ = Command::new("kill")
            .args(["-TERM", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.group.wait();
        if let Some(path) = &self.config {
            let _ = std::fs::remove_file(path);
        }
    }
}
