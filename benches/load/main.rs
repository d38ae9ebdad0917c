//! Load benchmark: `pgbench -S` for a fixed time against PostgreSQL directly,
//! through Fulcrum, through PgBouncer and through Pgpool-II (streaming
//! replication mode, reads load-balanced; `pgpool.rs`), on one throwaway
//! primary (and `--replicas`) this bench starts itself; a pooler that is not
//! installed is skipped. Targets alternate round-robin so machine drift hits all
//! alike; the report is a markdown table on stdout and in `target/bench-load.md`.
//!
//! With `--consistency-cost` the targets are instead PostgreSQL direct and
//! Fulcrum with `consistency = "eventual"` and `"session"` (one daemon, two
//! listeners), for each `--workload` (TPC-B and `-S` by default); the report
//! goes to `target/bench-consistency.md`.
//!
//! With `--mysql-consistency-cost` the same comparison runs on MariaDB: a
//! primary with `--replicas` GTID replicas (default 1), sysbench
//! `oltp_read_write` and `oltp_read_only --skip-trx=on` directly on the
//! primary and through Fulcrum `eventual` and `session`; the report goes to
//! `target/bench-mysql-consistency.md`.
//!
//! With `--scale-out` the targets are PostgreSQL direct and Fulcrum reading
//! from 1, 2 and 3 nodes (a primary and 2 streaming replicas, each server in
//! its own CPU-capped cgroup, `--cpu-quota` CPUs each), `pgbench -S` only;
//! the report goes to `target/bench-scale-out.md` and the TPS-vs-nodes plot
//! to `docs/img/scale-out.png`.
//!
//! With `--cache` the targets are PostgreSQL direct, Fulcrum without a cache
//! and Fulcrum with a result-cache rule on `pgbench_accounts` (issue 46), in
//! front of one primary capped at `--cpu-quota` CPUs, a point read of 1,000
//! rows with `-M prepared` and `-M simple`; the report goes to
//! `target/bench-cache.md`. `--mysql-cache` is the same on MariaDB with
//! sysbench `oltp_point_select` and a rule on its tables, to
//! `target/bench-mysql-cache.md`.
//!
//! Run: `cargo bench --bench load -- [--seconds N] [--clients N] [--rounds N] [--scale N]`
//! (see `--help`; docs/benchmarks.md explains the numbers). Loopback only,
//! bounded in time (every pgbench run has a deadline), cleaned up on exit.
//!
//! Each mode is a module of its own (`mode_select.rs`,
//! `mode_consistency_cost.rs`, `mode_mysql_consistency_cost.rs`,
//! `mode_scale_out.rs`, `mode_cache.rs`, `mode_cache_mysql.rs`, `suite.rs`); what they share is
//! in modules named for what they own: options, pgbench, sysbench, the
//! measuring rounds, the daemon's config, PgBouncer and Pgpool-II (with what
//! their wrappers share in `daemon.rs`), CPU caps, the machine record and
//! child processes. This file holds the constants several of them use and
//! dispatches to the mode.
//! No test harness (`harness = false`) and no unit tests: it is process
//! plumbing, and its arithmetic (medians, ratios) is checked by eye.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use crate::options::{Options, USAGE};

mod cpu_caps;
mod daemon;
mod fulcrum;
mod machine;
mod measure;
mod mode_balance;
mod mode_cache;
mod mode_cache_mysql;
mod mode_consistency_cost;
mod mode_cpu_split;
mod mode_mysql_consistency_cost;
mod mode_scale_out;
mod mode_select;
mod options;
mod pgbench;
mod pgbouncer;
mod pgpool;
mod process;
mod relay;
mod report;
mod suite;
mod suite_mysql;
mod suite_pg;
mod sysbench;

type Error = Box<dyn std::error::Error>;
type Result<T, E = Error> = std::result::Result<T, E>;

/// Server connections for each pooler, per (user, database).
const POOL_SIZE: u32 = 20;
/// A pgbench run may overrun its `-T` by this much (connecting, draining)
/// before it is killed and the bench fails.
const RUN_GRACE: Duration = Duration::from_secs(30);
/// Untimed runs per target before the first round: fill caches and pools.
const WARMUP_SECONDS: u64 = 2;
/// TrueType fonts the plot may use for its text, the first found.
const PLOT_FONTS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo bench` passes --bench; `cargo test --benches` runs us without it.
    if !args.iter().any(|a| a == "--bench") {
        println!("load benchmark: not run outside `cargo bench --bench load`");
        return ExitCode::SUCCESS;
    }
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let opts = match Options::parse(&args) {
        Ok(opts) => opts,
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // Everything started is owned inside run() and dropped before we exit.
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\nload benchmark FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(opts: &Options) -> Result<()> {
    if opts.suite {
        return suite::run(opts);
    }
    if opts.balance {
        return mode_balance::run_balance(opts);
    }
    if opts.replay_cost && opts.consistency_cost {
        return mode_consistency_cost::run_replay(opts);
    }
    if opts.replay_cost && opts.mysql_consistency_cost {
        return mode_mysql_consistency_cost::run_mysql_replay(opts);
    }
    if opts.mirror_cost {
        return mode_consistency_cost::run_mirror(opts);
    }
    if opts.digest_cost {
        return mode_consistency_cost::run_digests(opts);
    }
    if opts.consistency_cost {
        return mode_consistency_cost::run_consistency(opts);
    }
    if opts.mysql_consistency_cost {
        return mode_mysql_consistency_cost::run_mysql_consistency(opts);
    }
    if opts.mysql_cache {
        return mode_cache_mysql::run_mysql_cache(opts);
    }
    if opts.cache {
        return mode_cache::run_cache(opts);
    }
    if opts.scale_out {
        return mode_scale_out::run_scale_out(opts);
    }
    if opts.cpu_split {
        return mode_cpu_split::run_cpu_split(opts);
    }
    mode_select::run_select(opts)
}

/// Median (mean of the middle two for an even count); NaN when empty.
fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// `target/` of this build: the bench runs as `target/<profile>/deps/load-*`.
fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(Path::to_path_buf))
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// Prints a mode's report and writes it to `target/<file>`.
fn publish_report(report: &str, file: &str) -> Result<()> {
    println!("\n{report}");
    let path = target_dir().join(file);
    std::fs::write(&path, report).map_err(|e| format!("writing {}: {e}", path.display()))?;
    eprintln!("written to {}", path.display());
    Ok(())
}
