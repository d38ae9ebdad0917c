//! The Fulcrum daemon as a child process of a test: writes its config into a
//! temp dir, starts `fulcrum --config <file>` there with its output in
//! `fulcrum.log`, waits for its listeners, signals it, and SIGKILLs it on
//! `Drop` (or through the reaper if the test process dies first).
//!
//! The daemon's working directory is its temp dir; configs should use
//! absolute paths for anything they reference.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::{file_tail, Result, TestkitError};
use crate::pg_cluster::KEEP_ENV;
use crate::ports::wait_for_tcp;
use crate::reaper::Reaper;
use crate::scratch;

/// Overrides where the daemon binary is looked for.
pub const FULCRUM_BIN_ENV: &str = "FULCRUM_BIN";
/// How long [`FulcrumProcess::start`] waits for every listener.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The daemon binary: `$FULCRUM_BIN` if set, else `fulcrum` in the cargo
/// profile directory this test binary was built into (`target/<profile>/deps/x`
/// -> `target/<profile>/fulcrum`). `cargo test` does not build another
/// package's binary, so the first call in a process runs `cargo build -p
/// fulcrum` for the same profile (a no-op when it is up to date): tests never
/// run a stale daemon.
pub fn fulcrum_bin() -> PathBuf {
    if let Some(path) = std::env::var_os(FULCRUM_BIN_ENV) {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let profile_dir = exe
        .ancestors()
        .skip(1)
        .find(|d| {
            d.file_name()
                .is_some_and(|n| n != "deps" && n != "examples")
        })
        .unwrap_or(Path::new("."))
        .to_path_buf();
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| build_daemon(&profile_dir));
    profile_dir.join("fulcrum")
}

/// Runs the daemon binary once with `args` (a CLI command such as `check`
/// or `import`) and gives its exit status and output.
pub fn run_fulcrum(args: &[&std::ffi::OsStr]) -> std::process::Output {
    let bin = fulcrum_bin();
    assert!(
        bin.is_file(),
        "{} not found: run `cargo build -p fulcrum` first",
        bin.display()
    );
    Command::new(&bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()))
}

fn build_daemon(profile_dir: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut cmd = std::process::Command::new(cargo);
    cmd.current_dir(&workspace)
        .args(["build", "--quiet", "-p", "fulcrum", "--bin", "fulcrum"]);
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(other) => {
            cmd.args(["--profile", other]);
        }
    }
    match cmd.status() {
        Ok(s) if s.success() => {}
        Ok(s) => {
            panic!("`cargo build -p fulcrum` failed ({s}); fix the build or set {FULCRUM_BIN_ENV}")
        }
        Err(e) => eprintln!(
            "fulcrum-testkit: could not run cargo to build the daemon ({e}); using what is in {}",
            profile_dir.display()
        ),
    }
}

/// Signals a test may send to the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Hup,
    Int,
    Quit,
    Term,
    Kill,
    Usr1,
    Usr2,
    /// Freezes the process (SIGSTOP), as a stalled VM or a long GC pause would.
    Stop,
    /// Resumes a frozen process (SIGCONT).
    Cont,
}

impl Signal {
    fn number(self) -> libc::c_int {
        match self {
            Signal::Hup => libc::SIGHUP,
            Signal::Int => libc::SIGINT,
            Signal::Quit => libc::SIGQUIT,
            Signal::Term => libc::SIGTERM,
            Signal::Kill => libc::SIGKILL,
            Signal::Usr1 => libc::SIGUSR1,
            Signal::Usr2 => libc::SIGUSR2,
            Signal::Stop => libc::SIGSTOP,
            Signal::Cont => libc::SIGCONT,
        }
    }
}

/// Every `listen = "ADDR"` value in a config, read line by line (no TOML
/// parser: the harness must not depend on the config crate it tests).
pub fn listen_addrs(config_toml: &str) -> Vec<String> {
    config_toml
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let rest = line.strip_prefix("listen")?.trim_start();
            let rest = rest.strip_prefix('=')?.trim_start();
            let rest = rest.strip_prefix('"')?;
            Some(rest[..rest.find('"')?].to_string())
        })
        .collect()
}

/// A running (or exited) daemon. `Sync`: may live in a `static`.
#[derive(Debug)]
pub struct FulcrumProcess {
    child: Mutex<Child>,
    pid: u32,
    bin: PathBuf,
    dir: PathBuf,
    config_path: PathBuf,
    log_path: PathBuf,
    listen: Vec<String>,
    reaper: Option<Reaper>,
    keep: bool,
}

impl FulcrumProcess {
    /// Spawns the daemon with `config_toml` and waits (up to 10 s) until every
    /// `listen` address in it accepts TCP connections.
    pub fn start(config_toml: &str) -> Result<FulcrumProcess> {
        if listen_addrs(config_toml).is_empty() {
            return Err(TestkitError::Invalid(
                "no `listen = \"ADDR\"` line in the config, so nothing to wait for; \
                 use FulcrumProcess::spawn to start without waiting"
                    .into(),
            ));
        }
        let process = Self::spawn(config_toml)?;
        process.wait_listening(START_TIMEOUT)?;
        Ok(process)
    }

    /// Spawns the daemon without waiting for it: for tests that expect it to
    /// refuse a config and exit (see [`FulcrumProcess::wait_exit`]).
    pub fn spawn(config_toml: &str) -> Result<FulcrumProcess> {
        Self::spawn_with(&fulcrum_bin(), config_toml, &[])
    }

    /// Like [`FulcrumProcess::spawn`] with an explicit binary and extra
    /// arguments after `--config <file>`.
    pub fn spawn_with(
        bin: &Path,
        config_toml: &str,
        extra_args: &[&str],
    ) -> Result<FulcrumProcess> {
        if !bin.is_file() {
            return Err(TestkitError::BinaryNotFound {
                name: "fulcrum".into(),
                searched: bin.display().to_string(),
                hint: format!(
                    "run `cargo build -p fulcrum` (with the same profile as the tests) or set \
                     {FULCRUM_BIN_ENV}"
                ),
            });
        }
        let keep = std::env::var(KEEP_ENV).is_ok_and(|v| v == "1");
        let dir = scratch::create("proc", false)?;
        let config_path = dir.join("fulcrum.toml");
        let log_path = dir.join("fulcrum.log");
        let cleanup_on_err = |e: TestkitError| {
            let _ = std::fs::remove_dir_all(&dir);
            e
        };
        std::fs::write(&config_path, config_toml)
            .map_err(|e| TestkitError::io(format!("writing {}", config_path.display()), e))
            .map_err(cleanup_on_err)?;
        let log = File::create(&log_path)
            .and_then(|f| Ok((f.try_clone()?, f)))
            .map_err(|e| TestkitError::io(format!("creating {}", log_path.display()), e))
            .map_err(cleanup_on_err)?;
        let mut cmd = Command::new(bin);
        cmd.arg("--config")
            .arg(&config_path)
            .args(extra_args)
            .current_dir(&dir)
            .env("RUST_BACKTRACE", "1")
            // Plain log lines, so tests can search them (tracing honours NO_COLOR).
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.0)
            .stderr(log.1);
        let child = spawn_retrying_busy(&mut cmd)
            .map_err(|e| TestkitError::io(format!("spawning {}", bin.display()), e))
            .map_err(cleanup_on_err)?;
        let pid = child.id();
        let mut process = FulcrumProcess {
            child: Mutex::new(child),
            pid,
            bin: bin.to_path_buf(),
            dir,
            config_path,
            log_path,
            listen: listen_addrs(config_toml),
            reaper: None,
            keep,
        };
        // If this fails, dropping `process` kills the daemon.
        process.reaper = Some(Reaper::for_process(&process.dir, pid, keep)?);
        Ok(process)
    }

    /// Waits until every `listen` address accepts TCP, failing early with the
    /// log if the daemon exits.
    pub fn wait_listening(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        for addr in &self.listen {
            loop {
                if let Some(status) = self.try_wait() {
                    return Err(self.start_error(format!("exited with {status} before listening")));
                }
                if wait_for_tcp(addr, Duration::from_millis(50)) {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(
                        self.start_error(format!("not listening on {addr} after {timeout:?}"))
                    );
                }
            }
        }
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The `listen` addresses found in the config.
    pub fn listen_addrs(&self) -> &[String] {
        &self.listen
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The daemon's temp dir (and working directory).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Everything the daemon printed so far (stdout and stderr).
    pub fn log_contents(&self) -> String {
        std::fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Polls the log until it contains `needle` (e.g. a reload message).
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.log_contents().contains(needle) {
            if Instant::now() >= deadline {
                return Err(TestkitError::Timeout {
                    what: format!("{needle:?} in {}", self.log_path.display()),
                    waited: timeout,
                    last: file_tail(&self.log_path, 10),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Sends `sig` to the daemon. Refused once it has exited and been reaped,
    /// so a recycled pid is never signalled.
    pub fn signal(&self, sig: Signal) -> Result<()> {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        if let Ok(Some(status)) = child.try_wait() {
            return Err(TestkitError::Invalid(format!(
                "cannot send {sig:?} to fulcrum (pid {}): it already exited with {status}",
                self.pid
            )));
        }
        // SAFETY: kill has no memory-safety preconditions; the pid is our
        // unreaped child (we hold the lock), so it cannot have been recycled.
        let rc = unsafe { libc::kill(self.pid as libc::pid_t, sig.number()) };
        if rc == 0 {
            Ok(())
        } else {
            Err(TestkitError::io(
                format!("kill -{sig:?} {}", self.pid),
                std::io::Error::last_os_error(),
            ))
        }
    }

    /// The exit status if the daemon exits within `timeout`.
    pub fn wait_exit(&self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The exit status if the daemon has exited, without waiting.
    pub fn try_wait(&self) -> Option<ExitStatus> {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        child.try_wait().ok().flatten()
    }

    fn start_error(&self, reason: String) -> TestkitError {
        TestkitError::FulcrumStart {
            bin: self.bin.clone(),
            reason,
            log: self.log_path.clone(),
            log_tail: file_tail(&self.log_path, 30),
        }
    }
}

/// Spawns, retrying on ETXTBSY: a binary written just before (a fresh build,
/// a test's stand-in script) can still be open for writing in a child that
/// another thread forked and that has not yet reached exec.
fn spawn_retrying_busy(cmd: &mut Command) -> std::io::Result<Child> {
    let mut attempts = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempts < 50 => {
                attempts += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

impl Drop for FulcrumProcess {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        // kill() on an already-reaped child is a no-op in std, never a stray signal.
        let _ = child.kill();
        let _ = child.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- fulcrum log ({}) tail ---\n{}",
                self.log_path.display(),
                file_tail(&self.log_path, 40)
            );
        }
        if self.keep {
            eprintln!(
                "fulcrum-testkit: kept {} ({KEEP_ENV}=1)",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        if let Some(reaper) = self.reaper.take() {
            reaper.disarm();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_lines_are_found_and_others_ignored() {
        let config = r#"
[fulcrum]
admin = "127.0.0.1:7000"
log = "info"

[[cluster]]
name = "main"
listen = "127.0.0.1:6500"
  listen="127.0.0.1:6501"   # indented, no spaces
# listen = "127.0.0.1:1"
listen_backlog = "x"

[[cluster.backend]]
address = "127.0.0.1:5999"
"#;
        assert_eq!(listen_addrs(config), ["127.0.0.1:6500", "127.0.0.1:6501"]);
    }
}
