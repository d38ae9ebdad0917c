//! What the pooler wrappers ([`crate::pgbouncer`], [`crate::pgpool`]) share
//! about running a daemon in a temp dir: handing the dir to `postgres` for
//! `runuser`, starting the watchdog shell that stops the daemon if the bench
//! dies, and stopping and reaping it on drop. The daemons' own commands,
//! signals and watchdog scripts stay with their wrappers.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Result;

/// `chown -R postgres:postgres dir`: the daemon runs as `postgres` (through
/// `runuser`) when we are root.
pub(crate) fn chown_to_postgres(dir: &Path) -> Result<()> {
    let status = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(dir)
        .status()?;
    if !status.success() {
        return Err(format!("chown -R postgres {} failed", dir.display()).into());
    }
    Ok(())
}

/// Starts the watchdog: `sh -c script`, with no stdin, stdout or stderr.
pub(crate) fn spawn_watchdog(script: &str) -> Result<Child> {
    Ok(Command::new("sh")
        .args(["-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?)
}

/// Waits up to `within` for `child` to exit.
pub(crate) fn wait_exit(child: &mut Child, within: Duration) {
    let deadline = Instant::now() + within;
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills and reaps `child` (if it is still running) and the `watchdog`,
/// then removes the daemon's `dir`.
pub(crate) fn reap(child: &mut Child, watchdog: Option<Child>, dir: &Path) {
    let _ = child.kill();
    let _ = child.wait();
    if let Some(mut watchdog) = watchdog {
        let _ = watchdog.kill();
        let _ = watchdog.wait();
    }
    let _ = std::fs::remove_dir_all(dir);
}
