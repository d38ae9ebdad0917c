//! A plain TCP relay (`socat`) in front of one server: the control target of
//! the capped MariaDB scale-out. It copies bytes both ways and understands
//! nothing, so whatever it costs the server is what any proxy's extra hop
//! costs, and Fulcrum's own share is the difference between the two rows.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Result;

/// Where Debian's `socat` package puts the binary (`.ci/run` installs it).
const SOCAT: &str = "/usr/bin/socat";

/// A running relay; dropping it stops the relay and every connection it
/// forked. Its shell also stops it once the bench process is gone, so a
/// killed bench leaves no listener behind.
pub struct TcpRelay {
    /// The shell leading the relay's process group.
    group: Child,
    /// `127.0.0.1:PORT` to connect to.
    pub addr: String,
}

impl TcpRelay {
    /// Relays `127.0.0.1:port` to `target` (`host:port`), with TCP_NODELAY
    /// on both sides as a proxy sets it, and a listen backlog of 128: socat's
    /// default of 5 dropped the SYNs of sysbench's 16 threads connecting at
    /// once while it forked, and their retries (1 s, 3 s, 7 s, ...) sometimes
    /// outlasted sysbench's 30 s for its threads to start.
    pub fn start(port: u16, target: &str) -> Result<TcpRelay> {
        if !std::path::Path::new(SOCAT).exists() {
            return Err(format!("{SOCAT} not found: install Debian's socat (.ci/run does)").into());
        }
        let bench = std::process::id();
        let script = format!(
            "{SOCAT} TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr,nodelay,backlog=128 \
             TCP:{target},nodelay & relay=$!; \
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
            .map_err(|e| format!("starting socat: {e}"))?;
        let relay = TcpRelay {
            group,
            addr: format!("127.0.0.1:{port}"),
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
        Err(format!("socat did not listen on {} within {within:?}", self.addr).into())
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        let group = format!("-{}", self.group.id());
        let _ = Command::new("kill")
            .args(["-TERM", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.group.wait();
    }
}
