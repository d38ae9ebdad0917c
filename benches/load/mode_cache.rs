//! `--cache`: the result cache's must-show benchmark (issue 46). One
//! PostgreSQL primary (no replicas) in its own cgroup capped at
//! `--cpu-quota` CPUs (0.3 by default), `pgbench -f point-read` (a point
//! select of `pgbench_accounts` with `aid` random in 1..1000) with
//! `-M prepared`, then `-M simple`, against three targets in alternation:
//! PostgreSQL direct, Fulcrum without a cache, and Fulcrum with a
//! `[cluster.cache]` rule on `pgbench_accounts` (`invalidation = "proxy"`).
//! The hit ratio comes from the daemon's `/metrics`; the report goes to
//! `target/bench-cache.md` and ends with the target line.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use fulcrum_testkit::{free_port, FulcrumProcess};

use crate::cpu_caps::{CpuCaps, Throttling};
use crate::fulcrum::{cluster_section, ensure_fulcrum_built, fulcrum_alive, fulcrum_config};
use crate::machine::{machine_lines, pg_machine, Machine};
use crate::measure::{measure, time_budget, Target};
use crate::pgbench::{init_timeout, start_cluster, Workload, POINT_READ_SCRIPT};
use crate::{median, publish_report, Options, Result};

/// The bar: Fulcrum with a rule, against the capped primary direct.
pub(crate) const GOAL_RATIO: f64 = 3.0;

/// The cache of the `cached` cluster: a rule on the table the script reads,
/// invalidated by the writes through Fulcrum only (the change stream,
/// `invalidation = "stream"`, is built elsewhere).
const CACHE_KEY: &str = "cache = { mode = \"rules\", invalidation = \"proxy\", \
                         rule = [{ tables = [\"pgbench_accounts\"] }] }";

/// The target names, in the order of [`Measured::targets`].
const DIRECT: &str = "PostgreSQL direct";
const PLAIN: &str = "Fulcrum, no cache";
const CACHED: &str = "Fulcrum, cache rule";

/// One protocol's runs: the targets, and what the cache and the cap counted
/// over them (warm-ups included).
struct Measured {
    protocol: String,
    targets: Vec<Target>,
    hits: f64,
    misses: f64,
    /// The primary's cgroup over these runs (zeros when uncapped).
    throttled: Throttling,
}

/// `--cache`: direct vs Fulcrum without and with a cache rule, on a primary
/// capped so that the server, not the client or the proxy, is the limit.
pub(crate) fn run_cache(opts: &Options) -> Result<()> {
    let started = Instant::now();
    // Before anything starts: without a cgroup there is no capped primary.
    // Declared before the cluster, so dropped after it.
    let caps = if opts.cpu_quota > 0.0 {
        match CpuCaps::create(1, opts.cpu_quota, opts.cpu_period_us) {
            Ok(caps) => Some(caps),
            Err(reason) => {
                println!(
                    "cache benchmark SKIPPED: cannot cap the CPU of the PostgreSQL primary: \
                     {reason} (needs root and a writable cgroup v1 cpu or cgroup v2 \
                     hierarchy; --cpu-quota 0 runs uncapped)"
                );
                return Ok(());
            }
        }
    } else {
        eprintln!("--cpu-quota 0: the primary runs uncapped");
        None
    };
    let bin = ensure_fulcrum_built()?;
    let init_timeout = init_timeout(opts);
    let protocols: Vec<String> = if opts.protocol_given {
        vec![opts.protocol.clone()]
    } else {
        vec!["prepared".into(), "simple".into()]
    };
    let mut budget = opts.clone();
    budget.workloads = vec![Workload::PointRead; protocols.len()];
    let (expected, worst) = time_budget(&budget, 3, init_timeout);
    eprintln!(
        "result cache: -M {} x 3 targets x {} rounds x {} s after `pgbench -i -s {}`: about \
         {} s in all; every step has a deadline, so at most {} s",
        protocols.join(", -M "),
        opts.rounds,
        opts.seconds,
        opts.scale,
        expected.as_secs(),
        worst.as_secs()
    );

    // `pgbench -i` runs uncapped; the cap applies from here on.
    let cluster = start_cluster(opts, init_timeout)?;
    if let Some(caps) = &caps {
        let moved = caps.add_server(0, cluster.primary().data_dir())?;
        eprintln!(
            "{}: postmaster and {} other processes in {} ({} CPU)",
            cluster.primary().name(),
            moved - 1,
            caps.groups[0].display(),
            opts.cpu_quota
        );
    }
    let script = std::env::temp_dir().join(format!(
        "fulcrum-bench-point-read-{}.sql",
        std::process::id()
    ));
    std::fs::write(&script, POINT_READ_SCRIPT)?;
    let result = measure_all(opts, &bin, &cluster, caps.as_ref(), &script, &protocols);
    let _ = std::fs::remove_file(&script);
    drop(cluster);
    drop(caps);
    let (machine, results) = result?;
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load_after: Vec<&str> = load_after.split_whitespace().take(3).collect();

    let mut report = render_cache(opts, &machine, &results, started.elapsed());
    let _ = writeln!(
        report,
        "- load average (1, 5, 15 min) after the last run: {}",
        load_after.join(" ")
    );
    publish_report(&report, "bench-cache.md")?;
    Ok(())
}

/// Starts the daemon (one listener without a cache, one with the rule) and
/// runs every protocol's rounds against the three targets.
fn measure_all(
    opts: &Options,
    bin: &Path,
    cluster: &fulcrum_testkit::PgCluster,
    caps: Option<&CpuCaps>,
    script: &Path,
    protocols: &[String],
) -> Result<(Machine, Vec<Measured>)> {
    let direct = cluster.primary().addr();
    let plain_listen = format!("127.0.0.1:{}", free_port());
    let cached_listen = format!("127.0.0.1:{}", free_port());
    // The same cluster twice, the second with the cache: only one of them
    // has clients at a time.
    let plain = cluster_section("plain", &plain_listen, None, cluster);
    let cached = cluster_section("cached", &cached_listen, None, cluster).replacen(
        "pool_mode =",
        &format!("{CACHE_KEY}\npool_mode ="),
        1,
    );
    let metrics_port = free_port();
    let config = fulcrum_config(opts.workers, &[plain, cached]).replacen(
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
    let machine = pg_machine(
        cluster
            .primary()
            .sql("SHOW server_version")
            .map_err(Into::into),
    )?;
    machine.warn_if_busy();

    let mut results = Vec::new();
    for protocol in protocols {
        eprintln!("== -M {protocol}");
        let mut run_opts = opts.clone();
        run_opts.protocol = protocol.clone();
        // One daemon: only one listener has clients during a run, so the
        // process's CPU is that target's.
        let mut targets = vec![
            Target::new(DIRECT, direct.clone()),
            Target::new(PLAIN, plain_listen.clone()).proxy(Some(fulcrum.pid())),
            Target::new(CACHED, cached_listen.clone()).proxy(Some(fulcrum.pid())),
        ];
        let (hits0, misses0) = cache_counts(metrics_port);
        let throttling0 = caps.map(|c| c.throttling(0));
        measure(
            &run_opts,
            Workload::PointRead,
            script,
            None,
            &mut targets,
            check_alive,
        )?;
        let (hits1, misses1) = cache_counts(metrics_port);
        let throttled = match (caps, throttling0) {
            (Some(c), Some(before)) => c.throttling(0).since(before),
            _ => Throttling::default(),
        };
        results.push(Measured {
            protocol: protocol.clone(),
            targets,
            hits: hits1 - hits0,
            misses: misses1 - misses0,
            throttled,
        });
    }
    drop(fulcrum);
    Ok((machine, results))
}

/// `fulcrum_cache_hits_total` and `fulcrum_cache_misses_total` of the
/// `cached` cluster so far (zeros if the page cannot be read).
pub(crate) fn cache_counts(metrics_port: u16) -> (f64, f64) {
    let text = fulcrum_suite::try_scrape(metrics_port).unwrap_or_default();
    let filter = [("cluster", "cached")];
    (
        fulcrum_suite::family_sum(&text, "fulcrum_cache_hits_total", &filter),
        fulcrum_suite::family_sum(&text, "fulcrum_cache_misses_total", &filter),
    )
}

/// Median of the per-round ratios of `target`'s TPS to `base`'s.
fn ratio(target: &Target, base: &Target) -> f64 {
    paired(&target.tps, &base.tps)
}

/// Median of the per-round ratios of `a`'s values to `b`'s.
pub(crate) fn paired(a: &[f64], b: &[f64]) -> f64 {
    let ratios: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    median(&ratios)
}

/// The report's lines on the `cached` cluster's hits and misses and on
/// how often the cap throttled the primary (when it was capped).
pub(crate) fn cache_lines(
    out: &mut String,
    opts: &Options,
    (hits, misses): (f64, f64),
    throttled: &Throttling,
) {
    let _ = writeln!(
        out,
        "\nCache (cluster `cached`, over its warm-up and rounds): {hits:.0} hits, {misses:.0} \
         misses: hit ratio {:.2} %.",
        100.0 * hits / (hits + misses).max(1.0)
    );
    if throttled.periods > 0 {
        let _ = writeln!(
            out,
            "CPU periods ({} ms) in which the cap throttled the primary, over all three \
             targets' runs: {} of {} ({}).",
            opts.cpu_period_us / 1000,
            throttled.throttled,
            throttled.periods,
            throttled.percent()
        );
    }
}

/// The goal line of one protocol: the line for `-M prepared`.
fn goal_line(protocol: &str, measured: f64) -> String {
    let what = if protocol == "prepared" {
        "cache".to_string()
    } else {
        format!("cache, -M {protocol} (not the issue's workload)")
    };
    format!(
        "{what}: Fulcrum with a rule >= {GOAL_RATIO:.0}x direct — measured {measured:.2}x: **{}**",
        if measured >= GOAL_RATIO {
            "met"
        } else {
            "NOT met"
        }
    )
}

/// `--cache`: a table per protocol with its goal line, then the machine.
fn render_cache(
    opts: &Options,
    machine: &Machine,
    results: &[Measured],
    elapsed: Duration,
) -> String {
    let mut out = String::new();
    let cap = if opts.cpu_quota > 0.0 {
        format!("the primary capped at {} CPU", opts.cpu_quota)
    } else {
        "the primary uncapped".to_string()
    };
    for m in results {
        let _ = writeln!(
            out,
            "### {}, -M {}, {} clients, -j {}, scale {}, {} rounds x {} s, {cap}\n",
            Workload::PointRead.title(),
            m.protocol,
            opts.clients,
            opts.jobs,
            opts.scale,
            opts.rounds,
            opts.seconds
        );
        let _ = writeln!(
            out,
            "| target | median TPS | spread (min – max) | ratio to direct | ratio to Fulcrum, \
             no cache | avg latency (ms) | Fulcrum CPU per txn (µs) | TPS per round |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---|");
        let (direct, plain) = (&m.targets[0], &m.targets[1]);
        for t in &m.targets {
            let lo = t.tps.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = t.tps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let med = median(&t.tps);
            let cpu = if t.cpu_us_per_txn.is_empty() {
                "–".to_string()
            } else {
                format!("{:.1}", median(&t.cpu_us_per_txn))
            };
            let rounds: Vec<String> = t.tps.iter().map(|v| format!("{v:.0}")).collect();
            let _ = writeln!(
                out,
                "| {} | {med:.0} | {lo:.0} – {hi:.0} (±{:.0} %) | {:.2}x | {:.2}x | {:.3} | {cpu} \
                 | {} |",
                t.name,
                50.0 * (hi - lo) / med,
                ratio(t, direct),
                ratio(t, plain),
                median(&t.latency_ms),
                rounds.join(" / ")
            );
        }
        cache_lines(&mut out, opts, (m.hits, m.misses), &m.throttled);
        let _ = writeln!(
            out,
            "\n- {}\n",
            goal_line(&m.protocol, ratio(&m.targets[2], direct))
        );
    }
    let _ = writeln!(
        out,
        "Ratios are medians of per-round ratios (each run against the same round's run of \
         the other target). Spread: the lowest and highest round, and half that range as a \
         share of the median. Fulcrum CPU is the daemon's user + system time over a run \
         divided by its transactions (one daemon, only the measured listener has clients), \
         comparable only between the two Fulcrum rows of one table. Both Fulcrum listeners \
         are the same `[[cluster]]` (transaction pooling, pool_size 20) in front of the \
         primary; the second adds `{CACHE_KEY}` (isolation \"user\", the default). \
         Invalidation is `proxy` (writes through Fulcrum): the change stream (`stream`) is \
         being built elsewhere, and this read-only workload invalidates nothing either way. \
         Entries live for the default `ttl` (60 s), so the misses are the 1,000 keys filled \
         again each time their entries expire (and reads that found another client filling \
         the same key).\n"
    );
    for line in machine_lines(opts, machine, elapsed) {
        let _ = writeln!(out, "- {line}");
    }
    out
}
