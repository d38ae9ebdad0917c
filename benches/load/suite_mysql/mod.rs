//! `--suite` on MariaDB: the published comparisons' shapes with sysbench and
//! mysql_async against a primary and GTID replicas this module starts,
//! direct vs Fulcrum, uncapped and with each server CPU-capped.
//!
//! Two regimes, each on servers of its own, torn down (with the daemon and
//! the cgroups) when it ends or fails:
//!
//! - **Capped**: a primary and 2 GTID replicas, each `mariadbd` in its own
//!   CPU-capped cgroup (after `sysbench prepare`, which runs uncapped), with
//!   MariaDB's thread pool (see [`capped`] for why), and one
//!   Fulcrum daemon with a listener per node set. `my-scale-out`: sysbench
//!   `oltp_point_select` directly and through Fulcrum reading from 1, 2 and 3
//!   nodes. `my-s1-*` (published scenario 1, MySQL Proxy with 1 master + 1
//!   slave): simple read, complex read, write and combined, direct vs Fulcrum
//!   on 2 nodes. Skipped, with the reason in the report, where CPU cannot be
//!   capped.
//! - **Uncapped**: one server with `max_connections = 100`. `my-overhead-N`
//!   (published scenario 3): `SELECT VERSION()` from a sysbench Lua script at
//!   1, 5 and 45 clients, latency percentiles from sysbench's histogram.
//!   `my-connections` (published scenario 4): 2,000 mysql_async clients each
//!   connecting, running `SELECT 1` and disconnecting 5 times, all at once.
//!
//! Each scenario runs inside [`SuiteReport::attempt`], so one that fails is
//! reported and the others still run.
//!
//! Here: [`run`], the uncapped regime's setup and what the scenarios share
//! (the sysbench run, the `[[cluster]]` sections, addresses, the daemon's
//! liveness, a temp file). The capped regime is in [`capped`] (what it
//! counts on each node in [`counts`]); the uncapped scenarios in
//! [`overhead`] and [`connections`].

mod capped;
mod connections;
mod counts;
mod overhead;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster};

use crate::fulcrum::{fulcrum_config, push_backends_and_user};
use crate::report::{self, Sample};
use crate::suite::SuiteReport;
use crate::sysbench::{sysbench, SysbenchResult};
use crate::{Options, Result, RUN_GRACE, WARMUP_SECONDS};

use overhead::{clients_text, OVERHEAD_CLIENTS, SELECT_VERSION_SCRIPT};

/// Uncapped regime: the server's `max_connections` (`my-connections`).
const MAX_CONNECTIONS: u32 = 100;
/// Fulcrum's `pool_size` in every cluster here (server connections per node).
const POOL_SIZE: u32 = crate::POOL_SIZE;

/// Runs every MariaDB scenario, adding each result (or failure) to `report`.
pub fn run(opts: &Options, report: &mut SuiteReport) {
    report.attempt("MariaDB, capped: cluster and Fulcrum", |report| {
        capped::run(opts, report)
    });
    if !opts.skip.iter().any(|s| s == "my-uncapped") {
        report.attempt("MariaDB, uncapped: server and Fulcrum", |report| {
            uncapped(opts, report)
        });
    }
}

/// The uncapped regime: one server, one Fulcrum listener in front of it;
/// then `my-overhead-*` and `my-connections`.
fn uncapped(opts: &Options, report: &mut SuiteReport) -> Result<()> {
    // Before anything starts: the daemon and the server inherit it.
    fulcrum_testkit::raise_fd_limit();
    let cluster = MariaCluster::builder()
        .setting("max-connections", &MAX_CONNECTIONS.to_string())
        // 2,000 clients dropped at the deadline must not get 127.0.0.1
        // blocked (ERR 1129) for the rest of the run.
        .setting("max-connect-errors", "1000000000")
        .start()?;
    record_version(&cluster, report)?;
    let listen = listen_addr();
    let section = cluster_section("single", &listen, None, &[cluster.primary().addr()]);
    let fulcrum = FulcrumProcess::start(&fulcrum_config(opts.workers, &[section]))?;
    eprintln!(
        "MariaDB on {} (max_connections = {MAX_CONNECTIONS}), Fulcrum on {listen}",
        cluster.primary().addr()
    );
    let script = TempFile::create("select-version.lua", SELECT_VERSION_SCRIPT)?;
    let primary = cluster.primary();

    for clients in OVERHEAD_CLIENTS {
        let what = format!(
            "MariaDB per-query overhead, {} (my-overhead-{clients})",
            clients_text(clients)
        );
        report.attempt(&what, |report| {
            report.add(overhead::overhead(
                opts, clients, &script, primary, &listen, &fulcrum,
            )?);
            Ok(())
        });
    }
    report.attempt(
        "MariaDB more clients than max_connections (my-connections)",
        |report| {
            report.add(connections::connections(primary, &listen, &fulcrum)?);
            Ok(())
        },
    );
    Ok(())
}

/// `SELECT VERSION()` of the primary into the report's versions.
fn record_version(cluster: &MariaCluster, report: &mut SuiteReport) -> Result<()> {
    let version = cluster.primary().sql("SELECT VERSION()")?;
    report.version(format!("MariaDB {}", version.trim()));
    Ok(())
}

/// One timed sysbench run of `workload` (a built-in test and its options,
/// or a script's path) at `threads` against `addr`, with `--histogram=on`:
/// `WARMUP_SECONDS` for a warm-up, `opts.seconds` otherwise. Fails on
/// everything [`sysbench`] rejects, on no transactions, on a
/// reconnect, on an ignored error (a deadlock) in a workload that does not
/// write, and on a missing histogram. Returns the sample and the number
/// of transactions (events).
fn sysbench_sample(
    opts: &Options,
    addr: &str,
    workload: &[&str],
    threads: u32,
    warm_up: bool,
) -> Result<(Sample, u64)> {
    let seconds = if warm_up {
        WARMUP_SECONDS
    } else {
        opts.seconds
    };
    let mut args: Vec<String> = workload.iter().map(|a| a.to_string()).collect();
    args.extend([
        format!("--threads={threads}"),
        format!("--time={seconds}"),
        "--events=0".to_string(),
        "--histogram=on".to_string(),
        "run".to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let timeout = Duration::from_secs(seconds) + RUN_GRACE;
    let stdout = sysbench(opts, port_of(addr)?, &args, timeout)?;
    let result = SysbenchResult::parse(&stdout)?;
    let writes = workload[0].starts_with("oltp_") && workload[0].contains("write");
    result.ensure_clean(&args, &stdout, writes)?;
    let latency = report::sysbench_percentiles(&stdout)
        .ok_or_else(|| format!("sysbench {}: no latency histogram", args.join(" ")))?;
    let sample = Sample {
        tps: result.tps,
        latency_ms: Some(latency),
        completed: None,
    };
    Ok((sample, result.transactions))
}

/// One MariaDB `[[cluster]]` on `listen` in front of `backends` (the first
/// is the primary, the others replicas), reads spread over all of them
/// (`reads_on_primary = true`); `consistency` left at its default (session)
/// when `None`.
fn cluster_section(
    name: &str,
    listen: &str,
    consistency: Option<&str>,
    backends: &[String],
) -> String {
    let mut out = format!(
        "[[cluster]]\nname = \"{name}\"\nprotocol = \"mysql\"\nlisten = \"{listen}\"\n\
         pool_mode = \"transaction\"\npool_size = {POOL_SIZE}\n\
         health_user = \"root\"\nhealth_password = \"\"\nreads_on_primary = true\n"
    );
    if let Some(consistency) = consistency {
        let _ = writeln!(out, "consistency = \"{consistency}\"");
    }
    push_backends_and_user(&mut out, &backends[0], &backends[1..]);
    out
}

/// "Warm-up then N rounds x S s" for a setup text.
fn rounds_text(opts: &Options) -> String {
    format!(
        "A {} s warm-up run per target, then {} rounds x {} s, targets alternating.",
        WARMUP_SECONDS, opts.rounds, opts.seconds
    )
}

/// A free loopback address for a listener.
fn listen_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// The port of `host:port`.
fn port_of(addr: &str) -> Result<u16> {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .ok_or_else(|| format!("{addr}: no port").into())
}

/// A file in the temp dir, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    /// `<tmp>/fulcrum-bench-<pid>-<name>` holding `text`.
    fn create(name: &str, text: &str) -> Result<TempFile> {
        let path =
            std::env::temp_dir().join(format!("fulcrum-bench-{}-{name}", std::process::id()));
        std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        Ok(TempFile(path))
    }

    fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
