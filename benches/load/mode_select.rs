//! The default mode: `pgbench -S` against PostgreSQL directly, through
//! Fulcrum, through PgBouncer and through Pgpool-II (those installed), and
//! its report, `target/bench-load.md`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use fulcrum_testkit::{free_port, FulcrumProcess};

use crate::fulcrum::{cluster_section, ensure_fulcrum_built, fulcrum_alive, fulcrum_config};
use crate::machine::{machine_lines, pg_machine, Machine};
use crate::measure::{measure, time_budget, Target};
use crate::pgbench::{init_timeout, start_cluster_tls, Workload};
use crate::pgbouncer::{PgBouncer, PGBOUNCER};
use crate::{median, pgpool, publish_report, Options, Result};

/// The default mode: `pgbench -S` directly, through Fulcrum, PgBouncer and
/// Pgpool-II (those installed), one table.
pub(crate) fn run_select(opts: &Options) -> Result<()> {
    let started = Instant::now();
    let bin = ensure_fulcrum_built()?;
    let mut pgbouncer_found = Path::new(PGBOUNCER).is_file();
    if !pgbouncer_found {
        eprintln!(
            "PgBouncer not found at {PGBOUNCER}: skipping it (install: apt-get install pgbouncer)"
        );
    } else if opts.protocol == "prepared" && !pgbouncer_has_prepared_statements() {
        // Protocol-level prepared statements in transaction pooling came
        // with PgBouncer 1.21 (max_prepared_statements); before, pgbench
        // -M prepared fails there ("prepared statement P_0 already exists").
        eprintln!(
            "{}: no prepared statements in transaction pooling (1.21+): skipping it for -M prepared",
            crate::process::first_line(PGBOUNCER, &["--version"])
        );
        pgbouncer_found = false;
    }
    // Pgpool-II's TLS set-up is not part of this comparison.
    let pgpool_found = Path::new(pgpool::PGPOOL).is_file() && !opts.tls;
    if opts.tls {
        eprintln!("--tls: Pgpool-II left out");
    } else if !pgpool_found {
        eprintln!(
            "Pgpool-II not found at {}: skipping it (install: apt-get install pgpool2)",
            pgpool::PGPOOL
        );
    }
    let targets = 2
        + u64::from(opts.baseline.is_some())
        + u64::from(pgbouncer_found)
        + u64::from(pgpool_found);
    let init_timeout = init_timeout(opts);
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

    let certs = if opts.tls {
        let certs = fulcrum_testkit::TestCerts::new()?;
        crate::pgbench::TLS_CLIENTS.store(true, std::sync::atomic::Ordering::Relaxed);
        Some(certs)
    } else {
        None
    };
    let cluster = start_cluster_tls(opts, init_timeout, certs.as_ref())?;
    let primary = cluster.primary();
    let direct = primary.addr();

    let fulcrum_listen = format!("127.0.0.1:{}", free_port());
    let mut section = cluster_section("bench", &fulcrum_listen, None, &cluster);
    if let Some(certs) = &certs {
        // Cluster keys go before the first sub-table.
        let keys = format!(
            "tls_mode = \"require\"\ntls_certificate = \"{}\"\ntls_private_key = \"{}\"\n\
             server_tls = \"require\"\n",
            certs.cert.display(),
            certs.key.display()
        );
        section = section.replacen(
            "[[cluster.backend]]",
            &format!("{keys}[[cluster.backend]]"),
            1,
        );
    }
    let fulcrum = FulcrumProcess::start(&fulcrum_config(opts.workers, &[section.clone()]))?;
    eprintln!("Fulcrum {} on {fulcrum_listen}", bin.display());
    // `--baseline`: the same config on another port, run by the other binary.
    let baseline = match &opts.baseline {
        Some(path) => {
            let listen = format!("127.0.0.1:{}", free_port());
            let config = fulcrum_config(opts.workers, &[section.replace(&fulcrum_listen, &listen)]);
            let p = FulcrumProcess::spawn_with(path, &config, &[])?;
            p.wait_listening(fulcrum_testkit::START_TIMEOUT)?;
            eprintln!("Fulcrum (baseline) {} on {listen}", path.display());
            Some((p, listen))
        }
        None => None,
    };
    let pgbouncer = if pgbouncer_found {
        let p = PgBouncer::start_configured(primary.port(), 1000, certs.as_ref())?;
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
        Target::new("Fulcrum", fulcrum_listen).proxy(Some(fulcrum.pid())),
    ];
    if let Some((p, listen)) = &baseline {
        targets.push(Target::new("Fulcrum (baseline)", listen.clone()).proxy(Some(p.pid())));
    }
    if let Some(p) = &pgbouncer {
        targets.push(Target::new("PgBouncer", p.addr.clone()).proxy(p.pid()));
    }
    if let Some(p) = &pgpool {
        targets.push(Target::new("Pgpool-II", p.addr.clone()));
    }

    let check_alive = || -> Result<()> {
        fulcrum_alive(&fulcrum)?;
        if let Some((p, _)) = &baseline {
            fulcrum_alive(p)?;
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
    machine.warn_if_busy();
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
    drop(baseline);
    drop(fulcrum);
    drop(cluster);

    let report = render(opts, &machine, &targets, started.elapsed());
    publish_report(&report, "bench-load.md")?;
    Ok(())
}

/// The markdown report: one row per target, then the per-round figures.
fn render(opts: &Options, machine: &Machine, targets: &[Target], elapsed: Duration) -> String {
    let mut out = String::new();
    let direct = &targets[0].tps;
    let _ = writeln!(
        out,
        "### pgbench -S, {} clients, -j {}, -M {}, scale {}, {} rounds x {} s{}\n",
        opts.clients,
        opts.jobs,
        opts.protocol,
        opts.scale,
        opts.rounds,
        opts.seconds,
        if opts.tls {
            ", TLS from clients and to the server (sslmode=require)"
        } else {
            ""
        }
    );
    let _ = writeln!(out, "| target | median TPS | ratio to direct (median of rounds) | avg latency (ms, median of rounds) | proxy CPU per txn (µs, median) | of which user / system (µs) | proxy context switches per txn (median) | TPS per round |");
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---|");
    for target in targets {
        let ratios: Vec<f64> = target.tps.iter().zip(direct).map(|(t, d)| t / d).collect();
        let rounds: Vec<String> = target.tps.iter().map(|t| format!("{t:.0}")).collect();
        let or_dash = |v: &[f64], digits: usize| {
            if v.is_empty() {
                "-".to_string()
            } else {
                format!("{:.*}", digits, median(v))
            }
        };
        let split = target
            .user_system()
            .map_or("-".to_string(), |(u, s)| format!("{u:.1} / {s:.1}"));
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.2}x | {:.3} | {} | {} | {} | {} |",
            target.name,
            median(&target.tps),
            median(&ratios),
            median(&target.latency_ms),
            or_dash(&target.cpu_us_per_txn, 1),
            split,
            or_dash(&target.switches_per_txn, 2),
            rounds.join(" / ")
        );
    }
    out.push('\n');
    for line in machine_lines(opts, machine, elapsed) {
        let _ = writeln!(out, "- {line}");
    }
    out
}

/// Whether the installed PgBouncer supports protocol-level prepared
/// statements in transaction pooling (1.21 and later).
fn pgbouncer_has_prepared_statements() -> bool {
    let version = crate::process::first_line(PGBOUNCER, &["--version"]);
    let numbers: Vec<u32> = version
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .split('.')
        .filter_map(|n| n.parse().ok())
        .collect();
    matches!(numbers.as_slice(), [major, minor, ..] if (*major, *minor) >= (1, 21))
}
