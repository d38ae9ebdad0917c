//! CPU caps: [`CpuCaps`], one cgroup (v1 `cpu` or v2) per database server
//! with a quota of CPU time, moving a server's processes in and reading how
//! often the cap throttled them; groups left by a killed run are removed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::Result;

/// The cgroup CPU period (`cpu.cfs_period_us`, `cpu.max`).
pub(crate) const CPU_PERIOD_US: u64 = 100_000;
/// Cgroup names start with this, then `<our pid>-<node>`.
const CGROUP_PREFIX: &str = "fulcrum-bench-";

/// One cgroup per database server (PostgreSQL in `--scale-out` and the
/// suite, MariaDB in the suite), each limited to a quota of CPU time. Dropping it moves whatever is still inside back to the root
/// cgroup and removes the groups, so a failed run leaves nothing behind (a
/// killed one is cleaned up by the next run: see [`remove_stale_cgroups`]).
pub(crate) struct CpuCaps {
    /// The hierarchy's root: `/sys/fs/cgroup/cpu` (v1) or `/sys/fs/cgroup` (v2).
    root: PathBuf,
    /// One per server, in the cluster's node order
    /// ([`PgCluster::nodes`](fulcrum_testkit::PgCluster::nodes), `MariaCluster::nodes`).
    pub(crate) groups: Vec<PathBuf>,
}

impl CpuCaps {
    /// `count` groups of `quota` CPUs each. `Err` says why CPU cannot be
    /// capped here (the caller skips the run).
    pub(crate) fn create(count: usize, quota: f64, period_us: u64) -> Result<CpuCaps, String> {
        let v1_root = Path::new("/sys/fs/cgroup/cpu");
        let v2_root = Path::new("/sys/fs/cgroup");
        let v2 = if v1_root.join("cpu.cfs_quota_us").is_file() {
            false
        } else if std::fs::read_to_string(v2_root.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu"))
        {
            true
        } else {
            return Err(
                "no cgroup v1 cpu controller at /sys/fs/cgroup/cpu and no cgroup v2 \
                        cpu controller at /sys/fs/cgroup"
                    .into(),
            );
        };
        let root = if v2 { v2_root } else { v1_root };
        remove_stale_cgroups(root);
        // From here, an early return drops `caps`, which removes the groups.
        let mut caps = CpuCaps {
            root: root.to_path_buf(),
            groups: Vec::new(),
        };
        if v2 {
            // Child groups have a cpu.max only when the parent delegates cpu.
            write_cgroup_file(&root.join("cgroup.subtree_control"), "+cpu")?;
        }
        let quota_us = ((quota * period_us as f64).round() as u64).max(1000);
        for i in 0..count {
            let dir = root.join(format!("{CGROUP_PREFIX}{}-{i}", std::process::id()));
            std::fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
            caps.groups.push(dir.clone());
            if v2 {
                write_cgroup_file(&dir.join("cpu.max"), &format!("{quota_us} {period_us}"))?;
            } else {
                write_cgroup_file(&dir.join("cpu.cfs_period_us"), &period_us.to_string())?;
                write_cgroup_file(&dir.join("cpu.cfs_quota_us"), &quota_us.to_string())?;
            }
        }
        Ok(caps)
    }

    /// Moves the server whose data directory is `data_dir` into group
    /// `index`: its postmaster first (backends forked from then on are born
    /// inside), then every process already under it. Returns how many moved.
    pub(crate) fn add_server(&self, index: usize, data_dir: &Path) -> Result<usize> {
        let pidfile = data_dir.join("postmaster.pid");
        let text = std::fs::read_to_string(&pidfile)
            .map_err(|e| format!("reading {}: {e}", pidfile.display()))?;
        let postmaster: u32 = text
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| format!("{}: no pid on its first line", pidfile.display()))?;
        self.add_process(index, postmaster)
    }

    /// Moves process `pid` into group `index`, then every process already
    /// under it (children forked later are born inside). Returns how many moved.
    pub(crate) fn add_process(&self, index: usize, pid: u32) -> Result<usize> {
        let procs = self.groups[index].join("cgroup.procs");
        write_cgroup_file(&procs, &pid.to_string())?;
        let mut moved = 1;
        for pid in descendants(pid) {
            // A child may have exited meanwhile.
            if write_cgroup_file(&procs, &pid.to_string()).is_ok() {
                moved += 1;
            }
        }
        Ok(moved)
    }

    /// `nr_periods` and `nr_throttled` of group `index` so far, from `cpu.stat`
    /// (the same names in v1 and v2); zeros if unreadable.
    pub(crate) fn throttling(&self, index: usize) -> Throttling {
        let stat = std::fs::read_to_string(self.groups[index].join("cpu.stat")).unwrap_or_default();
        let field = |name: &str| -> u64 {
            stat.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
                .unwrap_or(0)
        };
        Throttling {
            periods: field("nr_periods"),
            throttled: field("nr_throttled"),
        }
    }

    /// [`CpuCaps::throttling`] of the first `count` groups, in order.
    pub(crate) fn throttling_all(&self, count: usize) -> Vec<Throttling> {
        (0..count).map(|i| self.throttling(i)).collect()
    }
}

/// A cgroup's CPU periods (in which it had work) and the periods in which
/// its cap throttled it: counters so far ([`CpuCaps::throttling`]) or what
/// they grew by over some runs ([`Throttling::since`], [`Throttling::add`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Throttling {
    pub(crate) periods: u64,
    pub(crate) throttled: u64,
}

impl Throttling {
    /// What the counters grew by from `before` to `self`.
    pub(crate) fn since(self, before: Throttling) -> Throttling {
        Throttling {
            periods: self.periods.saturating_sub(before.periods),
            throttled: self.throttled.saturating_sub(before.throttled),
        }
    }

    /// Adds the increments of another run.
    pub(crate) fn add(&mut self, other: Throttling) {
        self.periods += other.periods;
        self.throttled += other.throttled;
    }

    /// The share of periods throttled, 0 to 1 (0 without periods).
    pub(crate) fn share(self) -> f64 {
        self.throttled as f64 / self.periods.max(1) as f64
    }

    /// The share of periods throttled as a whole percentage, "37 %" ("0 %"
    /// without periods).
    ///
    /// Not `format!("{:.0} %", 100.0 * self.share())`: that rounds
    /// differently on exact halves (23 of 40 periods: "57 %", here "58 %").
    pub(crate) fn percent(self) -> String {
        format!(
            "{:.0} %",
            100.0 * self.throttled as f64 / self.periods.max(1) as f64
        )
    }
}

impl Drop for CpuCaps {
    fn drop(&mut self) {
        for dir in std::mem::take(&mut self.groups).iter().rev() {
            release_cgroup(&self.root, dir);
        }
    }
}

/// Writes `value` to a cgroup control file.
fn write_cgroup_file(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("writing {value} to {}: {e}", path.display()))
}

/// Moves the processes left in cgroup `dir` back to `root` and removes it.
fn release_cgroup(root: &Path, dir: &Path) {
    for _ in 0..100 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.split_whitespace() {
            let _ = std::fs::write(root.join("cgroup.procs"), pid);
        }
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("warning: could not remove cgroup {}", dir.display());
}

/// Removes the groups of earlier runs whose process is gone (killed before
/// it could clean up).
fn remove_stale_cgroups(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(owner) = name
            .strip_prefix(CGROUP_PREFIX)
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{owner}")).exists() {
            eprintln!("removing cgroup {name} left by an earlier run");
            release_cgroup(root, &entry.path());
        }
    }
}

/// Every process under `ancestor` (children, their children, ...), from the
/// `PPid:` lines of `/proc/*/status`.
fn descendants(ancestor: u32) -> Vec<u32> {
    let mut parents = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
            if let Some(ppid) = status
                .lines()
                .find_map(|l| l.strip_prefix("PPid:")?.trim().parse::<u32>().ok())
            {
                parents.push((pid, ppid));
            }
        }
    }
    let mut found = vec![ancestor];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|&&(_, pp)| pp == parent)
                .map(|&(p, _)| p),
        );
        i += 1;
    }
    found.remove(0);
    found
}
