//! The older modes' measurement: a [`Target`] and what was measured there
//! per round, [`measure`] running the warm-ups and round-robin rounds of
//! pgbench against the targets, and the [`time_budget`] announced before.

use std::path::Path;
use std::time::Duration;

use fulcrum_testkit::PgCluster;

use crate::pgbench::{bench_run, latency_percentiles, Workload};
use crate::{Options, Result, RUN_GRACE, WARMUP_SECONDS};

/// `--consistency-cost`: pause after each run before reading
/// `pg_stat_database`, so idle backends have flushed their counters (at most
/// once a second in PostgreSQL 15).
const STATS_FLUSH: Duration = Duration::from_millis(1200);

/// One place pgbench connects to, and what it measured there, per round.
pub(crate) struct Target {
    pub(crate) name: &'static str,
    pub(crate) addr: String,
    pub(crate) tps: Vec<f64>,
    pub(crate) latency_ms: Vec<f64>,
    /// `--consistency-cost`: transactions committed in the app database per
    /// pgbench transaction, on the primary and on the replicas, per round.
    /// `--mysql-consistency-cost`: `Com_select` per sysbench transaction.
    pub(crate) primary_xacts: Vec<f64>,
    pub(crate) replica_xacts: Vec<f64>,
    /// `--mysql-consistency-cost`: sysbench's ignored errors (deadlocks), per round.
    pub(crate) ignored_errors: Vec<u64>,
    /// `--scale-out`: p50, p95 and p99 transaction latency (ms), per round.
    pub(crate) latency_pcts: Vec<[f64; 3]>,
    /// The proxy process whose CPU is measured (none for direct).
    pub(crate) proxy_pid: Option<u32>,
    /// The proxy's own CPU time (user + system) per transaction, in µs, per round.
    pub(crate) cpu_us_per_txn: Vec<f64>,
    /// Of that, user-space CPU time per transaction (µs), per round (the
    /// rest is system time).
    pub(crate) user_us_per_txn: Vec<f64>,
    /// The proxy's context switches (voluntary + not, all threads) per transaction, per round.
    pub(crate) switches_per_txn: Vec<f64>,
}

impl Target {
    pub(crate) fn new(name: &'static str, addr: String) -> Target {
        Target {
            name,
            addr,
            tps: Vec::new(),
            latency_ms: Vec::new(),
            primary_xacts: Vec::new(),
            replica_xacts: Vec::new(),
            ignored_errors: Vec::new(),
            latency_pcts: Vec::new(),
            proxy_pid: None,
            cpu_us_per_txn: Vec::new(),
            user_us_per_txn: Vec::new(),
            switches_per_txn: Vec::new(),
        }
    }

    /// The medians of the proxy's user and system CPU per transaction (µs);
    /// `None` for a target whose CPU is not measured.
    pub(crate) fn user_system(&self) -> Option<(f64, f64)> {
        if self.user_us_per_txn.is_empty() {
            return None;
        }
        let system: Vec<f64> = self
            .cpu_us_per_txn
            .iter()
            .zip(&self.user_us_per_txn)
            .map(|(t, u)| t - u)
            .collect();
        Some((crate::median(&self.user_us_per_txn), crate::median(&system)))
    }

    /// Measures this proxy process's CPU and context switches per transaction.
    pub(crate) fn proxy(mut self, pid: Option<u32>) -> Target {
        self.proxy_pid = pid;
        self
    }
}

/// A process's CPU time so far (user + system, µs) and its context switches
/// (voluntary and involuntary, summed over its threads), from /proc.
pub(crate) fn process_usage(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line: 12 and 13 here.
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    let hz = 100.0; // USER_HZ on Linux
    let s = switches(pid)?;
    Some((ticks / hz * 1e6, s.voluntary + s.involuntary))
}

/// Context switches of a process's threads, voluntary and involuntary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Switches {
    pub(crate) voluntary: u64,
    pub(crate) involuntary: u64,
}

/// The context switches of every thread of process `pid` now, from
/// `/proc/<pid>/task/*/status` (threads that ended since are not counted,
/// so a pool retiring threads during a run undercounts it a little).
pub(crate) fn switches(pid: u32) -> Option<Switches> {
    let mut sum = Switches::default();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        // A thread that ended meanwhile counts nothing.
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let one = parse_switches(&status);
        sum.voluntary += one.voluntary;
        sum.involuntary += one.involuntary;
    }
    Some(sum)
}

/// `voluntary_ctxt_switches` and `nonvoluntary_ctxt_switches` of a
/// `status` file (0 for a missing line).
fn parse_switches(status: &str) -> Switches {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    Switches {
        voluntary: field("voluntary_ctxt_switches:"),
        involuntary: field("nonvoluntary_ctxt_switches:"),
    }
}

/// A process's user-space CPU time so far (µs), from /proc.
pub(crate) fn process_user_us(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let utime: f64 = rest.split_whitespace().nth(11)?.parse().ok()?;
    Some(utime / 100.0 * 1e6)
}

/// One warm-up run per target, then `opts.rounds` rounds of one run per
/// target, recording each run's TPS and latency in its target.
/// `check_alive` fails if a proxy died during the last run. With `counts`,
/// also records the server transactions each run committed (after a pause
/// for the statistics to be flushed).
pub(crate) fn measure(
    opts: &Options,
    workload: Workload,
    script: &Path,
    counts: Option<&PgCluster>,
    targets: &mut [Target],
    check_alive: impl Fn() -> Result<()>,
) -> Result<()> {
    for target in targets.iter() {
        eprintln!("warm-up: {} for {WARMUP_SECONDS} s", target.name);
        bench_run(&target.addr, opts, workload, script, WARMUP_SECONDS, None)
            .map_err(|e| format!("warm-up against {}: {e}", target.name))?;
        check_alive()?;
    }
    // `--scale-out`: per-transaction logs, for latency percentiles.
    let log_dir = opts
        .scale_out
        .then(|| std::env::temp_dir().join(format!("fulcrum-bench-txlog-{}", std::process::id())));
    let commits = || -> Result<Option<(u64, u64)>> {
        let Some(cluster) = counts else {
            return Ok(None);
        };
        std::thread::sleep(STATS_FLUSH);
        xact_commits(cluster).map(Some)
    };
    let mut before = commits()?;
    let n = targets.len();
    for round in 0..opts.rounds {
        // Rotate the starting target so none always runs right after another.
        for i in 0..n {
            let target = &mut targets[(round + i) % n];
            let usage_before = target.proxy_pid.and_then(process_usage);
            let user_before = target.proxy_pid.and_then(process_user_us);
            let run = bench_run(
                &target.addr,
                opts,
                workload,
                script,
                opts.seconds,
                log_dir.as_deref(),
            );
            let usage_after = target.proxy_pid.and_then(process_usage);
            let user_after = target.proxy_pid.and_then(process_user_us);
            let percentiles = match (&run, &log_dir) {
                (Ok(_), Some(dir)) => Some(latency_percentiles(dir)),
                _ => None,
            };
            if let Some(dir) = &log_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
            let result =
                run.map_err(|e| format!("round {} against {}: {e}", round + 1, target.name))?;
            check_alive()?;
            let latency = result.latency_avg_ms.unwrap_or(f64::NAN);
            let mut cpu = String::new();
            if let (Some((c0, s0)), Some((c1, s1))) = (usage_before, usage_after) {
                let txns = result.transactions.max(1) as f64;
                let us = (c1 - c0) / txns;
                let sw = s1.saturating_sub(s0) as f64 / txns;
                target.cpu_us_per_txn.push(us);
                target.switches_per_txn.push(sw);
                cpu = format!("  proxy CPU {us:.1} us/txn, {sw:.2} switches/txn");
                if let (Some(u0), Some(u1)) = (user_before, user_after) {
                    let user = (u1 - u0) / txns;
                    target.user_us_per_txn.push(user);
                    cpu = format!("{cpu} (user {user:.1}, system {:.1})", us - user);
                }
            }
            if let Some(p) = percentiles {
                target.latency_pcts.push(p?);
            }
            let after = commits()?;
            let mut per_txn = String::new();
            if let (Some((p0, r0)), Some((p1, r1))) = (before, after) {
                let txns = result.transactions as f64;
                let primary = p1.saturating_sub(p0) as f64 / txns;
                let replicas = r1.saturating_sub(r0) as f64 / txns;
                target.primary_xacts.push(primary);
                target.replica_xacts.push(replicas);
                per_txn = format!("  server xacts/txn {primary:.2} + {replicas:.2}");
            }
            before = after;
            eprintln!(
                "round {}/{}: {:<18} {:>8.0} TPS  latency avg {latency:.3} ms{per_txn}{cpu}",
                round + 1,
                opts.rounds,
                target.name,
                result.tps,
            );
            target.tps.push(result.tps);
            target.latency_ms.push(latency);
        }
    }
    Ok(())
}

/// Transactions committed in the app database so far: (primary, all replicas).
fn xact_commits(cluster: &PgCluster) -> Result<(u64, u64)> {
    const QUERY: &str =
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()";
    let count = |text: String| -> Result<u64> {
        text.trim()
            .parse()
            .map_err(|e| format!("xact_commit {text:?}: {e}").into())
    };
    let primary = count(cluster.primary().sql(QUERY)?)?;
    let mut replicas = 0;
    for replica in cluster.replicas() {
        replicas += count(replica.sql(QUERY)?)?;
    }
    Ok((primary, replicas))
}

/// (expected, worst-case) wall time from here on. Expected: the pgbench runs
/// plus what start-up and `pgbench -i` took on a 2-core machine; worst case:
/// every deadline expiring (pg_ctl's 60 s, the daemons' 10 s, each run's grace).
pub(crate) fn time_budget(
    opts: &Options,
    targets: u64,
    init_timeout: Duration,
) -> (Duration, Duration) {
    let workloads = opts.workloads.len() as u64;
    let runs = workloads * targets * opts.rounds as u64;
    let mut pgbench = workloads * targets * WARMUP_SECONDS + runs * opts.seconds;
    if opts.consistency_cost {
        // The pause before each reading of the transaction counters.
        pgbench += (runs + workloads) * STATS_FLUSH.as_millis().div_ceil(1000) as u64;
    }
    let expected = pgbench + 5 + u64::from(opts.scale);
    let grace = RUN_GRACE.as_secs();
    let worst = pgbench
        + (workloads * targets + runs) * grace
        + init_timeout.as_secs() * (1 + opts.replicas.min(1) as u64)
        + 60 * (1 + opts.replicas as u64)
        + 2 * 10
        + 30;
    (Duration::from_secs(expected), Duration::from_secs(worst))
}
