//! Creates the per-cluster and per-daemon temporary directories. Paths stay
//! short because a unix socket path (PostgreSQL's `<dir>/.s.PGSQL.<port>`,
//! MariaDB's `<dir>/<node>.sock`) must fit in 107 bytes. When we are root a
//! PostgreSQL cluster's directory is handed to `postgres`.
//!
//! They go to `/dev/shm` (tmpfs) when it exists: on this project's machines
//! copying a fresh cluster there is ~10x faster than on the ext4 root
//! (0.08 s vs 0.97 s for 28 MB), which is most of a cluster's start-up.
//! `FULCRUM_TESTKIT_TMPDIR` overrides the place (e.g. for large benchmarks).
//!
//! Directories are named `fulcrum-<kind>-<pid>-<n>`, so the first creation in
//! a process also sweeps away those whose process is gone and in which no
//! server runs (no live pid in a node's `postmaster.pid` or `mariadbd.pid`):
//! what a run killed together with its reapers left behind.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

use crate::error::{Result, TestkitError};
use crate::process::{is_root, postgres_ids};

/// Overrides the parent directory of everything the harness creates.
pub const TMPDIR_ENV: &str = "FULCRUM_TESTKIT_TMPDIR";

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A new, empty directory `<tmp>/fulcrum-<kind>-<pid>-<n>`, mode 0700.
/// With `for_postgres` and root, it is chowned to the `postgres` account.
pub(crate) fn create(kind: &str, for_postgres: bool) -> Result<PathBuf> {
    let parent = std::env::var_os(TMPDIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(default_parent);
    static SWEEP: Once = Once::new();
    SWEEP.call_once(|| sweep_stale(&parent));
    let chown_to = if for_postgres && is_root() {
        check_traversable(&parent)?;
        Some(postgres_ids()?)
    } else {
        None
    };
    loop {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let dir = parent.join(format!("fulcrum-{kind}-{}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            // Left over from a killed run whose pid we now reuse: pick another n.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(TestkitError::io(
                    format!(
                        "creating {} (set {TMPDIR_ENV} to use another place)",
                        dir.display()
                    ),
                    e,
                ))
            }
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| TestkitError::io(format!("chmod 0700 {}", dir.display()), e))?;
        if let Some((uid, gid)) = chown_to {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(|e| TestkitError::io(format!("chown {} to postgres", dir.display()), e))?;
        }
        // The reaper compares this path with /proc/PID/cwd, which is resolved.
        return dir
            .canonicalize()
            .map_err(|e| TestkitError::io(format!("resolving {}", dir.display()), e));
    }
}

/// A directory of a test's own (where a Unix socket goes, say), under the
/// harness's temp place with a short path; removed on drop (kept with
/// `FULCRUM_TESTKIT_KEEP=1`).
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// A new, empty `<tmp>/fulcrum-dir-<pid>-<n>`, mode 0700.
    pub fn new() -> Result<ScratchDir> {
        Ok(ScratchDir {
            path: create("dir", false)?,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::env::var(crate::pg_cluster::KEEP_ENV).is_ok_and(|v| v == "1") {
            eprintln!("fulcrum-testkit: kept {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Removes `fulcrum-{pg,maria,proc,dir}-<pid>-<n>` directories under `parent`
/// whose process no longer exists and that hold no live server. Best effort.
fn sweep_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(owner) = owner_pid(&name.to_string_lossy()) else {
            continue;
        };
        let alive = |pid: &str| Path::new("/proc").join(pid.trim()).exists();
        if owner == std::process::id() || alive(&owner.to_string()) {
            continue;
        }
        let dir = entry.path();
        let server_alive = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|node| {
                ["postmaster.pid", "mariadbd.pid"]
                    .map(|file| std::fs::read_to_string(node.path().join(file)).ok())
            })
            .flatten()
            .any(|pidfile| pidfile.lines().next().is_some_and(alive));
        if !server_alive {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// The pid in `fulcrum-<kind>-<pid>-<n>`, for the kinds this module creates.
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name
        .strip_prefix("fulcrum-pg-")
        .or_else(|| name.strip_prefix("fulcrum-maria-"))
        .or_else(|| name.strip_prefix("fulcrum-proc-"))
        .or_else(|| name.strip_prefix("fulcrum-dir-"))?;
    let (pid, n) = rest.split_once('-')?;
    n.parse::<u32>().ok()?;
    pid.parse().ok()
}

/// `/dev/shm` if it is a world-writable directory, else the system temp dir.
fn default_parent() -> PathBuf {
    let shm = Path::new("/dev/shm");
    match std::fs::metadata(shm) {
        Ok(meta) if meta.is_dir() && meta.permissions().mode() & 0o1777 == 0o1777 => {
            shm.to_path_buf()
        }
        _ => std::env::temp_dir(),
    }
}

/// `postgres` must be able to reach the directory we create inside `parent`.
fn check_traversable(parent: &Path) -> Result<()> {
    for dir in parent.ancestors() {
        let Ok(meta) = std::fs::metadata(dir) else {
            continue;
        };
        if meta.permissions().mode() & 0o001 == 0 {
            return Err(TestkitError::Invalid(format!(
                "{} is not searchable by others, so the `postgres` user cannot reach a data \
                 directory under {}; set {TMPDIR_ENV} to a directory such as /tmp",
                dir.display(),
                parent.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::owner_pid;

    #[test]
    fn only_harness_directories_have_an_owner() {
        assert_eq!(owner_pid("fulcrum-pg-1234-0"), Some(1234));
        assert_eq!(owner_pid("fulcrum-proc-77-12"), Some(77));
        assert_eq!(owner_pid("fulcrum-maria-4321-3"), Some(4321));
        assert_eq!(owner_pid("fulcrum-dir-55-1"), Some(55));
        assert_eq!(owner_pid("fulcrum-pg-1234"), None);
        assert_eq!(owner_pid("fulcrum-pg-x-0"), None);
        assert_eq!(owner_pid("fulcrum-other-1-0"), None);
        assert_eq!(owner_pid("PostgreSQL.1157413594"), None);
    }
}
