//! `--mysql-consistency-cost`: MariaDB direct vs Fulcrum `consistency =
//! "eventual"` vs `"session"` with sysbench `oltp_read_write` and
//! `oltp_read_only --skip-trx=on` on a primary and GTID replicas; the report
//! goes to `target/bench-mysql-consistency.md`. `--mysql-replay-cost` is
//! the same comparison between Fulcrum with `transaction_replay` off and on,
//! to `target/bench-mysql-replay.md`.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster};

use crate::fulcrum::{ensure_fulcrum_built, fulcrum_alive, fulcrum_config, push_backends_and_user};
use crate::machine::{machine_lines, Machine};
use crate::measure::{process_usage, Target};
use crate::process::first_line;
use crate::sysbench::{
    com_selects, sysbench, sysbench_run, SysbenchWorkload, SYSBENCH_PREPARE_TIMEOUT,
    SYSBENCH_TABLES,
};
use crate::{median, publish_report, Options, Result, POOL_SIZE, RUN_GRACE, WARMUP_SECONDS};

/// One `[[cluster]]` for MariaDB listening on `listen`, in front of the
/// primary and every replica of `maria`, with the given `consistency`.
fn mysql_cluster_section(
    name: &str,
    listen: &str,
    consistency: &str,
    keys: &str,
    maria: &MariaCluster,
) -> String {
    let mut out = format!(
        "[[cluster]]\nname = \"{name}\"\nprotocol = \"mysql\"\nlisten = \"{listen}\"\n\
         pool_mode = \"transaction\"\npool_size = {POOL_SIZE}\n\
         health_user = \"root\"\nhealth_password = \"\"\nconsistency = \"{consistency}\"\n{keys}"
    );
    let replicas: Vec<String> = maria.replicas().iter().map(|r| r.addr()).collect();
    push_backends_and_user(&mut out, &maria.primary().addr(), &replicas);
    out
}

/// One Fulcrum listener of a comparison: its name, its `consistency`, and
/// the other keys its `[[cluster]]` gets.
struct Variant {
    name: &'static str,
    consistency: &'static str,
    keys: &'static str,
}

/// `--mysql-consistency-cost`: MariaDB direct vs Fulcrum `eventual` vs
/// Fulcrum `session` vs `user` with sysbench, one table per workload.
pub(crate) fn run_mysql_consistency(opts: &Options) -> Result<()> {
    let variants = ["eventual", "session", "user"].map(|c| Variant {
        name: match c {
            "eventual" => "Fulcrum eventual",
            "session" => "Fulcrum session",
            _ => "Fulcrum user",
        },
        consistency: c,
        keys: "",
    });
    run_mysql_variants(opts, &variants, "bench-mysql-consistency.md")
}

/// `--mysql-replay-cost`: MariaDB direct vs Fulcrum with `transaction_replay`
/// off and on (both `consistency = "session"`, the default).
pub(crate) fn run_mysql_replay(opts: &Options) -> Result<()> {
    let variants = [
        Variant {
            name: "Fulcrum replay off",
            consistency: "session",
            keys: "",
        },
        Variant {
            name: "Fulcrum replay on",
            consistency: "session",
            keys: "transaction_replay = true\n",
        },
    ];
    run_mysql_variants(opts, &variants, "bench-mysql-replay.md")
}

/// MariaDB direct vs one Fulcrum daemon with a listener per variant; the
/// first variant is the baseline of the ratios.
fn run_mysql_variants(opts: &Options, variants: &[Variant], report_file: &str) -> Result<()> {
    let started = Instant::now();
    let sysbench_version = first_line("sysbench", &["--version"]);
    if sysbench_version == "unknown" {
        return Err("sysbench not found (install: apt-get install sysbench)".into());
    }
    let bin = ensure_fulcrum_built()?;
    let workloads = SysbenchWorkload::ALL.len() as u64;
    let n = 1 + variants.len() as u64;
    let runs = workloads * n * opts.rounds as u64;
    let expected = workloads * n * WARMUP_SECONDS + runs * (opts.seconds + 1) + 20;
    let worst = expected + (workloads * n + runs) * RUN_GRACE.as_secs() + 60 + 120 + 60 + 30;
    eprintln!(
        "{report_file}: {workloads} workloads x {n} targets x {} rounds x {} s after \
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

    let listens: Vec<String> = variants
        .iter()
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let sections: Vec<String> = variants
        .iter()
        .zip(&listens)
        .enumerate()
        .map(|(i, (v, listen))| {
            mysql_cluster_section(&format!("v{i}"), listen, v.consistency, v.keys, &cluster)
        })
        .collect();
    let fulcrum = FulcrumProcess::start(&fulcrum_config(opts.workers, &sections))?;
    for (v, listen) in variants.iter().zip(&listens) {
        eprintln!("{} ({}) on {listen}", v.name, bin.display());
    }
    let check_alive = || fulcrum_alive(&fulcrum);
    let port_of = |addr: &str| -> u16 {
        addr.rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .expect("listen address with a port")
    };

    let version = cluster.primary().sql("SELECT VERSION()")?;
    let machine = Machine::collect(format!("MariaDB {}", version.trim()), sysbench_version)?;
    machine.warn_if_busy();
    let mut results = Vec::new();
    for workload in SysbenchWorkload::ALL {
        eprintln!("== {}", workload.title());
        let mut targets = vec![Target::new("MariaDB direct", cluster.primary().addr())];
        for (v, listen) in variants.iter().zip(&listens) {
            targets.push(Target::new(v.name, listen.clone()).proxy(Some(fulcrum.pid())));
        }
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
                let usage_before = target.proxy_pid.and_then(process_usage);
                let result = sysbench_run(opts, port_of(&target.addr), workload, opts.seconds)
                    .map_err(|e| format!("round {} against {}: {e}", round + 1, target.name))?;
                let usage_after = target.proxy_pid.and_then(process_usage);
                check_alive()?;
                let (p1, r1) = com_selects(&cluster)?;
                let txns = result.transactions as f64;
                if let (Some((c0, _)), Some((c1, _))) = (usage_before, usage_after) {
                    // One daemon, only this listener has clients: its CPU.
                    target.cpu_us_per_txn.push((c1 - c0) / txns.max(1.0));
                }
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
    publish_report(&report, report_file)?;
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
        1 => "a primary and 1 GTID replica (listed in every Fulcrum cluster)".to_string(),
        n => format!("a primary and {n} GTID replicas (listed in every Fulcrum cluster)"),
    };
    for (workload, targets) in results {
        let direct = &targets[0].tps;
        let eventual = &targets[1].tps;
        let base = targets[1].name.trim_start_matches("Fulcrum ");
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
            "| target | median TPS | ratio to direct | ratio to {base} | avg latency (ms) \
             | Fulcrum CPU per txn (µs) | Com_select per txn (primary + replicas) | ignored errors per run | TPS per round |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---|---|");
        for target in targets {
            let paired = |base: &[f64]| -> f64 {
                let ratios: Vec<f64> = target.tps.iter().zip(base).map(|(t, b)| t / b).collect();
                median(&ratios)
            };
            let rounds: Vec<String> = target.tps.iter().map(|t| format!("{t:.0}")).collect();
            let errors: Vec<String> = target.ignored_errors.iter().map(u64::to_string).collect();
            let _ = writeln!(
                out,
                "| {} | {:.0} | {:.3}x | {:.3}x | {:.3} | {} | {:.2} + {:.2} | {} | {} |",
                target.name,
                median(&target.tps),
                paired(direct),
                paired(eventual),
                median(&target.latency_ms),
                if target.cpu_us_per_txn.is_empty() {
                    "-".to_string()
                } else {
                    format!("{:.1}", median(&target.cpu_us_per_txn))
                },
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
            "\n{} / {base} per round: {}\n",
            targets[2].name.trim_start_matches("Fulcrum "),
            session.join(" / ")
        );
    }
    let _ = writeln!(
        out,
        "Ratios are medians of per-round ratios (each run against the same round's \
         direct or baseline run); latency and Com_select per sysbench transaction are \
         medians over the rounds. Ignored errors are the deadlocks sysbench retried \
         (`--mysql-ignore-errors=1213`); any other error fails the bench."
    );
    out.push('\n');
    for line in machine_lines(opts, machine, elapsed) {
        let _ = writeln!(out, "- {line}");
    }
    out
}
