//! `--consistency-cost`: PostgreSQL direct vs Fulcrum `consistency =
//! "eventual"` vs `"session"` vs `"strong"` (one daemon, three listeners) for each
//! `--workload`, with the server transactions each pgbench transaction cost;
//! the report goes to `target/bench-consistency.md`. `--digest-cost` is the
//! same comparison between Fulcrum with digest statistics off
//! (`digest_max_entries = 0`) and on (the default), to
//! `target/bench-digests.md`; `--replay-cost`, with `transaction_replay`
//! off and on, to `target/bench-replay.md`.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use fulcrum_testkit::{free_port, FulcrumProcess};

use crate::fulcrum::{cluster_section, ensure_fulcrum_built, fulcrum_alive, fulcrum_config};
use crate::machine::{machine_lines, pg_machine, Machine};
use crate::measure::{measure, time_budget, Target};
use crate::pgbench::{init_timeout, start_cluster, Workload, WRITE_READ_SCRIPT};
use crate::{median, publish_report, Options, Result};

/// One Fulcrum listener of the comparison: its name, and the keys its
/// `[[cluster]]` gets beyond the defaults.
struct Variant {
    name: &'static str,
    consistency: Option<&'static str>,
    keys: &'static str,
    /// Tables appended to its `[[cluster]]` (a `[[cluster.mirror]]`).
    tables: String,
}

/// `--consistency-cost`: direct vs Fulcrum `eventual`, `session`, `user`
/// and `strong`, one table per workload.
pub(crate) fn run_consistency(opts: &Options) -> Result<()> {
    let variants = [
        Variant {
            name: "Fulcrum eventual",
            consistency: Some("eventual"),
            keys: "",
            tables: String::new(),
        },
        Variant {
            name: "Fulcrum session",
            consistency: Some("session"),
            keys: "",
            tables: String::new(),
        },
        Variant {
            name: "Fulcrum user",
            consistency: Some("user"),
            keys: "",
            tables: String::new(),
        },
        Variant {
            name: "Fulcrum strong",
            consistency: Some("strong"),
            keys: "",
            tables: String::new(),
        },
    ];
    run_variants(opts, &variants, "bench-consistency.md")
}

/// `--digest-cost`: direct vs Fulcrum with digest statistics off and on.
pub(crate) fn run_digests(opts: &Options) -> Result<()> {
    let variants = [
        Variant {
            name: "Fulcrum digests off",
            consistency: None,
            keys: "digest_max_entries = 0\n",
            tables: String::new(),
        },
        Variant {
            name: "Fulcrum digests on",
            consistency: None,
            keys: "",
            tables: String::new(),
        },
    ];
    run_variants(opts, &variants, "bench-digests.md")
}

/// `--replay-cost`: direct vs Fulcrum with `transaction_replay` off and on.
pub(crate) fn run_replay(opts: &Options) -> Result<()> {
    let variants = [
        Variant {
            name: "Fulcrum replay off",
            consistency: None,
            keys: "",
            tables: String::new(),
        },
        Variant {
            name: "Fulcrum replay on",
            consistency: None,
            keys: "transaction_replay = true\n",
            tables: String::new(),
        },
    ];
    run_variants(opts, &variants, "bench-replay.md")
}

/// CPU the mirror target's server may use: it shares the machine's two
/// cores with everything else, and a mirror cluster is other hardware in
/// production; `async` drops what it cannot take (counted).
const MIRROR_TARGET_CPU: f64 = 0.2;

/// `--mirror-cost`: direct vs Fulcrum without a mirror and with an async
/// mirror of every client, writes included, to a second cluster (its
/// server capped at `MIRROR_TARGET_CPU`).
pub(crate) fn run_mirror(opts: &Options) -> Result<()> {
    let target = start_cluster(opts, init_timeout(opts))?;
    let caps = match crate::cpu_caps::CpuCaps::create(1, MIRROR_TARGET_CPU, 100_000) {
        Ok(caps) => {
            caps.add_server(0, target.primary().data_dir())?;
            Some(caps)
        }
        Err(why) => {
            eprintln!("the mirror target is not capped ({why}): it competes for the CPU");
            None
        }
    };
    let mirror = format!(
        "\n[[cluster.mirror]]\naddress = \"{}\"\nuser = \"{}\"\npassword = \"{}\"\nmirror_writes = true\nmirror_mode = \"async\"\n",
        target.primary().addr(),
        fulcrum_testkit::APP_USER,
        fulcrum_testkit::APP_PASSWORD
    );
    let variants = [
        Variant {
            name: "Fulcrum no mirror",
            consistency: None,
            keys: "",
            tables: String::new(),
        },
        Variant {
            name: "Fulcrum async mirror",
            consistency: None,
            keys: "",
            tables: mirror,
        },
    ];
    let result = run_variants(opts, &variants, "bench-mirror.md");
    drop(caps);
    drop(target);
    result
}

/// `fulcrum_mirror_sent_total` and `_dropped_total`, all targets.
fn mirror_counts(metrics_port: u16) -> (f64, f64) {
    let text = fulcrum_suite::try_scrape(metrics_port).unwrap_or_default();
    (
        fulcrum_suite::family_sum(&text, "fulcrum_mirror_sent_total", &[]),
        fulcrum_suite::family_sum(&text, "fulcrum_mirror_dropped_total", &[]),
    )
}

/// Direct vs one Fulcrum daemon with a listener per variant (only one has
/// clients at a time); the first variant is the baseline of the ratios.
fn run_variants(opts: &Options, variants: &[Variant], report_file: &str) -> Result<()> {
    let started = Instant::now();
    let bin = ensure_fulcrum_built()?;
    let init_timeout = init_timeout(opts);
    let (expected, worst) = time_budget(opts, 1 + variants.len() as u64, init_timeout);
    eprintln!(
        "{report_file}: {} workloads x {} targets x {} rounds x {} s after `pgbench -i -s {}`: \
         about {} s in all; every step has a deadline, so at most {} s",
        opts.workloads.len(),
        1 + variants.len(),
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

    // One daemon, a listener per variant: the clusters differ only in the
    // variant's keys, and only one of them has clients at a time.
    let listens: Vec<String> = variants
        .iter()
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let sections: Vec<String> = variants
        .iter()
        .zip(&listens)
        .enumerate()
        .map(|(i, (v, listen))| {
            cluster_section(&format!("v{i}"), listen, v.consistency, &cluster).replacen(
                "pool_mode =",
                &format!("{}pool_mode =", v.keys),
                1,
            ) + &v.tables
        })
        .collect();
    // A metrics listener: where each variant's reads went (its own cluster).
    let metrics_port = free_port();
    let config = fulcrum_config(opts.workers, &sections).replacen(
        "[fulcrum]\n",
        &format!("[fulcrum]\nmetrics = \"127.0.0.1:{metrics_port}\"\n"),
        1,
    );
    let fulcrum = FulcrumProcess::start(&config)?;
    for (v, listen) in variants.iter().zip(&listens) {
        eprintln!("{} ({}) on {listen}", v.name, bin.display());
    }
    let check_alive = || fulcrum_alive(&fulcrum);

    let machine = pg_machine(
        cluster
            .primary()
            .sql("SHOW server_version")
            .map_err(Into::into),
    )?;
    machine.warn_if_busy();
    let mut results = Vec::new();
    let mirrored_before = mirror_counts(metrics_port);
    for &workload in &opts.workloads {
        eprintln!("== {}", workload.title());
        let mut targets = vec![Target::new("PostgreSQL direct", direct.clone())];
        for (v, listen) in variants.iter().zip(&listens) {
            // One daemon: only this listener has clients during its runs,
            // so the process's CPU is this variant's.
            targets.push(Target::new(v.name, listen.clone()).proxy(Some(fulcrum.pid())));
        }
        let before = causal_reads(metrics_port, variants.len());
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
        let after = causal_reads(metrics_port, variants.len());
        let reads: Vec<[f64; 3]> = after
            .iter()
            .zip(&before)
            .map(|(a, b)| [a[0] - b[0], a[1] - b[1], a[2] - b[2]])
            .collect();
        results.push((workload, targets, reads));
    }
    let _ = std::fs::remove_file(&script);
    let mirrored = mirror_counts(metrics_port);
    let mirrored = (
        mirrored.0 - mirrored_before.0,
        mirrored.1 - mirrored_before.1,
    );

    drop(fulcrum);
    drop(cluster);

    let mut report = render_consistency(opts, &machine, &results, started.elapsed());
    if mirrored != (0.0, 0.0) {
        report.push_str(&format!(
            "\nMirror: {:.0} units replayed on the target, {:.0} dropped (its queue full: the target is capped).\n",
            mirrored.0, mirrored.1
        ));
    }
    publish_report(&report, report_file)?;
    Ok(())
}

/// Per variant (cluster `v0`, `v1`, ...): `fulcrum_causal_reads_total`
/// by outcome (replica at once, waited, primary), from the metrics page.
fn causal_reads(metrics_port: u16, variants: usize) -> Vec<[f64; 3]> {
    let text = fulcrum_suite::try_scrape(metrics_port).unwrap_or_default();
    (0..variants)
        .map(|i| {
            let cluster = format!("v{i}");
            ["replica", "waited", "primary"].map(|outcome| {
                fulcrum_suite::family_sum(
                    &text,
                    "fulcrum_causal_reads_total",
                    &[("cluster", cluster.as_str()), ("outcome", outcome)],
                )
            })
        })
        .collect()
}

/// What a workload measured: its targets, and per variant the reads that
/// had a position to respect, by where they ran.
type Measured = (Workload, Vec<Target>, Vec<[f64; 3]>);

/// `--consistency-cost`: one table per workload, then the machine.
fn render_consistency(
    opts: &Options,
    machine: &Machine,
    results: &[Measured],
    elapsed: Duration,
) -> String {
    let mut out = String::new();
    let replicas = match opts.replicas {
        0 => "one primary, no replicas".to_string(),
        1 => "a primary and 1 streaming replica (listed in every Fulcrum cluster)".to_string(),
        n => format!("a primary and {n} streaming replicas (listed in every Fulcrum cluster)"),
    };
    for (workload, targets, reads) in results {
        let direct = &targets[0].tps;
        let eventual = &targets[1].tps;
        let base = targets[1].name.trim_start_matches("Fulcrum ");
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
            "| target | median TPS | ratio to direct | ratio to {base} | avg latency (ms) \
             | Fulcrum CPU per txn (µs) | server xacts per pgbench txn (primary + replicas) | TPS per round |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---|");
        for target in targets {
            let paired = |base: &[f64]| -> f64 {
                let ratios: Vec<f64> = target.tps.iter().zip(base).map(|(t, b)| t / b).collect();
                median(&ratios)
            };
            let rounds: Vec<String> = target.tps.iter().map(|t| format!("{t:.0}")).collect();
            let _ = writeln!(
                out,
                "| {} | {:.0} | {:.3}x | {:.3}x | {:.3} | {} | {:.2} + {:.2} | {} |",
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
        let _ = writeln!(
            out,
            "Reads that had a position to respect (`fulcrum_causal_reads_total`, \
             all rounds), by where they ran:\n\n\
             | target | on a replica at once | on a replica after waiting | on the primary | share on replicas |\n\
             |---|---:|---:|---:|---:|"
        );
        for (target, [replica, waited, primary]) in targets[1..].iter().zip(reads) {
            let all = replica + waited + primary;
            let share = if all > 0.0 {
                format!("{:.1} %", 100.0 * (replica + waited) / all)
            } else {
                "-".into()
            };
            let _ = writeln!(
                out,
                "| {} | {replica:.0} | {waited:.0} | {primary:.0} | {share} |",
                target.name
            );
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "Ratios are medians of per-round ratios (each run against the same round's \
         direct or baseline run); latency and transactions per pgbench transaction are \
         medians over the rounds."
    );
    out.push('\n');
    for line in machine_lines(opts, machine, elapsed) {
        let _ = writeln!(out, "- {line}");
    }
    out
}
