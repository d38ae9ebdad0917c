//! `--mysql-cache`: the result cache on MariaDB (issue 46), the sibling of
//! `--cache`. One MariaDB primary (no replicas, MariaDB's thread pool as the
//! suite's capped regime has it) in its own cgroup capped at `--cpu-quota`
//! CPUs (0.3 by default, as `--cache` caps PostgreSQL), sysbench
//! `oltp_point_select` over `--table-size` rows in each of its 2 tables (500
//! by default: 1,000 keys, as `--cache` reads), with `--db-ps-mode=auto`
//! (COM_STMT_EXECUTE) then `disable` (COM_QUERY), against three targets in
//! alternation: MariaDB direct, Fulcrum without a cache, and Fulcrum with a
//! `[cluster.cache]` rule on `sbtest1` and `sbtest2` (`invalidation =
//! "proxy"`). Besides TPS, the daemon's user and system CPU per transaction
//! (the cache row against the no-cache row) and the hit ratio from its
//! `/metrics`; the report goes to `target/bench-mysql-cache.md`.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster};

use crate::cpu_caps::{CpuCaps, Throttling};
use crate::fulcrum::{ensure_fulcrum_built, fulcrum_alive, fulcrum_config, push_backends_and_user};
use crate::machine::{machine_lines, Machine};
use crate::measure::{process_usage, process_user_us, Target};
use crate::mode_cache::{cache_counts, cache_lines, paired, GOAL_RATIO};
use crate::process::first_line;
use crate::sysbench::{
    sysbench, sysbench_run, SysbenchWorkload, SYSBENCH_PREPARE_TIMEOUT, SYSBENCH_TABLES,
};
use crate::{median, publish_report, Options, Result, POOL_SIZE, RUN_GRACE, WARMUP_SECONDS};

/// The cache of the `cached` cluster: a rule on sysbench's tables.
const CACHE_KEY: &str = "cache = { mode = \"rules\", invalidation = \"proxy\", \
                         rule = [{ tables = [\"sbtest1\", \"sbtest2\"] }] }";

/// The capped server's own setting, as in the suite's capped regime
/// (`suite_mysql/capped.rs` says why: with a thread per connection a
/// capped server's CPU per request depends on the client's round trip).
const THREAD_POOL: (&str, &str) = ("thread_handling", "pool-of-threads");

/// The target names, in the order of [`Measured::targets`].
const DIRECT: &str = "MariaDB direct";
const PLAIN: &str = "Fulcrum, no cache";
const CACHED: &str = "Fulcrum, cache rule";

/// One `--db-ps-mode`'s runs.
struct Measured {
    ps_mode: String,
    targets: Vec<Target>,
    hits: f64,
    misses: f64,
    throttled: Throttling,
}

/// `--mysql-cache`: direct vs Fulcrum without and with a cache rule, on a
/// MariaDB primary capped so that the server is the limit.
pub(crate) fn run_mysql_cache(opts: &Options) -> Result<()> {
    let started = Instant::now();
    let sysbench_version = first_line("sysbench", &["--version"]);
    if sysbench_version == "unknown" {
        return Err("sysbench not found (install: apt-get install sysbench)".into());
    }
    // Declared before the cluster, so dropped after it.
    let caps = if opts.cpu_quota > 0.0 {
        match CpuCaps::create(1, opts.cpu_quota, opts.cpu_period_us) {
            Ok(caps) => Some(caps),
            Err(reason) => {
                println!(
                    "MariaDB cache benchmark SKIPPED: cannot cap the CPU of the primary: \
                     {reason} (needs root and a writable cgroup; --cpu-quota 0 runs uncapped)"
                );
                return Ok(());
            }
        }
    } else {
        eprintln!("--cpu-quota 0: the primary runs uncapped");
        None
    };
    let bin = ensure_fulcrum_built()?;
    let ps_modes: Vec<String> = if opts.ps_mode_given {
        vec![opts.ps_mode.clone()]
    } else {
        vec!["auto".into(), "disable".into()]
    };
    let runs = ps_modes.len() as u64 * 3 * opts.rounds as u64;
    let expected = ps_modes.len() as u64 * 3 * WARMUP_SECONDS + runs * (opts.seconds + 1) + 20;
    let worst = expected + (ps_modes.len() as u64 * 3 + runs) * RUN_GRACE.as_secs() + 60 + 120;
    eprintln!(
        "MariaDB result cache: --db-ps-mode {} x 3 targets x {} rounds x {} s after \
         `sysbench prepare` ({SYSBENCH_TABLES} tables x {} rows): about {expected} s; every \
         step has a deadline, so at most {worst} s",
        ps_modes.join(", "),
        opts.rounds,
        opts.seconds,
        opts.table_size
    );

    let cluster = MariaCluster::builder()
        .setting(THREAD_POOL.0, THREAD_POOL.1)
        .start()?;
    let primary = cluster.primary();
    sysbench(
        opts,
        primary.port(),
        &["oltp_common", "prepare"],
        SYSBENCH_PREPARE_TIMEOUT,
    )
    .map_err(|e| format!("sysbench prepare: {e}"))?;
    // `sysbench prepare` runs uncapped; the cap applies from here on.
    if let Some(caps) = &caps {
        let pid = primary
            .pid()
            .ok_or_else(|| format!("{}: mariadbd is not running", primary.name()))?;
        caps.add_process(0, pid)?;
        eprintln!(
            "{}: mariadbd {pid} in {} ({} CPU)",
            primary.name(),
            caps.groups[0].display(),
            opts.cpu_quota
        );
    }
    let version = primary.sql("SELECT VERSION()")?;
    let machine = Machine::collect(format!("MariaDB {}", version.trim()), sysbench_version)?;
    machine.warn_if_busy();
    let result = measure_all(opts, &bin, &cluster, caps.as_ref(), &ps_modes);
    drop(cluster);
    drop(caps);
    let results = result?;
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load_after: Vec<&str> = load_after.split_whitespace().take(3).collect();
    let mut report = render(opts, &machine, &results, started.elapsed());
    let _ = writeln!(
        report,
        "- load average (1, 5, 15 min) after the last run: {}",
        load_after.join(" ")
    );
    publish_report(&report, "bench-mysql-cache.md")?;
    Ok(())
}

/// One MariaDB `[[cluster]]` on `listen` in front of the primary alone.
fn section(name: &str, listen: &str, keys: &str, primary: &str) -> String {
    let mut out = format!(
        "[[cluster]]\nname = \"{name}\"\nprotocol = \"mysql\"\nlisten = \"{listen}\"\n\
         pool_mode = \"transaction\"\npool_size = {POOL_SIZE}\n\
         health_user = \"root\"\nhealth_password = \"\"\n{keys}"
    );
    push_backends_and_user(&mut out, primary, &[]);
    out
}

/// Starts the daemon (one listener without a cache, one with the rule) and
/// runs every `--db-ps-mode`'s rounds against the three targets.
fn measure_all(
    opts: &Options,
    bin: &std::path::Path,
    cluster: &MariaCluster,
    caps: Option<&CpuCaps>,
    ps_modes: &[String],
) -> Result<Vec<Measured>> {
    let direct = cluster.primary().addr();
    let plain_listen = format!("127.0.0.1:{}", free_port());
    let cached_listen = format!("127.0.0.1:{}", free_port());
    let sections = [
        section("plain", &plain_listen, "", &direct),
        section("cached", &cached_listen, &format!("{CACHE_KEY}\n"), &direct),
    ];
    let metrics_port = free_port();
    let config = fulcrum_config(opts.workers, &sections).replacen(
        "[fulcrum]\n",
        &format!("[fulcrum]\nmetrics = \"127.0.0.1:{metrics_port}\"\n"),
        1,
    );
    let fulcrum = FulcrumProcess::start(&config)?;
    eprintln!(
        "Fulcrum {}: no cache on {plain_listen}, cache rule on {cached_listen}",
        bin.display()
    );
    let check_alive = || fulcrum_alive(&fulcrum);
    let port_of = |addr: &str| -> u16 {
        addr.rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .expect("listen address with a port")
    };
    let mut results = Vec::new();
    for ps_mode in ps_modes {
        eprintln!("== --db-ps-mode={ps_mode}");
        let mut run_opts = opts.clone();
        run_opts.ps_mode = ps_mode.clone();
        let mut targets = vec![
            Target::new(DIRECT, direct.clone()),
            Target::new(PLAIN, plain_listen.clone()).proxy(Some(fulcrum.pid())),
            Target::new(CACHED, cached_listen.clone()).proxy(Some(fulcrum.pid())),
        ];
        let (hits0, misses0) = cache_counts(metrics_port);
        let throttling0 = caps.map(|c| c.throttling(0));
        for target in &targets {
            eprintln!("warm-up: {} for {WARMUP_SECONDS} s", target.name);
            sysbench_run(
                &run_opts,
                port_of(&target.addr),
                SysbenchWorkload::PointSelect,
                WARMUP_SECONDS,
            )
            .map_err(|e| format!("warm-up against {}: {e}", target.name))?;
            check_alive()?;
        }
        let n = targets.len();
        for round in 0..opts.rounds {
            // Rotate the starting target so none always runs right after another.
            for i in 0..n {
                let target = &mut targets[(round + i) % n];
                let usage0 = target.proxy_pid.and_then(process_usage);
                let user0 = target.proxy_pid.and_then(process_user_us);
                let result = sysbench_run(
                    &run_opts,
                    port_of(&target.addr),
                    SysbenchWorkload::PointSelect,
                    opts.seconds,
                )
                .map_err(|e| format!("round {} against {}: {e}", round + 1, target.name))?;
                let usage1 = target.proxy_pid.and_then(process_usage);
                let user1 = target.proxy_pid.and_then(process_user_us);
                check_alive()?;
                let txns = result.transactions.max(1) as f64;
                let mut cpu = String::new();
                if let (Some((c0, _)), Some((c1, _)), Some(u0), Some(u1)) =
                    (usage0, usage1, user0, user1)
                {
                    // One daemon, only this listener has clients: its CPU.
                    let (total, user) = ((c1 - c0) / txns, (u1 - u0) / txns);
                    target.cpu_us_per_txn.push(total);
                    target.user_us_per_txn.push(user);
                    cpu = format!("  Fulcrum user {user:.1} system {:.1} us/txn", total - user);
                }
                eprintln!(
                    "round {}/{}: {:<20} {:>8.0} TPS  latency avg {:.3} ms{cpu}",
                    round + 1,
                    opts.rounds,
                    target.name,
                    result.tps,
                    result.latency_avg_ms
                );
                target.tps.push(result.tps);
                target.latency_ms.push(result.latency_avg_ms);
            }
        }
        let (hits1, misses1) = cache_counts(metrics_port);
        let throttled = match (caps, throttling0) {
            (Some(c), Some(before)) => c.throttling(0).since(before),
            _ => Throttling::default(),
        };
        results.push(Measured {
            ps_mode: ps_mode.clone(),
            targets,
            hits: hits1 - hits0,
            misses: misses1 - misses0,
            throttled,
        });
    }
    drop(fulcrum);
    Ok(results)
}

/// The per-round system CPU per transaction (total minus user).
fn system(t: &Target) -> Vec<f64> {
    t.cpu_us_per_txn
        .iter()
        .zip(&t.user_us_per_txn)
        .map(|(c, u)| c - u)
        .collect()
}

/// A table per `--db-ps-mode` with its goal line, then the machine.
fn render(opts: &Options, machine: &Machine, results: &[Measured], elapsed: Duration) -> String {
    let mut out = String::new();
    let cap = if opts.cpu_quota > 0.0 {
        format!("the primary capped at {} CPU", opts.cpu_quota)
    } else {
        "the primary uncapped".to_string()
    };
    for m in results {
        let _ = writeln!(
            out,
            "### sysbench oltp_point_select, --db-ps-mode={}, {} threads, {SYSBENCH_TABLES} \
             tables x {} rows, {} rounds x {} s, {cap}\n",
            m.ps_mode, opts.clients, opts.table_size, opts.rounds, opts.seconds
        );
        let _ = writeln!(
            out,
            "| target | median TPS | spread (min – max) | ratio to direct | ratio to Fulcrum, \
             no cache | avg latency (ms) | Fulcrum user / system CPU per txn, ratio to no \
             cache | TPS per round |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---|");
        let (direct, plain) = (&m.targets[0], &m.targets[1]);
        for t in &m.targets {
            let lo = t.tps.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = t.tps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let med = median(&t.tps);
            let cpu = if t.user_us_per_txn.is_empty() {
                "–".to_string()
            } else {
                format!(
                    "{:.2}x / {:.2}x ({:.1} / {:.1} µs)",
                    paired(&t.user_us_per_txn, &plain.user_us_per_txn),
                    paired(&system(t), &system(plain)),
                    median(&t.user_us_per_txn),
                    median(&system(t))
                )
            };
            let rounds: Vec<String> = t.tps.iter().map(|v| format!("{v:.0}")).collect();
            let _ = writeln!(
                out,
                "| {} | {med:.0} | {lo:.0} – {hi:.0} (±{:.0} %) | {:.2}x | {:.2}x | {:.3} | {cpu} \
                 | {} |",
                t.name,
                50.0 * (hi - lo) / med,
                paired(&t.tps, &direct.tps),
                paired(&t.tps, &plain.tps),
                median(&t.latency_ms),
                rounds.join(" / ")
            );
        }
        cache_lines(&mut out, opts, (m.hits, m.misses), &m.throttled);
        let measured = paired(&m.targets[2].tps, &direct.tps);
        let _ = writeln!(
            out,
            "\n- MariaDB cache, --db-ps-mode={}: Fulcrum with a rule >= {GOAL_RATIO:.0}x direct \
             — measured {measured:.2}x: **{}**\n",
            m.ps_mode,
            if measured >= GOAL_RATIO {
                "met"
            } else {
                "NOT met"
            }
        );
    }
    let _ = writeln!(
        out,
        "Ratios are medians of per-round ratios (each run against the same round's run of \
         the other target). Fulcrum CPU: the daemon's user and system time over a run \
         divided by its transactions (one daemon, only the measured listener has clients), \
         the cache row as a ratio to the no-cache row of the same round. Both Fulcrum \
         listeners are a MariaDB `[[cluster]]` (transaction pooling, pool_size {POOL_SIZE}) in \
         front of the primary alone; the second adds `{CACHE_KEY}`. `--db-ps-mode=auto` \
         sends COM_STMT_PREPARE once per thread and COM_STMT_EXECUTE per select (binary \
         protocol), `disable` a COM_QUERY. The server runs with `{}={}`. Entries live for \
         the default `ttl` (60 s).\n",
        THREAD_POOL.0, THREAD_POOL.1
    );
    for line in machine_lines(opts, machine, elapsed) {
        let _ = writeln!(out, "- {line}");
    }
    out
}
