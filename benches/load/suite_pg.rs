//! `--suite` on PostgreSQL: the published comparisons' shapes with pgbench
//! and sysbench against a primary and streaming replicas this module starts,
//! direct vs Fulcrum vs PgBouncer vs Pgpool-II, uncapped and CPU-capped:
//! per-query overhead (`SELECT version()`, `-S` at 5/16/45 clients, TPC-B),
//! more clients than `max_connections` (`-C -M extended`), memory per idle
//! client, read scale-out on 1-3 capped nodes, and sysbench's read, write
//! and combined workloads on a capped primary and replica.

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

/// Scenario 4: `clients` pgbench clients, each connecting anew for every
/// transaction (`-C -M extended`, `SELECT 1`), against a server allowing
/// `max_connections`: how many transactions complete, directly and pooled.
fn connections(
    opts: &Options,
    clients: u32,
    max_connections: u32,
    report: &mut SuiteReport,
) -> Result<()> {
    let cluster = PgCluster::builder()
        .max_connections(max_connections)
        .start()?;
    // Pgpool-II opens one server connection per child: stay under the limit.
    let children = (max_connections - 10).min(90);
    let proxies = Proxies::start(opts, &cluster, clients + 100, children)?;
    let script = std::env::temp_dir().join(format!("fulcrum-suite-c-{}.sql", std::process::id()));
    std::fs::write(&script, "SELECT 1;\n")?;
    let per_client = 5u64;
    let args: Vec<String> = vec![
        format!("-f{}", script.display()),
        "-C".into(),
        "-M".into(),
        "extended".into(),
        "-c".into(),
        clients.to_string(),
        "-j".into(),
        "2".into(),
        "-t".into(),
        per_client.to_string(),
    ];
    let mut scenario = Scenario::new(
        &format!("pg-connections-{clients}"),
        format!(
            "{clients} clients against max_connections {max_connections}, `pgbench -C -M \
             extended` (PostgreSQL)"
        ),
        format!(
            "`pgbench -C -M extended -c {clients} -j 2 -t {per_client}` running `SELECT 1` \
             (a new connection for every transaction), against a server with \
             `max_connections = {max_connections}`; Fulcrum and PgBouncer pool 20 server \
             connections, Pgpool-II runs {children} children (one server connection each). \
             One run per target; TPS includes connecting."
        ),
    );
    scenario.rows = proxies.rows(&cluster);
    let attempted = u64::from(clients) * per_client;
    let mut rows = std::mem::take(&mut scenario.rows);
    for row in &mut rows {
        eprintln!("  {}: {clients} clients", row.target);
        let sample = match pgbench_completion(&row.addr, &args, attempted) {
            Ok(sample) => sample,
            Err(e) if e.to_string().contains("still running") => {
                scenario.notes.push(format!(
                    "{}: pgbench had not finished after {} s and was killed; its \
                     transactions are counted as not completed.",
                    row.target,
                    COMPLETION_DEADLINE.as_secs()
                ));
                Sample {
                    tps: 0.0,
                    latency_ms: None,
                    completed: Some((0, attempted)),
                }
            }
            Err(e) => return Err(e),
        };
        proxies.check()?;
        eprintln!(
            "  {:<20} {:?} completed, {:.0} TPS",
            row.target, sample.completed, sample.tps
        );
        row.samples.push(sample);
    }
    scenario.rows = rows;
    let _ = std::fs::remove_file(&script);
    if let Some(f) = scenario.row(FULCRUM) {
        let (done, of) = f.completed().unwrap_or((0, attempted));
        scenario.goals.push(Goal {
            what: format!(
                "{clients} clients against max_connections {max_connections}: 100 % complete \
                 through Fulcrum"
            ),
            measured: format!("{done} / {of}"),
            met: done == of,
        });
    }
    scenario.notes.push(
        "The published PgBouncer comparison: 600 clients against `max_connections` 500 \
         completed 33 % directly and 100 % pooled. Clients that cannot connect are \
         aborted by pgbench; their remaining transactions count as not completed."
            .into(),
    );
    report.add(scenario);
    Ok(())
}

/// Scenario 2 and 1 on capped nodes: a primary and 2 replicas, each server in
/// its own cgroup; pgbench -S read scale-out over 1, 2 and 3 nodes against
/// Pgpool-II on 3; sysbench on the primary and one replica.
fn capped(opts: &Options, report: &mut SuiteReport) -> Result<()> {
    let Some(caps) = caps(opts, 3, report) else {
        return Ok(());
    };
    let three = Options {
        replicas: 2,
        ..opts.clone()
    };
    let cluster = start_cluster(&three, init_timeout(opts))?;
    report.version(format!(
        "PostgreSQL {}",
        cluster.primary().sql("SHOW server_version")?.trim()
    ));
    prepare_sysbench(opts, &cluster)?;
    cluster.wait_replicas_caught_up(SYSBENCH_PREPARE_TIMEOUT)?;
    for (i, node) in cluster.nodes().enumerate() {
        caps.add_server(i, node.data_dir())?;
    }
    let primary = cluster.primary().addr();
    let replicas: Vec<String> = cluster.replicas().iter().map(|r| r.addr()).collect();
    let mut sections = Vec::new();
    let mut listens = Vec::new();
    for nodes in 1..=3 {
        let listen = format!("127.0.0.1:{}", free_port());
        sections.push(scale_out_section(
            &format!("nodes{nodes}"),
            &listen,
            &primary,
            &replicas[..nodes - 1],
        ));
        listens.push(listen);
    }
    let fulcrum = FulcrumProcess::start(&fulcrum_config(opts.workers, &sections))?;
    let children = SYSBENCH_THREADS + crate::pgpool::SPARE_CHILDREN;
    let pgpool = if Path::new(PGPOOL).is_file() {
        Some((
            Pgpool::start(&primary, &replicas[..1], children)?,
            Pgpool::start(&primary, &replicas, children)?,
        ))
    } else {
        None
    };
    let check = || -> Result<()> {
        fulcrum_alive(&fulcrum)?;
        if let Some((two, three)) = &pgpool {
            two.check_alive()?;
            three.check_alive()?;
        }
        Ok(())
    };
    let throttling = || caps.throttling_all(3);
    let cap = format!("each server capped at {} CPU", opts.cpu_quota);

    // Scenario 2: read scale-out.
    let before = throttling();
    let mut scale = Scenario::new(
        "pg-scale-out",
        "Read scale-out: pgbench -S on 1, 2 and 3 capped nodes (PostgreSQL)",
        format!(
            "`pgbench -S -M simple -c {CLIENTS} -j 2`, scale {}, a primary and 2 streaming \
             replicas, {cap}; Fulcrum (`consistency = \"eventual\"`, `reads_on_primary`) \
             reads from 1, 2 or 3 nodes, Pgpool-II (streaming replication mode, load \
             balancing, equal weights) from 3. The published Pgpool-II figures: 1,552 TPS \
             direct, 1,623 / 2,428 / 2,926 / 3,326 with 1 / 2 / 3 / 4 nodes.",
            opts.scale
        ),
    );
    scale
        .rows
        .push(Row::new(DIRECT, primary.clone()).with_nodes(1));
    for (i, listen) in listens.iter().enumerate() {
        let name = format!("Fulcrum, {} node{}", i + 1, if i == 0 { "" } else { "s" });
        scale
            .rows
            .push(Row::new(name, listen.clone()).with_nodes(i + 1));
    }
    if let Some((_, three)) = &pgpool {
        scale
            .rows
            .push(Row::new("Pgpool-II, 3 nodes", three.addr.clone()).with_nodes(3));
    }
    let args: Vec<String> = ["-S", "-M", "simple", "-c", &CLIENTS.to_string(), "-j", "2"]
        .map(String::from)
        .to_vec();
    alternate(
        &mut scale.rows,
        opts.rounds,
        true,
        |row, warm| {
            let seconds = if warm { WARMUP_SECONDS } else { opts.seconds };
            pgbench_sample(&row.addr, &args, seconds, !warm)
        },
        check,
    )?;
    let after = throttling();
    scale.notes.push(throttle_note(&before, &after, &cluster));
    let direct = scale.rows[0].clone();
    let three_nodes = scale.rows[3].clone();
    scale.goals.push(Goal::ratio_at_least(
        "pgbench -S, 3 capped nodes",
        &three_nodes,
        &direct,
        2.85,
    ));
    if let Some(pool) = scale.row("Pgpool-II, 3 nodes").cloned() {
        scale.goals.push(Goal::ratio_at_least(
            "pgbench -S, 3 capped nodes, ahead of Pgpool-II",
            &three_nodes,
            &pool,
            1.0,
        ));
    }
    report.add(scale);

    // Scenario 1: sysbench on a primary and one replica.
    let workloads: [(&str, &[&str], &str); 4] = [
        ("point-select", &["oltp_point_select"], "simple read"),
        (
            "read-only",
            &["oltp_read_only", "--skip-trx=on"],
            "complex read",
        ),
        ("write-only", &["oltp_write_only"], "write"),
        ("read-write", &["oltp_read_write"], "combined"),
    ];
    for (id, args, shape) in workloads {
        let mut s = Scenario::new(
            &format!("pg-s1-{id}"),
            format!(
                "sysbench {} ({shape}), primary + 1 replica, capped (PostgreSQL)",
                args[0]
            ),
            format!(
                "`sysbench --db-driver=pgsql {} --threads={SYSBENCH_THREADS}`, 2 tables of \
                 {} rows, a primary and 1 streaming replica, {cap}. The published shape \
                 (1 master + 1 slave, 20-65 clients): MySQL Proxy +87.7 % on simple reads, \
                 +92.5 % on complex reads, equal to direct on writes; Pgpool-II 50-58 % of \
                 direct on reads, 84 % on writes.",
                args.join(" "),
                opts.table_size
            ),
        );
        s.rows.push(Row::new(DIRECT, primary.clone()));
        s.rows
            .push(Row::new("Fulcrum, 2 nodes", listens[1].clone()));
        if let Some((two, _)) = &pgpool {
            s.rows
                .push(Row::new("Pgpool-II, 2 nodes", two.addr.clone()));
        }
        alternate(
            &mut s.rows,
            opts.rounds,
            true,
            |row, warm| {
                let seconds = if warm { WARMUP_SECONDS } else { opts.seconds };
                sysbench_sample(opts, &row.addr, args, seconds)
            },
            check,
        )?;
        let (direct, fulcrum) = (s.rows[0].clone(), s.rows[1].clone());
        if id == "write-only" {
            s.goals.push(Goal::ratio_at_least(
                "sysbench oltp_write_only, capped primary",
                &fulcrum,
                &direct,
                0.97,
            ));
        }
        if let Some(pool) = s.row("Pgpool-II, 2 nodes").cloned() {
            s.goals.push(Goal::ratio_at_least(
                &format!("sysbench {}, ahead of Pgpool-II", args[0]),
                &fulcrum,
                &pool,
                1.0,
            ));
        }
        report.add(s);
    }
    drop(pgpool);
    drop(fulcrum);
    drop(cluster);
    drop(caps);
    Ok(())
}

/// The share of CPU periods in which each node's cap held it back.
fn throttle_note(before: &[Throttling], after: &[Throttling], cluster: &PgCluster) -> String {
    let shares: Vec<String> = before
        .iter()
        .zip(after)
        .zip(cluster.nodes())
        .map(|((&before, after), node)| {
            format!("{} {}", node.name(), after.since(before).percent())
        })
        .collect();
    format!(
        "CPU periods in which the cap throttled each server during this scenario (warm-ups \
         included; a node serves only some targets): {}. A throttled node is the \
         bottleneck, as on a real cluster.",
        shares.join(", ")
    )
}

/// One timed pgbench run (`-T seconds`), failing on any failed transaction;
/// with `log`, latency percentiles from its per-transaction log.
fn pgbench_sample(addr: &str, args: &[String], seconds: u64, log: bool) -> Result<Sample> {
    let mut all = args.to_vec();
    all.extend(["-T".to_string(), seconds.to_string()]);
    let dir = log
        .then(|| std::env::temp_dir().join(format!("fulcrum-suite-txlog-{}", std::process::id())));
    if let Some(d) = &dir {
        let _ = std::fs::remove_dir_all(d);
        std::fs::create_dir(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
        all.push("--log".into());
        all.push(format!("--log-prefix={}", d.join("tx").display()));
    }
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    let run = pgbench_bounded(addr, &refs, Duration::from_secs(seconds) + RUN_GRACE);
    let latency = match (&run, &dir) {
        (Ok(_), Some(d)) => Some(latency_percentiles(d)),
        _ => None,
    };
    if let Some(d) = &dir {
        let _ = std::fs::remove_dir_all(d);
    }
    let (stdout, stderr) = run?;
    let result = PgbenchResult::parse(&stdout, &stderr)?;
    if result.failed > 0 || result.transactions == 0 {
        return Err(format!(
            "pgbench: {} failed, {} successful transactions\n{}",
            result.failed,
            result.transactions,
            tail(&stdout, 10)
        )
        .into());
    }
    Ok(Sample {
        tps: result.tps,
        latency_ms: latency.transpose()?,
        completed: None,
    })
}

/// One pgbench run of `-t` transactions per client that may abort clients:
/// how many of `attempted` completed (`actually processed: X/Y`).
fn pgbench_completion(addr: &str, args: &[String], attempted: u64) -> Result<Sample> {
    let cmd = pgbench_command(addr, args)?;
    let started = Instant::now();
    let (_status, stdout, stderr) = run_bounded(cmd, "pgbench", COMPLETION_DEADLINE)?;
    let elapsed = started.elapsed().as_secs_f64();
    let done = stdout
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("number of transactions actually processed:")
        })
        .and_then(|rest| rest.trim().split('/').next()?.trim().parse::<u64>().ok())
        .unwrap_or(0);
    if done == 0 && !stdout.contains("actually processed") {
        eprintln!(
            "  pgbench printed no summary: {}",
            stderr.lines().next().unwrap_or("")
        );
    }
    let tps = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("tps = "))
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(done as f64 / elapsed);
    Ok(Sample {
        tps,
        latency_ms: None,
        completed: Some((done, attempted)),
    })
}

/// `sysbench --db-driver=pgsql` against `addr` as the app user.
fn sysbench_pg(opts: &Options, addr: &str, args: &[&str], timeout: Duration) -> Result<String> {
    let (host, port) = addr.rsplit_once(':').ok_or("address without port")?;
    let connection = [
        "--db-driver=pgsql".to_string(),
        format!("--pgsql-host={host}"),
        format!("--pgsql-port={port}"),
        format!("--pgsql-user={APP_USER}"),
        format!("--pgsql-password={APP_PASSWORD}"),
        format!("--pgsql-db={APP_DB}"),
    ];
    sysbench_with(&connection, opts, args, timeout)
}

/// sysbench's tables, created through the primary.
fn prepare_sysbench(opts: &Options, cluster: &PgCluster) -> Result<()> {
    eprintln!("sysbench prepare (PostgreSQL) ...");
    sysbench_pg(
        opts,
        &cluster.primary().addr(),
        &["oltp_common", "prepare"],
        SYSBENCH_PREPARE_TIMEOUT,
    )?;
    Ok(())
}

/// One timed sysbench run, with latency percentiles from `--histogram`.
fn sysbench_sample(opts: &Options, addr: &str, workload: &[&str], seconds: u64) -> Result<Sample> {
    let mut args: Vec<String> = workload.iter().map(|a| a.to_string()).collect();
    args.extend([
        format!("--threads={SYSBENCH_THREADS}"),
        format!("--time={seconds}"),
        "--events=0".into(),
        "--histogram=on".into(),
        "run".into(),
    ]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let stdout = sysbench_pg(opts, addr, &refs, Duration::from_secs(seconds) + RUN_GRACE)?;
    let result = SysbenchResult::parse(&stdout)?;
    if result.transactions == 0 || result.reconnects > 0 {
        return Err(format!(
            "sysbench: {} transactions, {} reconnects\n{}",
            result.transactions,
            result.reconnects,
            tail(&stdout, 20)
        )
        .into());
    }
    Ok(Sample {
        tps: result.tps,
        latency_ms: crate::report::sysbench_percentiles(&stdout),
        completed: None,
    })
}

/// Memory per idle client: Fulcrum's resident set before and after
/// [`IDLE_CLIENTS`] clients have logged in and sit idle.
fn idle_memory(fulcrum: &FulcrumProcess) -> Result<Scenario> {
    let pid = fulcrum.pid();
    let addr = fulcrum.listen_addrs()[0].clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let before = rss_kb(pid)?;
    let clients = rt.block_on(async {
        let (host, port) = addr.rsplit_once(':').expect("host:port");
        let conf = format!(
            "host={host} port={port} user={APP_USER} password={APP_PASSWORD} dbname={APP_DB}"
        );
        let mut clients = Vec::with_capacity(IDLE_CLIENTS);
        for batch in 0..IDLE_CLIENTS.div_ceil(100) {
            let n = (IDLE_CLIENTS - batch * 100).min(100);
            let connects = (0..n).map(|_| tokio_postgres::connect(&conf, tokio_postgres::NoTls));
            for result in futures_util::future::join_all(connects).await {
                let (client, conn) = result.map_err(|e| format!("idle client: {e}"))?;
                tokio::spawn(conn);
                clients.push(client);
            }
        }
        Ok::<_, crate::Error>(clients)
    })?;
    std::thread::sleep(Duration::from_millis(500));
    let after = rss_kb(pid)?;
    drop(clients);
    drop(rt);
    let per_client = (after.saturating_sub(before)) as f64 / IDLE_CLIENTS as f64;
    let mut s = Scenario::new(
        "pg-memory",
        "Memory per idle client connection (PostgreSQL)",
        format!(
            "Fulcrum's resident set (VmRSS) after a warm run, then with {IDLE_CLIENTS} \
             tokio-postgres clients logged in (SCRAM) and idle."
        ),
    );
    s.goals.push(Goal {
        what: format!("resident set per idle client ({IDLE_CLIENTS} clients): <= 16 kB"),
        measured: format!("{per_client:.1} kB ({before} kB -> {after} kB)"),
        met: per_client <= 16.0,
    });
    Ok(s)
}

/// VmRSS of `pid` in kB.
fn rss_kb(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .ok_or_else(|| format!("no VmRSS for pid {pid}").into())
}
