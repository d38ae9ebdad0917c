//! What the figures were measured on: [`Machine`] (date, CPUs, load,
//! versions, commit) and its lines in the older modes' reports.

use std::process::Command;
use std::time::Duration;

use fulcrum_testkit::pg_bin;

use crate::pgbouncer::PGBOUNCER;
use crate::process::first_line;
use crate::{Options, Result};

/// What the numbers were measured on.
pub(crate) struct Machine {
    pub(crate) date: String,
    pub(crate) nproc: usize,
    pub(crate) cpu: String,
    /// The database server and its version.
    pub(crate) server: String,
    /// The benchmark client (and pooler) versions.
    pub(crate) clients: String,
    pub(crate) commit: String,
    /// 1-minute load average before the first run: other work on the machine.
    pub(crate) load: Option<f64>,
}

impl Machine {
    /// Other work was competing for the CPUs when the runs started.
    pub(crate) fn busy(&self) -> bool {
        self.load.is_some_and(|l| l > self.nproc as f64 / 2.0)
    }

    /// Says on stderr when other work is running, before the first run.
    pub(crate) fn warn_if_busy(&self) {
        if self.busy() {
            eprintln!(
                "warning: load average {:.2} on {} CPUs: other work is running; expect noisy figures",
                self.load.unwrap_or_default(),
                self.nproc
            );
        }
    }

    /// `server`: e.g. `PostgreSQL 15.8`; `clients`: the client tools' versions.
    pub(crate) fn collect(server: String, clients: String) -> Result<Machine> {
        let mut commit = first_line("git", &["rev-parse", "--short", "HEAD"]);
        let dirty = Command::new("git")
            .args(["status", "--porcelain", "--untracked-files=no"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .is_ok_and(|o| !o.stdout.is_empty());
        if dirty {
            commit.push_str(" + uncommitted changes");
        }
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| {
                    l.strip_prefix("model name")
                        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
                })
            })
            .unwrap_or_else(|| "unknown".into());
        Ok(Machine {
            date: first_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu,
            server,
            clients,
            commit,
            load: std::fs::read_to_string("/proc/loadavg")
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse().ok()),
        })
    }
}

/// What [`Machine`] records for PostgreSQL: the server and the client tools.
pub(crate) fn pg_machine(primary_sql: Result<String>) -> Result<Machine> {
    let version = primary_sql?;
    let pgbench = first_line(&pg_bin("pgbench").to_string_lossy(), &["--version"]);
    let pgbouncer = first_line(PGBOUNCER, &["--version"]);
    Machine::collect(
        format!("PostgreSQL {}", version.trim()),
        format!("{pgbench}; {pgbouncer}"),
    )
}

/// What the figures were measured on, one markdown list item each.
pub(crate) fn machine_lines(opts: &Options, machine: &Machine, elapsed: Duration) -> Vec<String> {
    let mut lines = vec![
        format!("date: {}", machine.date),
        format!(
            "machine: {} CPUs ({}), shared by the benchmark client, the database servers \
             and the proxy",
            machine.nproc, machine.cpu
        ),
        format!(
            "1-minute load average before the first run (includes `{}`): {}{}",
            if opts.mysql_consistency_cost || opts.mysql_cache {
                "sysbench prepare"
            } else {
                "pgbench -i"
            },
            machine.load.map_or("unknown".into(), |l| format!("{l:.2}")),
            if machine.busy() {
                " (BUSY: other work was running; the figures are unreliable)"
            } else {
                ""
            }
        ),
        format!("{}; {}", machine.server, machine.clients),
        format!("Fulcrum: {} (workers = {})", machine.commit, opts.workers),
    ];
    if opts.replicas > 0
        && !opts.consistency_cost
        && !opts.mysql_consistency_cost
        && !opts.scale_out
    {
        lines.push(format!(
            "{} streaming replica(s), listed in Fulcrum's config",
            opts.replicas
        ));
    }
    lines.push(format!("whole run: {:.0} s", elapsed.as_secs_f64()));
    lines
}
