//! `--suite` on PostgreSQL: the published comparisons' shapes with pgbench
//! and sysbench against a primary and streaming replicas this module starts,
//! direct vs Fulcrum vs PgBouncer vs Pgpool-II, uncapped and CPU-capped:
//! per-query overhead (`SELECT version()`, `-S` at 5/16/45 clients, TPC-B),
//! more clients than `max_connections` (`-C -M extended`), memory per idle
//! client, read scale-out on 1-3 capped nodes, and sysbench's read, write
//! and combined workloads on a capped primary and replica. The client-count
//! scenarios are in `clients`, the capped ones in `capped`, one bounded
//! pgbench or sysbench run in `samples`.

mod capped;
mod clients;
mod samples;

use capped::capped;
use clients::{connections, idle_memory};
use samples::{pgbench_completion, pgbench_sample, prepare_sysbench, sysbench_sample};

use std::path::Path;
use std::time::{Duration, Instant};

use fulcrum_testkit::{
    free_port, FulcrumProcess, PgCluster, PgbenchResult, APP_DB, APP_PASSWORD, APP_USER,
};

use crate::cpu_caps::Throttling;
use crate::fulcrum::{cluster_section, fulcrum_alive, fulcrum_config, scale_out_section};
use crate::pgbench::{
    init_timeout, latency_percentiles, pgbench_bounded, pgbench_command, start_cluster,
};
use crate::pgbouncer::{PgBouncer, PGBOUNCER};
use crate::pgpool::{Pgpool, PGPOOL};
use crate::process::{run_bounded, tail};
use crate::report::{alternate, Goal, Row, Sample, Scenario};
use crate::suite::{caps, SuiteReport};
use crate::sysbench::{sysbench_with, SysbenchResult, SYSBENCH_PREPARE_TIMEOUT};
use crate::{Options, Result, RUN_GRACE, WARMUP_SECONDS};

const DIRECT: &str = "PostgreSQL direct";
const FULCRUM: &str = "Fulcrum";
const BOUNCER: &str = "PgBouncer";
const PGPOOL_NAME: &str = "Pgpool-II";
/// pgbench -S clients for the headline comparison.
const CLIENTS: u32 = 16;
/// sysbench threads in scenario 1 (the published runs used 20-65).
const SYSBENCH_THREADS: u32 = 32;
/// How long a run of scenario 4 may take before it is killed.
const COMPLETION_DEADLINE: Duration = Duration::from_secs(120);
/// Idle clients held open to measure Fulcrum's memory per client.
const IDLE_CLIENTS: usize = 2000;

/// The proxies of the uncapped one-node scenarios, and how to check them.
struct Proxies {
    fulcrum: FulcrumProcess,
    bouncer: Option<PgBouncer>,
    pgpool: Option<Pgpool>,
}

impl Proxies {
    /// Fulcrum, and PgBouncer and Pgpool-II when installed, in front of the
    /// primary of `cluster` (PgBouncer takes `max_clients` clients,
    /// Pgpool-II serves `children` at once).
    fn start(
        opts: &Options,
        cluster: &PgCluster,
        max_clients: u32,
        children: u32,
    ) -> Result<Proxies> {
        let listen = format!("127.0.0.1:{}", free_port());
        let section = cluster_section("bench", &listen, None, cluster);
        let fulcrum = FulcrumProcess::start(&fulcrum_config(opts.workers, &[section]))?;
        let bouncer = if Path::new(PGBOUNCER).is_file() {
            Some(PgBouncer::start_with(
                cluster.primary().port(),
                max_clients,
            )?)
        } else {
            eprintln!("PgBouncer not installed: left out");
            None
        };
        let pgpool = if Path::new(PGPOOL).is_file() {
            Some(Pgpool::start(&cluster.primary().addr(), &[], children)?)
        } else {
            eprintln!("Pgpool-II not installed: left out");
            None
        };
        Ok(Proxies {
            fulcrum,
            bouncer,
            pgpool,
        })
    }

    /// One row per target: direct first (the baseline), then the proxies.
    fn rows(&self, cluster: &PgCluster) -> Vec<Row> {
        let mut rows = vec![
            Row::new(DIRECT, cluster.primary().addr()),
            Row::new(FULCRUM, self.fulcrum.listen_addrs()[0].clone()),
        ];
        if let Some(b) = &self.bouncer {
            rows.push(Row::new(BOUNCER, b.addr.clone()));
        }
        if let Some(p) = &self.pgpool {
            rows.push(Row::new(PGPOOL_NAME, p.addr.clone()));
        }
        rows
    }

    fn check(&self) -> Result<()> {
        fulcrum_alive(&self.fulcrum)?;
        if let Some(b) = &self.bouncer {
            b.check_alive()?;
        }
        if let Some(p) = &self.pgpool {
            p.check_alive()?;
        }
        Ok(())
    }
}

/// Runs every PostgreSQL scenario, adding each result (or failure) to `report`.
pub fn run(opts: &Options, report: &mut SuiteReport) {
    fulcrum_testkit::raise_fd_limit();
    let wanted = |part: &str| !opts.skip.iter().any(|s| s == part);
    if wanted("pg-uncapped") {
        report.attempt("PostgreSQL, one node, uncapped", |r| uncapped(opts, r));
    }
    for (clients, max) in [(600, 500), (2000, 100)] {
        if !wanted("pg-connections") {
            break;
        }
        report.attempt(
            &format!("PostgreSQL, {clients} clients against max_connections {max}"),
            |r| connections(opts, clients, max, r),
        );
    }
    if wanted("pg-capped") {
        report.attempt("PostgreSQL, capped nodes", |r| capped(opts, r));
    }
}

/// Scenario 3 and the single-node targets: `SELECT version()` with 1 client,
/// `-S` with 5, 16 and 45 clients, TPC-B with 16; then memory per idle client.
fn uncapped(opts: &Options, report: &mut SuiteReport) -> Result<()> {
    let single = Options {
        replicas: 0,
        ..opts.clone()
    };
    let cluster = start_cluster(&single, init_timeout(opts))?;
    report.version(format!(
        "PostgreSQL {}",
        cluster.primary().sql("SHOW server_version")?.trim()
    ));
    let proxies = Proxies::start(opts, &cluster, 1000, 45 + crate::pgpool::SPARE_CHILDREN)?;
    let script = std::env::temp_dir().join(format!("fulcrum-suite-{}.sql", std::process::id()));
    std::fs::write(&script, "SELECT version();\n")?;
    let version = format!("-f{}", script.display());
    let setup = |what: &str, clients: u32| {
        format!(
            "{what}, {clients} client(s), `-j {}`, `-M simple`, scale {}, one PostgreSQL \
             server (uncapped); PgBouncer and Fulcrum with 20 server connections, \
             Pgpool-II with `num_init_children` 49.",
            clients.min(2),
            opts.scale
        )
    };
    let runs: [(&str, String, &str, u32, String); 5] = [
        (
            "pg-version-1",
            "Per-query overhead: `SELECT version()`, 1 client (PostgreSQL)".into(),
            version.as_str(),
            1,
            setup("`pgbench -f` running `SELECT version();`", 1),
        ),
        (
            "pg-select-5",
            "pgbench -S, 5 clients (PostgreSQL, one node)".into(),
            "-S",
            5,
            setup("`pgbench -S`", 5),
        ),
        (
            "pg-select-16",
            "pgbench -S, 16 clients (PostgreSQL, one node)".into(),
            "-S",
            CLIENTS,
            setup("`pgbench -S`", CLIENTS),
        ),
        (
            "pg-select-45",
            "pgbench -S, 45 clients (PostgreSQL, one node)".into(),
            "-S",
            45,
            setup("`pgbench -S`", 45),
        ),
        (
            "pg-tpcb-16",
            "pgbench TPC-B (writes), 16 clients (PostgreSQL, one node)".into(),
            "-b tpcb-like",
            CLIENTS,
            setup("`pgbench` (built-in TPC-B-like script)", CLIENTS),
        ),
    ];
    for (id, title, script_arg, clients, setup) in runs {
        let mut scenario = Scenario::new(id, title, setup);
        scenario.rows = proxies.rows(&cluster);
        let mut args: Vec<String> = script_arg.split(' ').map(String::from).collect();
        args.extend(["-M", "simple", "-c"].map(String::from));
        args.push(clients.to_string());
        args.push("-j".into());
        args.push(clients.min(2).to_string());
        alternate(
            &mut scenario.rows,
            opts.rounds,
            true,
            |row, warm| {
                let seconds = if warm { WARMUP_SECONDS } else { opts.seconds };
                pgbench_sample(&row.addr, &args, seconds, !warm)
            },
            || proxies.check(),
        )?;
        goals_uncapped(&mut scenario);
        report.add(scenario);
    }
    let _ = std::fs::remove_file(&script);
    let memory = idle_memory(&proxies.fulcrum)?;
    report.add(memory);
    Ok(())
}

/// The single-node targets of docs/benchmarks.md, for the scenario they belong to.
fn goals_uncapped(s: &mut Scenario) {
    let (Some(direct), Some(fulcrum)) = (s.row(DIRECT).cloned(), s.row(FULCRUM).cloned()) else {
        return;
    };
    match s.id.as_str() {
        "pg-version-1" => {
            if let (Some(d), Some(f)) = (direct.latency(0), fulcrum.latency(0)) {
                let added = f - d;
                s.goals.push(Goal {
                    what: "added latency p50, 1 client, `SELECT version()` (PostgreSQL): \
                           <= 0.050 ms over direct"
                        .into(),
                    measured: format!("{added:.3} ms ({f:.3} vs {d:.3})"),
                    met: added <= 0.050,
                });
            }
        }
        "pg-select-16" => {
            s.goals.push(Goal::ratio_at_least(
                "pgbench -S, 16 clients, one node",
                &fulcrum,
                &direct,
                0.95,
            ));
            if let Some(bouncer) = s.row(BOUNCER).cloned() {
                s.goals.push(Goal::ratio_at_least(
                    "pgbench -S, 16 clients, one node, ahead of PgBouncer",
                    &fulcrum,
                    &bouncer,
                    1.0,
                ));
            }
        }
        "pg-tpcb-16" => s.goals.push(Goal::ratio_at_least(
            "pgbench TPC-B, 16 clients, one node",
            &fulcrum,
            &direct,
            0.97,
        )),
        _ => {}
    }
}
