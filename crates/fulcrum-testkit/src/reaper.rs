//! Cleans up after the test process even when `Drop` never runs: a panic that
//! aborts, a SIGKILL, or a `static` cluster (statics are never dropped).
//!
//! A reaper is a detached `sh` whose stdin is a pipe whose only writer is this
//! process. The kernel closes that writer when we exit, however we exit; `read`
//! then sees EOF and the script kills what we started and removes its directory.
//! Unlike polling `kill -0 $PPID`, this cannot be fooled by pid reuse and reacts
//! at once.
//!
//! A reaper must outlive the run it cleans up after, so it sits in its own
//! process group (a Ctrl-C or `kill -- -PGID` aimed at the test run misses it),
//! ignores HUP/INT/TERM, and gets its arguments through the environment so
//! that its command line does not mention the directory: a `pkill -f fulcrum`
//! meant for the daemon would otherwise kill it too.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};

use crate::error::{Result, TestkitError};

/// Stops every server under `$REAPER_DIR` and removes the directory (unless
/// `$REAPER_KEEP` = keep). Each node's data directory holds its pid file:
/// `postmaster.pid` (PostgreSQL, sent SIGQUIT: immediate shutdown, children
/// included) or `mariadbd.pid` (MariaDB, sent SIGKILL: one process, and the
/// data is thrown away). A pid is signalled only if that process's cwd is the
/// data directory (both servers chdir there), so a stale pid file never makes
/// us signal an unrelated process.
const CLUSTER_SCRIPT: &str = r#"
trap '' HUP INT TERM
read _ignored
dir="$REAPER_DIR"
for pidfile in "$dir"/*/postmaster.pid "$dir"/*/mariadbd.pid; do
  [ -f "$pidfile" ] || continue
  datadir="${pidfile%/*}"
  pid=$(head -n 1 "$pidfile")
  case "$pid" in ''|*[!0-9]*) continue ;; esac
  cwd=$(readlink "/proc/$pid/cwd"); cwd=${cwd% (deleted)}
  if [ "$cwd" = "$datadir" ]; then
    case "$pidfile" in
      */postmaster.pid) kill -QUIT "$pid" 2>/dev/null ;;
      *) kill -KILL "$pid" 2>/dev/null ;;
    esac
  fi
done
[ "$REAPER_KEEP" = keep ] && exit 0
# Remove at once (the servers are dying and create nothing new), then again
# once they are gone, in case one wrote a last file in between. A postmaster
# removes its pid file as it exits; `kill -0` alone would wait for init to
# reap the zombie, which in some sandboxes takes over a second.
rm -rf "$dir"
i=0
while [ $i -lt 100 ] && [ -d "$dir" ]; do
  alive=""
  for pidfile in "$dir"/*/postmaster.pid "$dir"/*/mariadbd.pid; do
    [ -f "$pidfile" ] || continue
    pid=$(head -n 1 "$pidfile")
    case "$pid" in ''|*[!0-9]*) continue ;; esac
    kill -0 "$pid" 2>/dev/null && alive=1
  done
  [ -z "$alive" ] && break
  sleep 0.05
  i=$((i + 1))
done
rm -rf "$dir"
"#;

/// SIGKILLs `$REAPER_PID` if its cwd is `$REAPER_DIR` (the daemon runs
/// there), then removes the directory.
const PROCESS_SCRIPT: &str = r#"
trap '' HUP INT TERM
read _ignored
dir="$REAPER_DIR"
pid="$REAPER_PID"
cwd=$(readlink "/proc/$pid/cwd"); cwd=${cwd% (deleted)}
if [ "$cwd" = "$dir" ]; then kill -KILL "$pid" 2>/dev/null; fi
[ "$REAPER_KEEP" = keep ] || rm -rf "$dir"
"#;

/// A running reaper. Dropping it (or [`Reaper::disarm`]) stops it without
/// running its clean-up, for when the owner has cleaned up itself.
#[derive(Debug)]
pub(crate) struct Reaper {
    child: Child,
    /// Held only so the pipe stays open; never written.
    _writer: ChildStdin,
}

impl Reaper {
    /// Reaper for a PostgreSQL or MariaDB cluster directory.
    pub(crate) fn for_cluster(dir: &Path, keep: bool) -> Result<Reaper> {
        Self::spawn(CLUSTER_SCRIPT, dir, None, keep)
    }

    /// Reaper for a child process running with cwd `dir`.
    pub(crate) fn for_process(dir: &Path, pid: u32, keep: bool) -> Result<Reaper> {
        Self::spawn(PROCESS_SCRIPT, dir, Some(pid), keep)
    }

    fn spawn(script: &str, dir: &Path, pid: Option<u32>, keep: bool) -> Result<Reaper> {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(script)
            .arg("testkit-reaper")
            .env("REAPER_DIR", dir)
            .env("REAPER_PID", pid.map(|p| p.to_string()).unwrap_or_default())
            .env("REAPER_KEEP", if keep { "keep" } else { "" })
            .stdin(Stdio::piped())
            // Never hold the test run's stdout/stderr: `cargo test | tee` would
            // otherwise wait for us.
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .current_dir("/")
            .process_group(0);
        let mut child = cmd
            .spawn()
            .map_err(|e| TestkitError::io("spawning the clean-up reaper (sh)", e))?;
        let writer = child.stdin.take().expect("stdin was piped");
        Ok(Reaper {
            child,
            _writer: writer,
        })
    }

    /// Stops the reaper without letting it clean up.
    pub(crate) fn disarm(self) {
        // Drop does the work.
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        // Kill before the writer closes (fields drop after this body), so the
        // script never sees EOF and never runs its clean-up.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
