//! `--consistency-cost`: PostgreSQL direct vs Fulcrum `consistency =
//! "eventual"` vs `"session"` vs `"strong"` (one daemon, three listeners) for each
//! `--workload`, with the server transactions each pgbench transaction cost;
//! the report goes to `target/bench-consistency.md`.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use fulcrum_testkit::{free_port, FulcrumProcess};

use crate::fulcrum::{cluster_section, ensure_fulcrum_built, fulcrum_alive, fulcrum_config};
use crate::machine::{machine_lines, pg_machine, Machine};
use crate::measure::{measure, time_budget, Target};
use crate::pgbench::{init_timeout, start_cluster, Workload, WRITE_READ_SCRIPT};
use crate::{median, publish_report, Options, Result};

/// `--consistency-cost`: direct vs Fulcrum `eventual`, `session` and
/// `strong`, one table per workload.
pub(crate) fn run_consistency(opts: &Options) -> Result<()> {
    let started = Instant::now();
    let bin = ensure_fulcrum_built()?;
    let init_timeout = init_timeout(opts);
    let (expected, worst) = time_budget(opts, 4, init_timeout);
    eprintln!(
        "consistency cost: {} workloads x 4 targets x {} rounds x {} s after `pgbench -i -s {}`: \
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

    // One daemon, three listeners: the clusters differ only in
    // `consistency`, and only one of them has clients at a time.
    let eventual_listen = format!("127.0.0.1:{}", free_port());
    let session_listen = format!("127.0.0.1:{}", free_port());
    let strong_listen = format!("127.0.0.1:{}", free_port());
    let sections = [
        cluster_section("eventual", &eventual_listen, Some("eventual"), &cluster),
        cluster_section("session", &session_listen, Some("session"), &cluster),
        cluster_section("strong", &strong_listen, Some("strong"), &cluster),
    ];
    let fulcrum = FulcrumProcess::start(&fulcrum_config(opts.workers, &sections))?;
    eprintln!(
        "Fulcrum {}: consistency = \"eventual\" on {eventual_listen}, \"session\" on \
         {session_listen}, \"strong\" on {strong_listen}",
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
    for &workload in &opts.workloads {
        eprintln!("== {}", workload.title());
        let mut targets = vec![
            Target::new("PostgreSQL direct", direct.clone()),
            Target::new("Fulcrum eventual", eventual_listen.clone()),
            Target::new("Fulcrum session", session_listen.clone()),
            Target::new("Fulcrum strong", strong_listen.clone()),
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
    publish_report(&report, "bench-consistency.md")?;
    Ok(())
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
        1 => "a primary and 1 streaming replica (listed in every Fulcrum cluster)".to_string(),
        n => format!("a primary and {n} streaming replicas (listed in every Fulcrum cluster)"),
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
