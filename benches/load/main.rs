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
//! Run: `cargo bench --bench load -- [--seconds N] [--clients N] [--rounds N] [--scale N]`
//! (see `--help`; docs/benchmarks.md explains the numbers). Loopback only,
//! bounded in time (every pgbench run has a deadline), cleaned up on exit.
//!
//! One file, longer than this workspace likes, because a bench target is one
//! file here; it reads top-down: options, the run, pgbench, PgBouncer, the
//! report. No test harness (`harness = false`) and no unit tests: it is
//! process plumbing, and its arithmetic (medians, ratios) is checked by eye.

use std::fmt::Write as _;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fulcrum_testkit::{
    free_port, fulcrum_bin, is_root, pg_bin, wait_for_tcp, FulcrumProcess, MariaCluster, MariaNode,
    PgCluster, PgbenchResult, APP_DB, APP_PASSWORD, APP_USER, FULCRUM_BIN_ENV,
};

mod pgpool;
mod relay;
mod report;
mod suite;
mod suite_mysql;
mod suite_pg;

type Error = Box<dyn std::error::Error>;
type Result<T, E = Error> = std::result::Result<T, E>;

const PGBOUNCER: &str = "/usr/sbin/pgbouncer";
/// Server connections for each pooler, per (user, database).
const POOL_SIZE: u32 = 20;
/// A pgbench run may overrun its `-T` by this much (connecting, draining)
/// before it is killed and the bench fails.
const RUN_GRACE: Duration = Duration::from_secs(30);
/// Deadline for `pgbench -i`, per unit of scale (100,000 accounts) and fixed.
const INIT_SECONDS_PER_SCALE: u64 = 10;
const INIT_SECONDS_FIXED: u64 = 60;
/// Untimed runs per target before the first round: fill caches and pools.
const WARMUP_SECONDS: u64 = 2;
/// `--consistency-cost`: pause after each run before reading
/// `pg_stat_database`, so idle backends have flushed their counters (at most
/// once a second in PostgreSQL 15).
const STATS_FLUSH: Duration = Duration::from_millis(1200);
/// `--mysql-consistency-cost`: sysbench's `--tables`.
const SYSBENCH_TABLES: u32 = 2;
/// Deadline for `sysbench prepare` and `cleanup`, and for the replicas to
/// apply the prepared tables.
const SYSBENCH_PREPARE_TIMEOUT: Duration = Duration::from_secs(120);
/// `--scale-out`: PostgreSQL servers (a primary and its replicas).
const SCALE_OUT_NODES: usize = 3;
/// `--scale-out`: the cgroup CPU period (`cpu.cfs_period_us`, `cpu.max`).
const CPU_PERIOD_US: u64 = 100_000;
/// `--scale-out`: cgroup names start with this, then `<our pid>-<node>`.
const CGROUP_PREFIX: &str = "fulcrum-bench-";
/// `--workload write-read`: an autocommit write, then a read of the same row.
const WRITE_READ_SCRIPT: &str = "\\set aid random(1, 100000 * :scale)
\\set delta random(-5000, 5000)
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
";

const USAGE: &str = "\
usage: cargo bench --bench load -- [options]
  --seconds N     length of each pgbench run (default 10)
  --clients N     pgbench -c (default 16)
  --jobs N        pgbench -j (default 2)
  --rounds N      rounds; each runs every target once (default 3)
  --scale N       pgbench -i -s (default 10)
  --protocol P    pgbench -M: simple, extended or prepared (default simple)
  --workers N     Fulcrum's [fulcrum] workers (default 1)
  --replicas N    streaming replicas, listed as Fulcrum replicas (default 0)
  --consistency-cost
                  compare direct, Fulcrum consistency=eventual and
                  consistency=session instead of direct/Fulcrum/PgBouncer
  --workload LIST comma-separated: select (pgbench -S), tpcb (pgbench's
                  default script), write-read (UPDATE then SELECT of one row,
                  autocommit); default select, or tpcb,select with
                  --consistency-cost
  --mysql-consistency-cost
                  the same on MariaDB (a primary and --replicas GTID replicas,
                  default 1) with sysbench oltp_read_write and oltp_read_only
                  --skip-trx=on: --clients is --threads, --seconds is --time
  --table-size N  sysbench --table-size, 2 tables (default 10000)
  --ps-mode M     sysbench --db-ps-mode: auto or disable (default auto)
  --scale-out     read scale-out: a primary and 2 streaming replicas, each in
                  its own CPU-capped cgroup; targets PostgreSQL direct and
                  Fulcrum reading from 1, 2 and 3 nodes (pgbench -S); writes
                  docs/img/scale-out.png
  --cpu-quota F   --scale-out: CPUs per PostgreSQL server (default 0.3; 0
                  runs uncapped and plots to target/ instead of docs/img/)
  --suite         the whole suite (docs/benchmarks.md, The suite): the
                  published comparisons (scenarios 1-4) on PostgreSQL and
                  MariaDB clusters it starts, uncapped and CPU-capped, against
                  direct, Fulcrum, PgBouncer and Pgpool-II; rewrites the suite
                  section of docs/benchmarks.md and docs/img/suite-*.png
                  (--seconds, --rounds, --cpu-quota apply; defaults 8 s, 2
                  rounds, 0.3 CPU)
  --mysql-cpu-quota F
                  --suite: CPUs per MariaDB server when capped (default 0.1:
                  a point select costs MariaDB less than pgbench -S costs
                  PostgreSQL, so at 0.3 the 2 cores run out before the caps do)
  --only DB       --suite: postgres or mysql only
  --skip LIST     --suite: parts to leave out, comma-separated: pg-uncapped,
                  pg-connections, pg-capped
  --no-docs       --suite: write target/bench-suite-<db>.md and target/suite-img/
                  only
Environment: FULCRUM_BIN=path skips building the daemon.";

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

#[derive(Debug, Clone)]
struct Options {
    seconds: u64,
    clients: u32,
    jobs: u32,
    rounds: usize,
    scale: u32,
    protocol: String,
    /// Fulcrum's `[fulcrum] workers` (1: one event-loop thread, like PgBouncer).
    workers: u32,
    /// Streaming replicas started and listed in Fulcrum's config.
    replicas: usize,
    /// Direct vs Fulcrum `eventual` vs `session` instead of the proxies.
    consistency_cost: bool,
    /// What pgbench runs, one measurement per entry, in order.
    workloads: Vec<Workload>,
    /// `--consistency-cost` on MariaDB with sysbench.
    mysql_consistency_cost: bool,
    /// sysbench `--table-size` (rows in each of its 2 tables).
    table_size: u64,
    /// sysbench `--db-ps-mode`.
    ps_mode: String,
    /// Direct vs Fulcrum on 1, 2 and 3 CPU-capped nodes.
    scale_out: bool,
    /// `--scale-out`: CPUs per PostgreSQL server's cgroup (0: no cgroups).
    cpu_quota: f64,
    /// `--suite`: scenarios 1-4 on both databases, into docs/benchmarks.md.
    suite: bool,
    /// `--suite --only postgres|mysql`: one database only.
    only: Option<String>,
    /// `--suite --no-docs`: report into target/ only, leave docs/ alone.
    no_docs: bool,
    /// `--suite`: CPUs per MariaDB server in the capped regime.
    mysql_cpu_quota: f64,
    /// `--suite --skip a,b`: parts left out (pg-uncapped, pg-connections, pg-capped).
    skip: Vec<String>,
}

/// A pgbench script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    /// `-S`: the built-in select-only script.
    Select,
    /// No script option: the built-in TPC-B-like script (one transaction of
    /// three updates, a select and an insert).
    TpcB,
    /// [`WRITE_READ_SCRIPT`]: two autocommit statements.
    WriteRead,
}

impl Workload {
    fn parse(name: &str) -> Option<Workload> {
        match name {
            "select" => Some(Workload::Select),
            "tpcb" => Some(Workload::TpcB),
            "write-read" => Some(Workload::WriteRead),
            _ => None,
        }
    }

    /// How the report's heading names it.
    fn title(self) -> &'static str {
        match self {
            Workload::Select => "pgbench -S",
            Workload::TpcB => "pgbench TPC-B (default script)",
            Workload::WriteRead => "pgbench -f write-read (UPDATE, then SELECT, autocommit)",
        }
    }

    /// pgbench's script options; `script` is where [`WRITE_READ_SCRIPT`] is.
    fn args(self, script: &Path) -> Vec<String> {
        match self {
            Workload::Select => vec!["-S".into()],
            Workload::TpcB => Vec::new(),
            Workload::WriteRead => vec!["-f".into(), script.display().to_string()],
        }
    }
}

impl Options {
    fn parse(args: &[String]) -> Result<Options, String> {
        let mut opts = Options {
            seconds: 10,
            clients: 16,
            jobs: 2,
            rounds: 3,
            scale: 10,
            protocol: "simple".into(),
            workers: 1,
            replicas: 0,
            consistency_cost: false,
            workloads: Vec::new(),
            mysql_consistency_cost: false,
            table_size: 10_000,
            ps_mode: "auto".into(),
            scale_out: false,
            cpu_quota: 0.3,
            suite: false,
            only: None,
            no_docs: false,
            skip: Vec::new(),
            mysql_cpu_quota: 0.1,
        };
        let mut replicas_given = false;
        let (mut seconds_given, mut rounds_given) = (false, false);
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            if flag == "--bench" {
                continue;
            }
            if flag == "--consistency-cost" {
                opts.consistency_cost = true;
                continue;
            }
            if flag == "--mysql-consistency-cost" {
                opts.mysql_consistency_cost = true;
                continue;
            }
            if flag == "--scale-out" {
                opts.scale_out = true;
                continue;
            }
            if flag == "--suite" {
                opts.suite = true;
                continue;
            }
            if flag == "--no-docs" {
                opts.no_docs = true;
                continue;
            }
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let number = |min: u64| -> Result<u64, String> {
                match value.parse::<u64>() {
                    Ok(n) if n >= min => Ok(n),
                    _ => Err(format!("{flag} {value}: expected a whole number >= {min}")),
                }
            };
            match flag.as_str() {
                "--seconds" => {
                    opts.seconds = number(1)?;
                    seconds_given = true;
                }
                "--clients" => opts.clients = number(1)? as u32,
                "--jobs" => opts.jobs = number(1)? as u32,
                "--rounds" => {
                    opts.rounds = number(1)? as usize;
                    rounds_given = true;
                }
                "--scale" => opts.scale = number(1)? as u32,
                "--workers" => opts.workers = number(0)? as u32,
                "--replicas" => {
                    opts.replicas = number(0)? as usize;
                    replicas_given = true;
                }
                "--table-size" => opts.table_size = number(1)?,
                "--cpu-quota" => match value.parse::<f64>() {
                    Ok(q) if (0.0..=64.0).contains(&q) => opts.cpu_quota = q,
                    _ => return Err(format!("--cpu-quota {value}: expected CPUs, e.g. 0.3")),
                },
                "--mysql-cpu-quota" => match value.parse::<f64>() {
                    Ok(q) if (0.0..=64.0).contains(&q) => opts.mysql_cpu_quota = q,
                    _ => {
                        return Err(format!(
                            "--mysql-cpu-quota {value}: expected CPUs, e.g. 0.1"
                        ))
                    }
                },
                "--ps-mode" if ["auto", "disable"].contains(&value.as_str()) => {
                    opts.ps_mode = value.clone()
                }
                "--ps-mode" => return Err(format!("--ps-mode {value}: expected auto or disable")),
                "--workload" => {
                    opts.workloads = value
                        .split(',')
                        .map(|w| {
                            Workload::parse(w.trim())
                                .ok_or_else(|| format!("--workload {value}: unknown workload {w}"))
                        })
                        .collect::<Result<_, _>>()?
                }
                "--protocol" if ["simple", "extended", "prepared"].contains(&value.as_str()) => {
                    opts.protocol = value.clone()
                }
                "--protocol" => return Err(format!("--protocol {value}: unknown mode")),
                "--only" if ["postgres", "mysql"].contains(&value.as_str()) => {
                    opts.only = Some(value.clone())
                }
                "--only" => return Err(format!("--only {value}: expected postgres or mysql")),
                "--skip" => opts.skip = value.split(',').map(|v| v.trim().to_string()).collect(),
                _ => return Err(format!("unknown option {flag}")),
            }
        }
        // pgbench refuses more threads than clients.
        opts.jobs = opts.jobs.min(opts.clients);
        if opts.suite {
            if opts.scale_out || opts.consistency_cost || opts.mysql_consistency_cost {
                return Err("--suite is a run of its own".into());
            }
            if !opts.workloads.is_empty() || replicas_given {
                return Err("--suite chooses its own workloads and replicas".into());
            }
            if !seconds_given {
                opts.seconds = 8;
            }
            if !rounds_given {
                opts.rounds = 2;
            }
            return Ok(opts);
        }
        if opts.only.is_some() || opts.no_docs {
            return Err("--only and --no-docs are for --suite".into());
        }
        if opts.scale_out {
            if opts.consistency_cost || opts.mysql_consistency_cost {
                return Err("--scale-out is a run of its own".into());
            }
            if replicas_given && opts.replicas != SCALE_OUT_NODES - 1 {
                return Err(format!(
                    "--scale-out always starts {} replicas",
                    SCALE_OUT_NODES - 1
                ));
            }
            if !opts.workloads.is_empty() && opts.workloads != [Workload::Select] {
                return Err("--scale-out runs pgbench -S only".into());
            }
            opts.replicas = SCALE_OUT_NODES - 1;
            opts.workloads = vec![Workload::Select];
            return Ok(opts);
        }
        if opts.mysql_consistency_cost {
            if opts.consistency_cost {
                return Err(
                    "--consistency-cost and --mysql-consistency-cost are separate runs".into(),
                );
            }
            if !opts.workloads.is_empty() {
                return Err("--workload is for pgbench; --mysql-consistency-cost runs \
                            oltp_read_write and oltp_read_only"
                    .into());
            }
            if !replicas_given {
                opts.replicas = 1;
            }
            return Ok(opts);
        }
        if opts.workloads.is_empty() {
            opts.workloads = if opts.consistency_cost {
                vec![Workload::TpcB, Workload::Select]
            } else {
                vec![Workload::Select]
            };
        }
        if !opts.consistency_cost && opts.workloads != [Workload::Select] {
            return Err("--workload other than select needs --consistency-cost".into());
        }
        Ok(opts)
    }
}

fn run(opts: &Options) -> Result<()> {
    if opts.suite {
        return suite::run(opts);
    }
    if opts.consistency_cost {
        return run_consistency(opts);
    }
    if opts.mysql_consistency_cost {
        return run_mysql_consistency(opts);
    }
    if opts.scale_out {
        return run_scale_out(opts);
    }
    let started = Instant::now();
    let bin = ensure_fulcrum_built()?;
    let pgbouncer_found = Path::new(PGBOUNCER).is_file();
    if !pgbouncer_found {
        eprintln!(
            "PgBouncer not found at {PGBOUNCER}: skipping it (install: apt-get install pgbouncer)"
        );
    }
    let pgpool_found = Path::new(pgpool::PGPOOL).is_file();
    if !pgpool_found {
        eprintln!(
            "Pgpool-II not found at {}: skipping it (install: apt-get install pgpool2)",
            pgpool::PGPOOL
        );
    }
    let targets = 2 + u64::from(pgbouncer_found) + u64::from(pgpool_found);
    let init_timeout =
        Duration::from_secs(INIT_SECONDS_FIXED + INIT_SECONDS_PER_SCALE * u64::from(opts.scale));
    let (expected, worst) = time_budget(opts, targets, init_timeout);
    eprintln!(
        "load benchmark: {targets} targets x {} rounds x {} s after `pgbench -i -s {}`: \
         about {} s in all; every step has a deadline, so at most {} s",
        opts.rounds,
        opts.seconds,
        opts.scale,
        expected.as_secs(),
        worst.as_secs()
    );

    let cluster = start_cluster(opts, init_timeout)?;
    let primary = cluster.primary();
    let direct = primary.addr();

    let fulcrum_listen = format!("127.0.0.1:{}", free_port());
    let section = cluster_section("bench", &fulcrum_listen, None, &cluster);
    let fulcrum = FulcrumProcess::start(&fulcrum_config(opts.workers, &[section]))?;
    eprintln!("Fulcrum {} on {fulcrum_listen}", bin.display());
    let pgbouncer = if pgbouncer_found {
        let p = PgBouncer::start(primary.port())?;
        eprintln!("PgBouncer on {}", p.addr);
        Some(p)
    } else {
        None
    };
    // In front of the primary and every replica, reads spread over all of
    // them; a child per pgbench client plus a few.
    let pgpool = if pgpool_found {
        let replicas: Vec<String> = cluster.replicas().iter().map(|r| r.addr()).collect();
        let children = opts.clients + pgpool::SPARE_CHILDREN;
        let p = pgpool::Pgpool::start(&direct, &replicas, children)?;
        eprintln!("{} on {}", pgpool::pgpool_version(), p.addr);
        Some(p)
    } else {
        None
    };

    let mut targets = vec![
        Target::new("PostgreSQL direct", direct),
        Target::new("Fulcrum", fulcrum_listen),
    ];
    if let Some(p) = &pgbouncer {
        targets.push(Target::new("PgBouncer", p.addr.clone()));
    }
    if let Some(p) = &pgpool {
        targets.push(Target::new("Pgpool-II", p.addr.clone()));
    }

    let check_alive = || -> Result<()> {
        if let Some(status) = fulcrum.try_wait() {
            return Err(format!(
                "fulcrum exited with {status}; log tail:\n{}",
                tail(&fulcrum.log_contents(), 30)
            )
            .into());
        }
        if let Some(p) = &pgbouncer {
            p.check_alive()?;
        }
        if let Some(p) = &pgpool {
            p.check_alive()?;
        }
        Ok(())
    };

    let machine = pg_machine(primary.sql("SHOW server_version").map_err(Into::into))?;
    if machine.busy() {
        eprintln!(
            "warning: load average {:.2} on {} CPUs: other work is running; expect noisy figures",
            machine.load.unwrap_or_default(),
            machine.nproc
        );
    }
    measure(
        opts,
        Workload::Select,
        Path::new(""),
        None,
        &mut targets,
        check_alive,
    )?;

    // Stop the servers before reporting, so cleanup cannot be skipped by a
    // failure to write the file.
    drop(pgpool);
    drop(pgbouncer);
    drop(fulcrum);
    drop(cluster);

    let report = render(opts, &machine, &targets, started.elapsed());
    println!("\n{report}");
    let path = target_dir().join("bench-load.md");
    std::fs::write(&path, &report).map_err(|e| format!("writing {}: {e}", path.display()))?;
    eprintln!("written to {}", path.display());
    Ok(())
}

/// Starts the PostgreSQL cluster (a primary and `opts.replicas` streaming
/// replicas) and runs `pgbench -i` on the primary.
fn start_cluster(opts: &Options, init_timeout: Duration) -> Result<PgCluster> {
    // Keep the data set in shared buffers: a scale-10 pgbench database is
    // ~160 MB, five times the harness's 32 MB default, and a select-only run
    // spilling to the OS cache would mostly measure the server.
    let shared_buffers = format!("{}MB", 64 + 16 * opts.scale);
    let cluster = PgCluster::builder()
        .replicas(opts.replicas)
        .setting("shared_buffers", &shared_buffers)
        .start()?;
    let direct = cluster.primary().addr();
    eprintln!("PostgreSQL primary on {direct} (shared_buffers {shared_buffers})");
    for replica in cluster.replicas() {
        eprintln!("PostgreSQL streaming replica on {}", replica.addr());
    }

    eprintln!("pgbench -i -s {} (directly) ...", opts.scale);
    let init_args = ["-i", "-q", "-s", &opts.scale.to_string()];
    pgbench_bounded(&direct, &init_args, init_timeout)
        .map_err(|e| format!("pgbench -i -s {}: {e}", opts.scale))?;
    if opts.replicas > 0 {
        cluster.wait_replicas_caught_up(init_timeout)?;
    }
    Ok(cluster)
}

/// `--consistency-cost`: direct vs Fulcrum `eventual` vs Fulcrum `session`,
/// one table per workload.
fn run_consistency(opts: &Options) -> Result<()> {
    let started = Instant::now();
    let bin = ensure_fulcrum_built()?;
    let init_timeout =
        Duration::from_secs(INIT_SECONDS_FIXED + INIT_SECONDS_PER_SCALE * u64::from(opts.scale));
    let (expected, worst) = time_budget(opts, 3, init_timeout);
    eprintln!(
        "consistency cost: {} workloads x 3 targets x {} rounds x {} s after `pgbench -i -s {}`: \
         about {} s in all; every step has a deadline, so at most {} s",
        opts.workloads.len(),
        opts.rounds,
        opts.seconds,
        opts.scale,
        expected.as_secs(),
        worst.as_secs()
    );

    let cluster = start_cluster(opts, init_timeout)?;
    let direct = cluster.primary().addr();
    let script = std::env::temp_dir().join(format!(
        "fulcrum-bench-write-read-{}.sql",
        std::process::id()
    ));
    if opts.workloads.contains(&Workload::WriteRead) {
        std::fs::write(&script, WRITE_READ_SCRIPT)?;
    }

    // One daemon, two listeners: the clusters differ only in `consistency`,
    // and only one of them has clients at a time.
    let eventual_listen = format!("127.0.0.1:{}", free_port());
    let session_listen = format!("127.0.0.1:{}", free_port());
    let sections = [
        cluster_section("eventual", &eventual_listen, Some("eventual"), &cluster),
        cluster_section("session", &session_listen, Some("session"), &cluster),
    ];
    let fulcrum = FulcrumProcess::start(&fulcrum_config(opts.workers, &sections))?;
    eprintln!(
        "Fulcrum {}: consistency = \"eventual\" on {eventual_listen}, \"session\" on {session_listen}",
        bin.display()
    );
    let check_alive = || -> Result<()> {
        match fulcrum.try_wait() {
            None => Ok(()),
            Some(status) => Err(format!(
                "fulcrum exited with {status}; log tail:\n{}",
                tail(&fulcrum.log_contents(), 30)
            )
            .into()),
        }
    };

    let machine = pg_machine(
        cluster
            .primary()
            .sql("SHOW server_version")
            .map_err(Into::into),
    )?;
    if machine.busy() {
        eprintln!(
            "warning: load average {:.2} on {} CPUs: other work is running; expect noisy figures",
            machine.load.unwrap_or_default(),
            machine.nproc
        );
    }
    let mut results = Vec::new();
    for &workload in &opts.workloads {
        eprintln!("== {}", workload.title());
        let mut targets = vec![
            Target::new("PostgreSQL direct", direct.clone()),
            Target::new("Fulcrum eventual", eventual_listen.clone()),
            Target::new("Fulcrum session", session_listen.clone()),
        ];
        let measured = measure(
            opts,
            workload,
            &script,
            Some(&cluster),
            &mut targets,
            check_alive,
        );
        if let Err(e) = measured {
            let _ = std::fs::remove_file(&script);
            return Err(e);
        }
        results.push((workload, targets));
    }
    let _ = std::fs::remove_file(&script);

    drop(fulcrum);
    drop(cluster);

    let report = render_consistency(opts, &machine, &results, started.elapsed());
    println!("\n{report}");
    let path = target_dir().join("bench-consistency.md");
    std::fs::write(&path, &report).map_err(|e| format!("writing {}: {e}", path.display()))?;
    eprintln!("written to {}", path.display());
    Ok(())
}

/// `--scale-out`: PostgreSQL direct vs Fulcrum reading from 1, 2 and 3
/// nodes of a primary and 2 streaming replicas, each server in its own
/// CPU-capped cgroup so that one node is the bottleneck.
fn run_scale_out(opts: &Options) -> Result<()> {
    let started = Instant::now();
    // First, before anything starts: without cgroups there is nothing to
    // measure. Declared before the cluster, so dropped after it.
    let caps = if opts.cpu_quota > 0.0 {
        match CpuCaps::create(SCALE_OUT_NODES, opts.cpu_quota) {
            Ok(caps) => Some(caps),
            Err(reason) => {
                println!(
                    "scale-out benchmark SKIPPED: cannot cap the CPU of each PostgreSQL \
                     server: {reason} (needs root and a writable cgroup v1 cpu or cgroup v2 \
                     hierarchy; --cpu-quota 0 runs uncapped)"
                );
                return Ok(());
            }
        }
    } else {
        eprintln!("--cpu-quota 0: the servers run uncapped");
        None
    };
    let bin = ensure_fulcrum_built()?;
    let init_timeout =
        Duration::from_secs(INIT_SECONDS_FIXED + INIT_SECONDS_PER_SCALE * u64::from(opts.scale));
    let targets = 1 + SCALE_OUT_NODES as u64;
    let (expected, worst) = time_budget(opts, targets, init_timeout);
    eprintln!(
        "read scale-out: {targets} targets x {} rounds x {} s after `pgbench -i -s {}`: \
         about {} s in all; every step has a deadline, so at most {} s",
        opts.rounds,
        opts.seconds,
        opts.scale,
        expected.as_secs(),
        worst.as_secs()
    );

    // `pgbench -i` runs uncapped; the caps apply from here on.
    let cluster = start_cluster(opts, init_timeout)?;
    let mut node_names = Vec::new();
    for (i, node) in cluster.nodes().enumerate() {
        node_names.push(node.name().to_string());
        if let Some(caps) = &caps {
            let moved = caps.add_server(i, node.data_dir())?;
            eprintln!(
                "{}: postmaster and {} other processes in {} ({} CPU)",
                node.name(),
                moved - 1,
                caps.groups[i].display(),
                opts.cpu_quota
            );
        }
    }

    const NAMES: [&str; SCALE_OUT_NODES] =
        ["Fulcrum, 1 node", "Fulcrum, 2 nodes", "Fulcrum, 3 nodes"];
    let primary = cluster.primary().addr();
    let replicas: Vec<String> = cluster.replicas().iter().map(|r| r.addr()).collect();
    let mut targets = vec![Target::new("PostgreSQL direct", primary.clone())];
    let mut sections = Vec::new();
    for (nodes, name) in (1..=SCALE_OUT_NODES).zip(NAMES) {
        let listen = format!("127.0.0.1:{}", free_port());
        sections.push(scale_out_section(
            &format!("nodes{nodes}"),
            &listen,
            &primary,
            &replicas[..nodes - 1],
        ));
        targets.push(Target::new(name, listen));
    }
    // One daemon, three listeners; only one of them has clients at a time.
    let fulcrum = FulcrumProcess::start(&fulcrum_config(opts.workers, &sections))?;
    eprintln!(
        "Fulcrum {}: 1, 2 and 3 nodes on {}",
        bin.display(),
        targets[1..]
            .iter()
            .map(|t| t.addr.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let check_alive = || -> Result<()> {
        match fulcrum.try_wait() {
            None => Ok(()),
            Some(status) => Err(format!(
                "fulcrum exited with {status}; log tail:\n{}",
                tail(&fulcrum.log_contents(), 30)
            )
            .into()),
        }
    };

    let machine = pg_machine(
        cluster
            .primary()
            .sql("SHOW server_version")
            .map_err(Into::into),
    )?;
    if machine.busy() {
        eprintln!(
            "warning: load average {:.2} on {} CPUs: other work is running; expect noisy figures",
            machine.load.unwrap_or_default(),
            machine.nproc
        );
    }
    let throttling = |caps: &CpuCaps| -> Vec<(u64, u64)> {
        (0..SCALE_OUT_NODES).map(|i| caps.throttling(i)).collect()
    };
    let before = caps.as_ref().map(throttling);
    measure(
        opts,
        Workload::Select,
        Path::new(""),
        None,
        &mut targets,
        check_alive,
    )?;
    // Per node: the share of CPU periods in which the cap held it back.
    let throttled: Vec<(String, f64)> = match (&caps, before) {
        (Some(caps), Some(before)) => throttling(caps)
            .iter()
            .zip(before)
            .zip(&node_names)
            .map(|((&(p1, t1), (p0, t0)), name)| {
                let periods = p1.saturating_sub(p0).max(1) as f64;
                (name.clone(), t1.saturating_sub(t0) as f64 / periods)
            })
            .collect(),
        _ => Vec::new(),
    };

    drop(fulcrum);
    drop(cluster);
    drop(caps);

    let report = render_scale_out(opts, &machine, &targets, &throttled, started.elapsed());
    println!("\n{report}");
    let path = target_dir().join("bench-scale-out.md");
    std::fs::write(&path, &report).map_err(|e| format!("writing {}: {e}", path.display()))?;
    eprintln!("written to {}", path.display());
    // The uncapped comparison run must not replace the documented plot.
    let plot = if opts.cpu_quota > 0.0 {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/img/scale-out.png")
    } else {
        target_dir().join("scale-out-uncapped.png")
    };
    plot_scale_out(&plot, opts, &targets)?;
    eprintln!("plot written to {}", plot.display());
    Ok(())
}

/// `--scale-out`: a `[[cluster]]` on `listen` in front of `primary` and
/// `replicas`, `consistency = "eventual"`, reads spread over all of them
/// (with no replica, the primary serves the reads anyway).
fn scale_out_section(name: &str, listen: &str, primary: &str, replicas: &[String]) -> String {
    let mut out = format!(
        "[[cluster]]\nname = \"{name}\"\nprotocol = \"postgres\"\nlisten = \"{listen}\"\n\
         pool_mode = \"transaction\"\npool_size = {POOL_SIZE}\nclient_auth = \"scram-sha-256\"\n\
         consistency = \"eventual\"\nreads_on_primary = true\n"
    );
    let _ = write!(
        out,
        "\n[[cluster.backend]]\naddress = \"{primary}\"\nrole = \"primary\"\n\n"
    );
    for replica in replicas {
        let _ = write!(
            out,
            "[[cluster.backend]]\naddress = \"{replica}\"\nrole = \"replica\"\n\n"
        );
    }
    let _ = writeln!(
        out,
        "[[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\""
    );
    out
}

/// `--scale-out`: one cgroup per PostgreSQL server, each limited to a quota
/// of CPU time. Dropping it moves whatever is still inside back to the root
/// cgroup and removes the groups, so a failed run leaves nothing behind (a
/// killed one is cleaned up by the next run: see [`remove_stale_cgroups`]).
struct CpuCaps {
    /// The hierarchy's root: `/sys/fs/cgroup/cpu` (v1) or `/sys/fs/cgroup` (v2).
    root: PathBuf,
    /// One per server, in [`PgCluster::nodes`] order.
    groups: Vec<PathBuf>,
}

impl CpuCaps {
    /// `count` groups of `quota` CPUs each. `Err` says why CPU cannot be
    /// capped here (the caller skips the run).
    fn create(count: usize, quota: f64) -> Result<CpuCaps, String> {
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
        let quota_us = ((quota * CPU_PERIOD_US as f64).round() as u64).max(1000);
        for i in 0..count {
            let dir = root.join(format!("{CGROUP_PREFIX}{}-{i}", std::process::id()));
            std::fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
            caps.groups.push(dir.clone());
            if v2 {
                write_cgroup_file(&dir.join("cpu.max"), &format!("{quota_us} {CPU_PERIOD_US}"))?;
            } else {
                write_cgroup_file(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                write_cgroup_file(&dir.join("cpu.cfs_quota_us"), &quota_us.to_string())?;
            }
        }
        Ok(caps)
    }

    /// Moves the server whose data directory is `data_dir` into group
    /// `index`: its postmaster first (backends forked from then on are born
    /// inside), then every process already under it. Returns how many moved.
    fn add_server(&self, index: usize, data_dir: &Path) -> Result<usize> {
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
    fn add_process(&self, index: usize, pid: u32) -> Result<usize> {
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

    /// (`nr_periods`, `nr_throttled`) of group `index` so far, from `cpu.stat`
    /// (the same names in v1 and v2); zeros if unreadable.
    fn throttling(&self, index: usize) -> (u64, u64) {
        let stat = std::fs::read_to_string(self.groups[index].join("cpu.stat")).unwrap_or_default();
        let field = |name: &str| -> u64 {
            stat.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
                .unwrap_or(0)
        };
        (field("nr_periods"), field("nr_throttled"))
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

/// p50, p95 and p99 (nearest rank, ms) of the per-transaction latencies in
/// the pgbench logs in `dir` (`client txn latency_us script epoch us`).
fn latency_percentiles(dir: &Path) -> Result<[f64; 3]> {
    let mut micros: Vec<u64> = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let text = std::fs::read_to_string(entry?.path())?;
        micros.extend(
            text.lines()
                .filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok()),
        );
    }
    if micros.is_empty() {
        return Err(format!("no transactions in the pgbench logs in {}", dir.display()).into());
    }
    micros.sort_unstable();
    let rank = |p: f64| -> f64 {
        let i = ((p * micros.len() as f64).ceil() as usize).clamp(1, micros.len()) - 1;
        micros[i] as f64 / 1000.0
    };
    Ok([rank(0.50), rank(0.95), rank(0.99)])
}

/// `--scale-out`: the table, the per-node throttling, then the machine.
fn render_scale_out(
    opts: &Options,
    machine: &Machine,
    targets: &[Target],
    throttled: &[(String, f64)],
    elapsed: Duration,
) -> String {
    let mut out = String::new();
    let cap = if opts.cpu_quota > 0.0 {
        format!("each PostgreSQL server capped at {} CPU", opts.cpu_quota)
    } else {
        "servers uncapped".to_string()
    };
    let _ = writeln!(
        out,
        "### pgbench -S, {} clients, -j {}, -M {}, scale {}, {} rounds x {} s, a primary and \
         {} streaming replicas, {cap}\n",
        opts.clients,
        opts.jobs,
        opts.protocol,
        opts.scale,
        opts.rounds,
        opts.seconds,
        SCALE_OUT_NODES - 1
    );
    let _ = writeln!(
        out,
        "| target | nodes | median TPS | ratio to direct | ratio per node \
         | ratio to Fulcrum 1 node | latency p50 / p95 / p99 (ms) | avg latency (ms) \
         | TPS per round |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---|");
    let direct = &targets[0].tps;
    let one_node = &targets[1].tps;
    for (i, target) in targets.iter().enumerate() {
        let nodes = i.max(1);
        let ratios: Vec<f64> = target.tps.iter().zip(direct).map(|(t, d)| t / d).collect();
        let ratio = median(&ratios);
        let to_one: Vec<f64> = target
            .tps
            .iter()
            .zip(one_node)
            .map(|(t, o)| t / o)
            .collect();
        let pct = |k: usize| -> f64 {
            let values: Vec<f64> = target.latency_pcts.iter().map(|p| p[k]).collect();
            median(&values)
        };
        let rounds: Vec<String> = target.tps.iter().map(|t| format!("{t:.0}")).collect();
        let _ = writeln!(
            out,
            "| {} | {nodes} | {:.0} | {ratio:.2}x | {:.2} | {:.2}x | {:.2} / {:.2} / {:.2} \
             | {:.3} | {} |",
            target.name,
            median(&target.tps),
            ratio / nodes as f64,
            median(&to_one),
            pct(0),
            pct(1),
            pct(2),
            median(&target.latency_ms),
            rounds.join(" / ")
        );
    }
    let _ = writeln!(
        out,
        "\nRatios are medians of per-round ratios (each run against the same round's direct \
         run); \"ratio per node\" is that ratio divided by the nodes serving reads, \"ratio \
         to Fulcrum 1 node\" the same against the round's Fulcrum run on the primary alone. \
         Latency \
         percentiles come from pgbench's per-transaction logs (`--log`, every target alike) \
         and are medians over the rounds."
    );
    if !throttled.is_empty() {
        let shares: Vec<String> = throttled
            .iter()
            .map(|(name, share)| format!("{name} {:.0} %", share * 100.0))
            .collect();
        let _ = writeln!(
            out,
            "\nCPU periods ({} ms) in which the cap throttled the server, over all runs \
             (warm-ups included; a node serves only some of the targets): {}",
            CPU_PERIOD_US / 1000,
            shares.join(", ")
        );
    }
    out.push('\n');
    for line in machine_lines(opts, machine, elapsed) {
        let _ = writeln!(out, "- {line}");
    }
    out
}

/// TrueType fonts the plot may use for its text, the first found.
const PLOT_FONTS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// `--scale-out`: a PNG of median TPS against the nodes serving reads:
/// Fulcrum, PostgreSQL direct as a reference line, and direct x nodes as
/// the linear ideal.
fn plot_scale_out(path: &Path, opts: &Options, targets: &[Target]) -> Result<()> {
    use plotters::prelude::*;
    let font = PLOT_FONTS
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .ok_or_else(|| format!("no TrueType font for the plot (looked for {PLOT_FONTS:?})"))?;
    plotters::style::register_font("sans-serif", FontStyle::Normal, font.leak())
        .map_err(|_| "the plot's font is not a usable TrueType font")?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let plot_err =
        |e: &dyn std::fmt::Display| -> Error { format!("plot {}: {e}", path.display()).into() };

    let direct = median(&targets[0].tps);
    let fulcrum: Vec<(f64, f64)> = targets[1..]
        .iter()
        .enumerate()
        .map(|(i, t)| ((i + 1) as f64, median(&t.tps)))
        .collect();
    // As in the table: medians of the per-round ratios to direct.
    let ratios: Vec<f64> = targets[1..]
        .iter()
        .map(|t| {
            let r: Vec<f64> = t
                .tps
                .iter()
                .zip(&targets[0].tps)
                .map(|(t, d)| t / d)
                .collect();
            median(&r)
        })
        .collect();
    let nodes = fulcrum.len() as f64;
    let top = fulcrum
        .iter()
        .map(|&(_, y)| y)
        .fold(direct * nodes, f64::max)
        * 1.12;
    let cap = if opts.cpu_quota > 0.0 {
        format!("{} CPU per server", opts.cpu_quota)
    } else {
        "servers uncapped".into()
    };

    let root = BitMapBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "pgbench -S read scale-out ({cap}, {} clients)",
                opts.clients
            ),
            ("sans-serif", 24),
        )
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(0.8f64..nodes + 0.5, 0f64..top)
        .map_err(|e| plot_err(&e))?;
    chart
        .configure_mesh()
        .x_labels(fulcrum.len())
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .disable_x_mesh()
        .light_line_style(WHITE)
        .x_desc("PostgreSQL nodes serving reads")
        .y_desc("TPS (median of rounds)")
        .label_style(("sans-serif", 16))
        .draw()
        .map_err(|e| plot_err(&e))?;
    let grey = RGBColor(150, 150, 150);
    chart
        .draw_series(DashedLineSeries::new(
            [(1.0, direct), (nodes, direct * nodes)],
            8,
            6,
            grey.stroke_width(2),
        ))
        .map_err(|e| plot_err(&e))?
        .label("target shape: direct x nodes")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], grey.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(
            [(0.8, direct), (nodes + 0.5, direct)],
            RED.stroke_width(2),
        ))
        .map_err(|e| plot_err(&e))?
        .label(format!("PostgreSQL direct: {direct:.0} TPS"))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(fulcrum.clone(), BLUE.stroke_width(3)))
        .map_err(|e| plot_err(&e))?
        .label("Fulcrum (reads_on_primary, eventual)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE.stroke_width(3)));
    chart
        .draw_series(
            fulcrum
                .iter()
                .map(|&(x, y)| Circle::new((x, y), 5, BLUE.filled())),
        )
        .map_err(|e| plot_err(&e))?;
    chart
        .draw_series(fulcrum.iter().zip(&ratios).map(|(&(x, y), ratio)| {
            // Below and right of its point, clear of the line.
            EmptyElement::at((x, y))
                + Text::new(
                    format!("{y:.0} TPS ({ratio:.2}x)"),
                    (10, 8),
                    ("sans-serif", 16).into_font().color(&BLACK),
                )
        }))
        .map_err(|e| plot_err(&e))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| plot_err(&e))?;
    root.present().map_err(|e| plot_err(&e))?;
    Ok(())
}

/// A sysbench workload of `--mysql-consistency-cost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SysbenchWorkload {
    /// `oltp_read_write`: BEGIN, 10 point selects, 4 range selects, 2
    /// UPDATEs, a DELETE and an INSERT, COMMIT. Everything runs on the
    /// primary (a transaction opened with BEGIN may write).
    ReadWrite,
    /// `oltp_read_only --skip-trx=on`: the same 14 selects, autocommit, so
    /// Fulcrum may send them to a replica.
    ReadOnly,
}

impl SysbenchWorkload {
    const ALL: [SysbenchWorkload; 2] = [SysbenchWorkload::ReadWrite, SysbenchWorkload::ReadOnly];

    fn args(self) -> &'static [&'static str] {
        match self {
            SysbenchWorkload::ReadWrite => &["oltp_read_write"],
            SysbenchWorkload::ReadOnly => &["oltp_read_only", "--skip-trx=on"],
        }
    }

    fn title(self) -> &'static str {
        match self {
            SysbenchWorkload::ReadWrite => "sysbench oltp_read_write",
            SysbenchWorkload::ReadOnly => "sysbench oltp_read_only --skip-trx=on",
        }
    }
}

/// What a `sysbench ... run` reported.
#[derive(Debug)]
struct SysbenchResult {
    transactions: u64,
    tps: f64,
    latency_avg_ms: f64,
    ignored_errors: u64,
    reconnects: u64,
}

impl SysbenchResult {
    /// Parses sysbench 1.0's summary ("transactions: N (X per sec.)", ...).
    fn parse(stdout: &str) -> Result<SysbenchResult> {
        let line = |label: &str| -> Result<&str> {
            stdout
                .lines()
                .map(str::trim_start)
                .find_map(|l| l.strip_prefix(label))
                .map(str::trim)
                .ok_or_else(|| format!("no `{label}` line in sysbench's output").into())
        };
        let count = |label: &str| -> Result<u64> {
            let rest = line(label)?;
            rest.split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| format!("sysbench `{label} {rest}`: no count").into())
        };
        let transactions = line("transactions:")?;
        let tps = transactions
            .split_once('(')
            .and_then(|(_, r)| r.split_whitespace().next()?.parse().ok())
            .ok_or_else(|| format!("sysbench `transactions: {transactions}`: no rate"))?;
        let latency_avg_ms = line("avg:")?
            .parse()
            .map_err(|e| format!("sysbench latency avg: {e}"))?;
        Ok(SysbenchResult {
            transactions: count("transactions:")?,
            tps,
            latency_avg_ms,
            ignored_errors: count("ignored errors:")?,
            reconnects: count("reconnects:")?,
        })
    }
}

/// Runs sysbench against `port` as `app` with the bench's tables:
/// `sysbench --db-driver=mysql ... <args>`; returns its stdout. A non-zero
/// exit, a FATAL or ALERT line, or a run past `timeout` is an error.
fn sysbench(opts: &Options, port: u16, args: &[&str], timeout: Duration) -> Result<String> {
    let connection = [
        "--db-driver=mysql".to_string(),
        "--mysql-host=127.0.0.1".to_string(),
        format!("--mysql-port={port}"),
        format!("--mysql-user={APP_USER}"),
        format!("--mysql-password={APP_PASSWORD}"),
        format!("--mysql-db={APP_DB}"),
        // Only deadlocks are retried; any other error fails the run.
        "--mysql-ignore-errors=1213".to_string(),
    ];
    sysbench_with(&connection, opts, args, timeout)
}

/// Runs sysbench with the driver options in `connection` and the bench's
/// tables and prepared-statement mode, then `args`; returns its stdout. A
/// non-zero exit, a FATAL or ALERT line, or a run past `timeout` is an error.
fn sysbench_with(
    connection: &[String],
    opts: &Options,
    args: &[&str],
    timeout: Duration,
) -> Result<String> {
    let mut cmd = Command::new("sysbench");
    cmd.args(connection)
        .args([
            format!("--db-ps-mode={}", opts.ps_mode),
            format!("--tables={SYSBENCH_TABLES}"),
            format!("--table-size={}", opts.table_size),
        ])
        .args(args)
        .env("LC_ALL", "C");
    let (status, stdout, stderr) = run_bounded(cmd, "sysbench", timeout)?;
    let fatal = stdout
        .lines()
        .chain(stderr.lines())
        .any(|l| l.contains("FATAL") || l.contains("ALERT"));
    if !status.success() || fatal {
        return Err(format!(
            "`sysbench {}` exited with {status}\n--- stdout (tail) ---\n{}\n\
             --- stderr (head) ---\n{}",
            args.join(" "),
            tail(&stdout, 30),
            stderr.lines().take(20).collect::<Vec<_>>().join("\n")
        )
        .into());
    }
    Ok(stdout)
}

/// One timed `sysbench <workload> run` of `seconds` against `port`.
/// Fails on everything [`sysbench`] rejects, on a reconnect, on no
/// transactions, and on an ignored error in a workload that does not write
/// (only writers can deadlock).
fn sysbench_run(
    opts: &Options,
    port: u16,
    workload: SysbenchWorkload,
    seconds: u64,
) -> Result<SysbenchResult> {
    let mut args: Vec<String> = workload.args().iter().map(|a| a.to_string()).collect();
    args.extend([
        format!("--threads={}", opts.clients),
        format!("--time={seconds}"),
        "--events=0".to_string(),
        "run".to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let stdout = sysbench(opts, port, &args, Duration::from_secs(seconds) + RUN_GRACE)?;
    let result = SysbenchResult::parse(&stdout)?;
    let unexpected_errors = workload == SysbenchWorkload::ReadOnly && result.ignored_errors > 0;
    if result.transactions == 0 || result.reconnects > 0 || unexpected_errors {
        return Err(format!(
            "sysbench {}: {} transactions, {} ignored errors, {} reconnects\n{}",
            args.join(" "),
            result.transactions,
            result.ignored_errors,
            result.reconnects,
            tail(&stdout, 30)
        )
        .into());
    }
    Ok(result)
}

/// `SHOW GLOBAL STATUS LIKE 'Com_select'` on `node`.
fn com_select(node: &MariaNode) -> Result<u64> {
    let text = node.sql("SHOW GLOBAL STATUS LIKE 'Com_select'")?;
    text.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("Com_select: unexpected answer {text:?}").into())
}

/// `Com_select` so far: (primary, all replicas).
fn com_selects(cluster: &MariaCluster) -> Result<(u64, u64)> {
    let primary = com_select(cluster.primary())?;
    let mut replicas = 0;
    for replica in cluster.replicas() {
        replicas += com_select(replica)?;
    }
    Ok((primary, replicas))
}

/// One `[[cluster]]` for MariaDB listening on `listen`, in front of the
/// primary and every replica of `maria`, with the given `consistency`.
fn mysql_cluster_section(
    name: &str,
    listen: &str,
    consistency: &str,
    maria: &MariaCluster,
) -> String {
    let mut out = format!(
        "[[cluster]]\nname = \"{name}\"\nprotocol = \"mysql\"\nlisten = \"{listen}\"\n\
         pool_mode = \"transaction\"\npool_size = {POOL_SIZE}\n\
         health_user = \"root\"\nhealth_password = \"\"\nconsistency = \"{consistency}\"\n"
    );
    let _ = write!(
        out,
        "\n[[cluster.backend]]\naddress = \"{}\"\nrole = \"primary\"\n\n",
        maria.primary().addr()
    );
    for replica in maria.replicas() {
        let _ = write!(
            out,
            "[[cluster.backend]]\naddress = \"{}\"\nrole = \"replica\"\n\n",
            replica.addr()
        );
    }
    let _ = writeln!(
        out,
        "[[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\""
    );
    out
}

/// `--mysql-consistency-cost`: MariaDB direct vs Fulcrum `eventual` vs
/// Fulcrum `session` with sysbench, one table per workload.
fn run_mysql_consistency(opts: &Options) -> Result<()> {
    let started = Instant::now();
    let sysbench_version = first_line("sysbench", &["--version"]);
    if sysbench_version == "unknown" {
        return Err("sysbench not found (install: apt-get install sysbench)".into());
    }
    let bin = ensure_fulcrum_built()?;
    let workloads = SysbenchWorkload::ALL.len() as u64;
    let runs = workloads * 3 * opts.rounds as u64;
    let expected = workloads * 3 * WARMUP_SECONDS + runs * (opts.seconds + 1) + 20;
    let worst = expected + (workloads * 3 + runs) * RUN_GRACE.as_secs() + 60 + 120 + 60 + 30;
    eprintln!(
        "MariaDB consistency cost: {workloads} workloads x 3 targets x {} rounds x {} s after \
         `sysbench prepare` ({SYSBENCH_TABLES} tables x {} rows): about {expected} s in all; \
         every step has a deadline, so at most {worst} s",
        opts.rounds, opts.seconds, opts.table_size
    );

    let cluster = MariaCluster::builder().replicas(opts.replicas).start()?;
    let primary_port = cluster.primary().port();
    eprintln!("MariaDB primary on {}", cluster.primary().addr());
    for replica in cluster.replicas() {
        eprintln!("MariaDB GTID replica on {}", replica.addr());
    }
    eprintln!(
        "sysbench oltp_read_write prepare (directly, {SYSBENCH_TABLES} x {} rows) ...",
        opts.table_size
    );
    sysbench(
        opts,
        primary_port,
        &["oltp_read_write", "prepare"],
        SYSBENCH_PREPARE_TIMEOUT,
    )
    .map_err(|e| format!("sysbench prepare: {e}"))?;
    cluster.wait_replicas_caught_up(SYSBENCH_PREPARE_TIMEOUT)?;

    let eventual_listen = format!("127.0.0.1:{}", free_port());
    let session_listen = format!("127.0.0.1:{}", free_port());
    let sections = [
        mysql_cluster_section("eventual", &eventual_listen, "eventual", &cluster),
        mysql_cluster_section("session", &session_listen, "session", &cluster),
    ];
    let fulcrum = FulcrumProcess::start(&fulcrum_config(opts.workers, &sections))?;
    eprintln!(
        "Fulcrum {}: consistency = \"eventual\" on {eventual_listen}, \"session\" on {session_listen}",
        bin.display()
    );
    let check_alive = || -> Result<()> {
        match fulcrum.try_wait() {
            None => Ok(()),
            Some(status) => Err(format!(
                "fulcrum exited with {status}; log tail:\n{}",
                tail(&fulcrum.log_contents(), 30)
            )
            .into()),
        }
    };
    let port_of = |addr: &str| -> u16 {
        addr.rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .expect("listen address with a port")
    };

    let version = cluster.primary().sql("SELECT VERSION()")?;
    let machine = Machine::collect(format!("MariaDB {}", version.trim()), sysbench_version)?;
    if machine.busy() {
        eprintln!(
            "warning: load average {:.2} on {} CPUs: other work is running; expect noisy figures",
            machine.load.unwrap_or_default(),
            machine.nproc
        );
    }
    let mut results = Vec::new();
    for workload in SysbenchWorkload::ALL {
        eprintln!("== {}", workload.title());
        let mut targets = vec![
            Target::new("MariaDB direct", cluster.primary().addr()),
            Target::new("Fulcrum eventual", eventual_listen.clone()),
            Target::new("Fulcrum session", session_listen.clone()),
        ];
        for target in &targets {
            eprintln!("warm-up: {} for {WARMUP_SECONDS} s", target.name);
            sysbench_run(opts, port_of(&target.addr), workload, WARMUP_SECONDS)
                .map_err(|e| format!("warm-up against {}: {e}", target.name))?;
            check_alive()?;
        }
        let n = targets.len();
        for round in 0..opts.rounds {
            for i in 0..n {
                let target = &mut targets[(round + i) % n];
                let (p0, r0) = com_selects(&cluster)?;
                let result = sysbench_run(opts, port_of(&target.addr), workload, opts.seconds)
                    .map_err(|e| format!("round {} against {}: {e}", round + 1, target.name))?;
                check_alive()?;
                let (p1, r1) = com_selects(&cluster)?;
                let txns = result.transactions as f64;
                let primary = p1.saturating_sub(p0) as f64 / txns;
                let replicas = r1.saturating_sub(r0) as f64 / txns;
                eprintln!(
                    "round {}/{}: {:<18} {:>8.1} TPS  latency avg {:.3} ms  \
                     SELECTs/txn {primary:.2} + {replicas:.2}  ignored errors {}",
                    round + 1,
                    opts.rounds,
                    target.name,
                    result.tps,
                    result.latency_avg_ms,
                    result.ignored_errors
                );
                target.tps.push(result.tps);
                target.latency_ms.push(result.latency_avg_ms);
                target.primary_xacts.push(primary);
                target.replica_xacts.push(replicas);
                target.ignored_errors.push(result.ignored_errors);
            }
        }
        results.push((workload, targets));
    }

    drop(fulcrum);
    if let Err(e) = sysbench(
        opts,
        primary_port,
        &["oltp_read_write", "cleanup"],
        SYSBENCH_PREPARE_TIMEOUT,
    ) {
        eprintln!("warning: sysbench cleanup: {e}");
    }
    drop(cluster);

    let report = render_mysql_consistency(opts, &machine, &results, started.elapsed());
    println!("\n{report}");
    let path = target_dir().join("bench-mysql-consistency.md");
    std::fs::write(&path, &report).map_err(|e| format!("writing {}: {e}", path.display()))?;
    eprintln!("written to {}", path.display());
    Ok(())
}

/// `--mysql-consistency-cost`: one table per sysbench workload, then the machine.
fn render_mysql_consistency(
    opts: &Options,
    machine: &Machine,
    results: &[(SysbenchWorkload, Vec<Target>)],
    elapsed: Duration,
) -> String {
    let mut out = String::new();
    let replicas = match opts.replicas {
        0 => "one primary, no replicas".to_string(),
        1 => "a primary and 1 GTID replica (listed in both Fulcrum clusters)".to_string(),
        n => format!("a primary and {n} GTID replicas (listed in both Fulcrum clusters)"),
    };
    for (workload, targets) in results {
        let direct = &targets[0].tps;
        let eventual = &targets[1].tps;
        let _ = writeln!(
            out,
            "### {}, {} threads, --db-ps-mode={}, {SYSBENCH_TABLES} tables x {} rows, \
             {} rounds x {} s, {replicas}\n",
            workload.title(),
            opts.clients,
            opts.ps_mode,
            opts.table_size,
            opts.rounds,
            opts.seconds
        );
        let _ = writeln!(
            out,
            "| target | median TPS | ratio to direct | ratio to eventual | avg latency (ms) \
             | Com_select per txn (primary + replicas) | ignored errors per run | TPS per round |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---|---|");
        for target in targets {
            let paired = |base: &[f64]| -> f64 {
                let ratios: Vec<f64> = target.tps.iter().zip(base).map(|(t, b)| t / b).collect();
                median(&ratios)
            };
            let rounds: Vec<String> = target.tps.iter().map(|t| format!("{t:.0}")).collect();
            let errors: Vec<String> = target.ignored_errors.iter().map(u64::to_string).collect();
            let _ = writeln!(
                out,
                "| {} | {:.0} | {:.3}x | {:.3}x | {:.3} | {:.2} + {:.2} | {} | {} |",
                target.name,
                median(&target.tps),
                paired(direct),
                paired(eventual),
                median(&target.latency_ms),
                median(&target.primary_xacts),
                median(&target.replica_xacts),
                errors.join(" / "),
                rounds.join(" / ")
            );
        }
        let session: Vec<String> = targets[2]
            .tps
            .iter()
            .zip(eventual)
            .map(|(s, e)| format!("{:.3}", s / e))
            .collect();
        let _ = writeln!(
            out,
            "\nsession / eventual per round: {}\n",
            session.join(" / ")
        );
    }
    let _ = writeln!(
        out,
        "Ratios are medians of per-round ratios (each run against the same round's \
         direct or eventual run); latency and Com_select per sysbench transaction are \
         medians over the rounds. Ignored errors are the deadlocks sysbench retried \
         (`--mysql-ignore-errors=1213`); any other error fails the bench."
    );
    out.push('\n');
    for line in machine_lines(opts, machine, elapsed) {
        let _ = writeln!(out, "- {line}");
    }
    out
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

/// One warm-up run per target, then `opts.rounds` rounds of one run per
/// target, recording each run's TPS and latency in its target.
/// `check_alive` fails if a proxy died during the last run. With `counts`,
/// also records the server transactions each run committed (after a pause
/// for the statistics to be flushed).
fn measure(
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
            let run = bench_run(
                &target.addr,
                opts,
                workload,
                script,
                opts.seconds,
                log_dir.as_deref(),
            );
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
                "round {}/{}: {:<18} {:>8.0} TPS  latency avg {latency:.3} ms{per_txn}",
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

/// `<workload> -M <protocol> -c <clients> -j <jobs> -T <seconds>`.
fn bench_args(opts: &Options, workload: Workload, script: &Path, seconds: u64) -> Vec<String> {
    let mut args = workload.args(script);
    args.extend(["-M".to_string(), opts.protocol.clone()]);
    for (flag, value) in [
        ("-c", u64::from(opts.clients)),
        ("-j", u64::from(opts.jobs)),
        ("-T", seconds),
    ] {
        args.push(flag.into());
        args.push(value.to_string());
    }
    args
}

/// Builds the release daemon, which `cargo bench` does not (the root package
/// does not depend on it), so every run measures the current source.
fn ensure_fulcrum_built() -> Result<PathBuf> {
    if std::env::var_os(FULCRUM_BIN_ENV).is_none() {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        eprintln!("building the daemon: cargo build --release -p fulcrum");
        let status = Command::new(&cargo)
            .args(["build", "--release", "-p", "fulcrum"])
            // Where this bench was built, so the daemon lands next to it
            // (`fulcrum_bin()` looks in this profile's directory).
            .env("CARGO_TARGET_DIR", target_dir())
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdin(Stdio::null())
            .status()
            .map_err(|e| format!("running cargo build: {e}"))?;
        if !status.success() {
            return Err(format!(
                "`cargo build --release -p fulcrum` failed ({status}); fix the build, or \
                 run: cargo build --release -p fulcrum and set {FULCRUM_BIN_ENV}=target/release/fulcrum"
            )
            .into());
        }
    }
    let bin = fulcrum_bin();
    if !bin.is_file() {
        return Err(format!(
            "no daemon binary at {}; run: cargo build --release -p fulcrum",
            bin.display()
        )
        .into());
    }
    Ok(bin)
}

/// (expected, worst-case) wall time from here on. Expected: the pgbench runs
/// plus what start-up and `pgbench -i` took on a 2-core machine; worst case:
/// every deadline expiring (pg_ctl's 60 s, the daemons' 10 s, each run's grace).
fn time_budget(opts: &Options, targets: u64, init_timeout: Duration) -> (Duration, Duration) {
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

/// The daemon's config: `[fulcrum]` and the given `[[cluster]]` sections.
fn fulcrum_config(workers: u32, clusters: &[String]) -> String {
    format!(
        "[fulcrum]\nlog = \"info\"\nworkers = {workers}\n\n{}",
        clusters.join("\n")
    )
}

/// One `[[cluster]]` listening on `listen`, in front of the primary and every
/// replica of `pg`; `consistency` is left at its default when `None`.
fn cluster_section(name: &str, listen: &str, consistency: Option<&str>, pg: &PgCluster) -> String {
    let mut out = format!(
        "[[cluster]]\nname = \"{name}\"\nprotocol = \"postgres\"\nlisten = \"{listen}\"\n\
         pool_mode = \"transaction\"\npool_size = {POOL_SIZE}\nclient_auth = \"scram-sha-256\"\n"
    );
    if let Some(consistency) = consistency {
        let _ = writeln!(out, "consistency = \"{consistency}\"");
    }
    let _ = write!(
        out,
        "\n[[cluster.backend]]\naddress = \"{}\"\nrole = \"primary\"\n\n",
        pg.primary().addr()
    );
    for replica in pg.replicas() {
        let _ = write!(
            out,
            "[[cluster.backend]]\naddress = \"{}\"\nrole = \"replica\"\n\n",
            replica.addr()
        );
    }
    let _ = writeln!(
        out,
        "[[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\""
    );
    out
}

/// One place pgbench connects to, and what it measured there, per round.
struct Target {
    name: &'static str,
    addr: String,
    tps: Vec<f64>,
    latency_ms: Vec<f64>,
    /// `--consistency-cost`: transactions committed in the app database per
    /// pgbench transaction, on the primary and on the replicas, per round.
    /// `--mysql-consistency-cost`: `Com_select` per sysbench transaction.
    primary_xacts: Vec<f64>,
    replica_xacts: Vec<f64>,
    /// `--mysql-consistency-cost`: sysbench's ignored errors (deadlocks), per round.
    ignored_errors: Vec<u64>,
    /// `--scale-out`: p50, p95 and p99 transaction latency (ms), per round.
    latency_pcts: Vec<[f64; 3]>,
}

impl Target {
    fn new(name: &'static str, addr: String) -> Target {
        Target {
            name,
            addr,
            tps: Vec::new(),
            latency_ms: Vec::new(),
            primary_xacts: Vec::new(),
            replica_xacts: Vec::new(),
            ignored_errors: Vec::new(),
            latency_pcts: Vec::new(),
        }
    }
}

/// The workload for `seconds` against `addr`, failing on any failed
/// transaction as well as on everything [`pgbench_bounded`] rejects. With
/// `log_dir`, pgbench writes its per-transaction logs there (emptied first).
fn bench_run(
    addr: &str,
    opts: &Options,
    workload: Workload,
    script: &Path,
    seconds: u64,
    log_dir: Option<&Path>,
) -> Result<PgbenchResult> {
    let mut args = bench_args(opts, workload, script, seconds);
    if let Some(dir) = log_dir {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        args.push("--log".into());
        args.push(format!("--log-prefix={}", dir.join("tx").display()));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let timeout = Duration::from_secs(seconds) + RUN_GRACE;
    let (stdout, stderr) = pgbench_bounded(addr, &args, timeout)?;
    let result = PgbenchResult::parse(&stdout, &stderr)?;
    if result.failed > 0 || result.transactions == 0 {
        return Err(format!(
            "pgbench reported {} failed and {} successful transactions\n{}",
            result.failed,
            result.transactions,
            outputs(&stdout, &stderr)
        )
        .into());
    }
    Ok(result)
}

/// Runs pgbench as `app` against `addr` (`127.0.0.1:PORT`), killing it after
/// `timeout`; returns (stdout, stderr). A non-zero exit (aborted clients) or
/// an error line on stderr is an error.
fn pgbench_bounded(addr: &str, args: &[&str], timeout: Duration) -> Result<(String, String)> {
    let (host, port) = addr.rsplit_once(':').ok_or("address without port")?;
    let mut cmd = Command::new(pg_bin("pgbench"));
    // libpq variables that would redirect or alter the connection.
    for var in [
        "PGHOST",
        "PGHOSTADDR",
        "PGPORT",
        "PGDATABASE",
        "PGUSER",
        "PGSERVICE",
        "PGOPTIONS",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("PGPASSWORD", APP_PASSWORD)
        .env("PGCONNECT_TIMEOUT", "10")
        .env("LC_MESSAGES", "C")
        .args(["-h", host, "-p", port, "-U", APP_USER])
        .args(args)
        .arg(APP_DB);
    let (status, stdout, stderr) = run_bounded(cmd, "pgbench", timeout)?;
    let errors = stderr
        .lines()
        .any(|l| l.to_ascii_lowercase().contains("error"));
    if !status.success() || errors {
        return Err(format!(
            "`pgbench {}` exited with {status}\n{}",
            args.join(" "),
            outputs(&stdout, &stderr)
        )
        .into());
    }
    Ok((stdout, stderr))
}

/// Runs `cmd` (named `what` in errors) with its output captured, killing it
/// after `timeout`; returns (status, stdout, stderr).
fn run_bounded(
    mut cmd: Command,
    what: &str,
    timeout: Duration,
) -> Result<(ExitStatus, String, String)> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("spawning {what}: {e}"))?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{what} still running after {timeout:?}: killed").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    Ok((status, stdout, stderr))
}

fn outputs(stdout: &str, stderr: &str) -> String {
    format!(
        "--- pgbench stdout (tail) ---\n{}\n--- pgbench stderr (head) ---\n{}",
        tail(stdout, 20),
        stderr.lines().take(10).collect::<Vec<_>>().join("\n")
    )
}

/// Reads a child's pipe to the end on a thread, so a full pipe never blocks it.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        text
    })
}

/// A PgBouncer in a temp dir, in front of the primary with the same pool
/// settings as Fulcrum. Stopped (and its dir removed) on drop.
struct PgBouncer {
    addr: String,
    dir: PathBuf,
    /// PgBouncer itself, or `runuser` running it when we are root.
    child: Mutex<Child>,
    /// A shell that kills PgBouncer if this process dies without dropping us.
    watchdog: Option<Child>,
}

impl PgBouncer {
    fn start(pg_port: u16) -> Result<PgBouncer> {
        PgBouncer::start_with(pg_port, 1000)
    }

    /// As [`PgBouncer::start`], accepting up to `max_clients` clients.
    fn start_with(pg_port: u16, max_clients: u32) -> Result<PgBouncer> {
        let dir =
            std::env::temp_dir().join(format!("fulcrum-bench-pgbouncer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let port = free_port();
        let ini = dir.join("pgbouncer.ini");
        let users = dir.join("userlist.txt");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n{APP_DB} = host=127.0.0.1 port={pg_port} dbname={APP_DB}\n\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = scram-sha-256\nauth_file = {}\npool_mode = transaction\n\
                 default_pool_size = {POOL_SIZE}\nmax_client_conn = {max_clients}\n\
                 logfile = {}\npidfile = {}\n",
                users.display(),
                dir.join("pgbouncer.log").display(),
                dir.join("pgbouncer.pid").display()
            ),
        )?;
        // A plain password: PgBouncer needs it to log in to PostgreSQL with SCRAM.
        std::fs::write(&users, format!("\"{APP_USER}\" \"{APP_PASSWORD}\"\n"))?;
        // PgBouncer refuses to run as root.
        let mut cmd = if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()?;
            if !status.success() {
                return Err(format!("chown -R postgres {} failed", dir.display()).into());
            }
            // runuser's PAM session resets the soft descriptor limit to
            // 1,024: raise it again for thousands of clients.
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", "sh", "-c"])
                .arg(format!(
                    "ulimit -n {} 2>/dev/null; exec \"$0\" \"$@\"",
                    max_clients + 100
                ))
                .arg(PGBOUNCER);
            c
        } else {
            Command::new(PGBOUNCER)
        };
        let child = cmd
            .arg(&ini)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawning {PGBOUNCER}: {e}"))?;
        // From here, an early return drops `bouncer`, which stops it.
        let mut bouncer = PgBouncer {
            addr: format!("127.0.0.1:{port}"),
            dir,
            child: Mutex::new(child),
            watchdog: None,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !wait_for_tcp(&bouncer.addr, Duration::from_millis(100)) {
            bouncer.check_alive()?;
            if Instant::now() >= deadline {
                return Err(format!(
                    "PgBouncer not listening on {} after 10 s{}",
                    bouncer.addr,
                    bouncer.log_tail()
                )
                .into());
            }
        }
        // Polls for this process; once it is gone, stops PgBouncer and removes its dir.
        let script = format!(
            "while [ -d /proc/{me} ]; do sleep 1; done; \
             pid=$(cat '{pidfile}' 2>/dev/null) && kill \"$pid\" 2>/dev/null; \
             i=0; while [ $i -lt 50 ] && [ -n \"$pid\" ] && kill -0 \"$pid\" 2>/dev/null; \
             do sleep 0.1; i=$((i + 1)); done; rm -rf '{dir}'",
            me = std::process::id(),
            pidfile = bouncer.pidfile().display(),
            dir = bouncer.dir.display()
        );
        bouncer.watchdog = Some(
            Command::new("sh")
                .args(["-c", &script])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?,
        );
        Ok(bouncer)
    }

    fn pidfile(&self) -> PathBuf {
        self.dir.join("pgbouncer.pid")
    }

    fn check_alive(&self) -> Result<()> {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        match child.try_wait()? {
            None => Ok(()),
            Some(status) => {
                Err(format!("PgBouncer exited with {status}{}", self.log_tail()).into())
            }
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default();
        format!("; log tail:\n{}", tail(&log, 20))
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let pidfile = self.pidfile();
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        // Killing runuser would leave PgBouncer running: signal PgBouncer by
        // the pid it wrote (SIGTERM is its immediate shutdown). The pidfile is
        // removed when it exits, so a stale pid is not signalled.
        if matches!(child.try_wait(), Ok(None)) {
            if let Ok(pid) = std::fs::read_to_string(&pidfile) {
                let _ = Command::new("kill")
                    .args(["-TERM", pid.trim()])
                    .stderr(Stdio::null())
                    .status();
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What the numbers were measured on.
struct Machine {
    date: String,
    nproc: usize,
    cpu: String,
    /// The database server and its version.
    server: String,
    /// The benchmark client (and pooler) versions.
    clients: String,
    commit: String,
    /// 1-minute load average before the first run: other work on the machine.
    load: Option<f64>,
}

impl Machine {
    /// Other work was competing for the CPUs when the runs started.
    fn busy(&self) -> bool {
        self.load.is_some_and(|l| l > self.nproc as f64 / 2.0)
    }

    /// `server`: e.g. `PostgreSQL 15.8`; `clients`: the client tools' versions.
    fn collect(server: String, clients: String) -> Result<Machine> {
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

/// The first line `program args` prints, or `unknown`.
fn first_line(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".into())
}

/// What [`Machine`] records for PostgreSQL: the server and the client tools.
fn pg_machine(primary_sql: Result<String>) -> Result<Machine> {
    let version = primary_sql?;
    let pgbench = first_line(&pg_bin("pgbench").to_string_lossy(), &["--version"]);
    let pgbouncer = first_line(PGBOUNCER, &["--version"]);
    Machine::collect(
        format!("PostgreSQL {}", version.trim()),
        format!("{pgbench}; {pgbouncer}"),
    )
}

/// The markdown report: one row per target, then the per-round figures.
fn render(opts: &Options, machine: &Machine, targets: &[Target], elapsed: Duration) -> String {
    let mut out = String::new();
    let direct = &targets[0].tps;
    let _ = writeln!(
        out,
        "### pgbench -S, {} clients, -j {}, -M {}, scale {}, {} rounds x {} s\n",
        opts.clients, opts.jobs, opts.protocol, opts.scale, opts.rounds, opts.seconds
    );
    let _ = writeln!(out, "| target | median TPS | ratio to direct (median of rounds) | avg latency (ms, median of rounds) | TPS per round |");
    let _ = writeln!(out, "|---|---:|---:|---:|---|");
    for target in targets {
        let ratios: Vec<f64> = target.tps.iter().zip(direct).map(|(t, d)| t / d).collect();
        let rounds: Vec<String> = target.tps.iter().map(|t| format!("{t:.0}")).collect();
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.2}x | {:.3} | {} |",
            target.name,
            median(&target.tps),
            median(&ratios),
            median(&target.latency_ms),
            rounds.join(" / ")
        );
    }
    out.push('\n');
    for line in machine_lines(opts, machine, elapsed) {
        let _ = writeln!(out, "- {line}");
    }
    out
}

/// `--consistency-cost`: one table per workload, then the machine.
fn render_consistency(
    opts: &Options,
    machine: &Machine,
    results: &[(Workload, Vec<Target>)],
    elapsed: Duration,
) -> String {
    let mut out = String::new();
    let replicas = match opts.replicas {
        0 => "one primary, no replicas".to_string(),
        1 => "a primary and 1 streaming replica (listed in both Fulcrum clusters)".to_string(),
        n => format!("a primary and {n} streaming replicas (listed in both Fulcrum clusters)"),
    };
    for (workload, targets) in results {
        let direct = &targets[0].tps;
        let eventual = &targets[1].tps;
        let _ = writeln!(
            out,
            "### {}, {} clients, -j {}, -M {}, scale {}, {} rounds x {} s, {replicas}\n",
            workload.title(),
            opts.clients,
            opts.jobs,
            opts.protocol,
            opts.scale,
            opts.rounds,
            opts.seconds
        );
        let _ = writeln!(
            out,
            "| target | median TPS | ratio to direct | ratio to eventual | avg latency (ms) \
             | server xacts per pgbench txn (primary + replicas) | TPS per round |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---|");
        for target in targets {
            let paired = |base: &[f64]| -> f64 {
                let ratios: Vec<f64> = target.tps.iter().zip(base).map(|(t, b)| t / b).collect();
                median(&ratios)
            };
            let rounds: Vec<String> = target.tps.iter().map(|t| format!("{t:.0}")).collect();
            let _ = writeln!(
                out,
                "| {} | {:.0} | {:.3}x | {:.3}x | {:.3} | {:.2} + {:.2} | {} |",
                target.name,
                median(&target.tps),
                paired(direct),
                paired(eventual),
                median(&target.latency_ms),
                median(&target.primary_xacts),
                median(&target.replica_xacts),
                rounds.join(" / ")
            );
        }
        let session: Vec<String> = targets[2]
            .tps
            .iter()
            .zip(eventual)
            .map(|(s, e)| format!("{:.3}", s / e))
            .collect();
        let _ = writeln!(
            out,
            "\nsession / eventual per round: {}\n",
            session.join(" / ")
        );
    }
    let _ = writeln!(
        out,
        "Ratios are medians of per-round ratios (each run against the same round's \
         direct or eventual run); latency and transactions per pgbench transaction are \
         medians over the rounds."
    );
    out.push('\n');
    for line in machine_lines(opts, machine, elapsed) {
        let _ = writeln!(out, "- {line}");
    }
    out
}

/// What the figures were measured on, one markdown list item each.
fn machine_lines(opts: &Options, machine: &Machine, elapsed: Duration) -> Vec<String> {
    let mut lines = vec![
        format!("date: {}", machine.date),
        format!(
            "machine: {} CPUs ({}), shared by the benchmark client, the database servers \
             and the proxy",
            machine.nproc, machine.cpu
        ),
        format!(
            "1-minute load average before the first run (includes `{}`): {}{}",
            if opts.mysql_consistency_cost {
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

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
