//! `--cpu-split`: each proxy's own CPU per `pgbench -S` transaction, user
//! and system apart, and its context switches per transaction, side by
//! side in one run: Fulcrum with default settings (`workers = 0`), Fulcrum
//! with `workers = 1`, and PgBouncer, for `-M simple` and (Fulcrum alone:
//! PgBouncer before 1.21 has no prepared statements in transaction
//! pooling) `-M prepared`, at 16 and 64 clients (issue 44's). PostgreSQL direct is
//! measured too, for the TPS ratios. Report: `target/bench-cpu-split.md`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use fulcrum_testkit::{free_port, FulcrumProcess};

use crate::fulcrum::{cluster_section, ensure_fulcrum_built, fulcrum_alive, fulcrum_config};
use crate::machine::{machine_lines, pg_machine};
use crate::measure::{measure, Target};
use crate::pgbench::{init_timeout, start_cluster_tls, Workload};
use crate::pgbouncer::{PgBouncer, PGBOUNCER};
use crate::{median, publish_report, Options, Result};

/// The client counts and protocols measured.
const CLIENTS: [u32; 2] = [16, 64];
const PROTOCOLS: [&str; 2] = ["simple", "prepared"];

pub(crate) fn run_cpu_split(opts: &Options) -> Result<()> {
    let started = Instant::now();
    let bin = ensure_fulcrum_built()?;
    let cluster = start_cluster_tls(opts, init_timeout(opts), None)?;
    let primary = cluster.primary();
    let fulcrum = |workers: u32| -> Result<(FulcrumProcess, String)> {
        let listen = format!("127.0.0.1:{}", free_port());
        let section = cluster_section("bench", &listen, None, &cluster);
        let mut config = fulcrum_config(workers, &[section]);
        if workers == 0 {
            // Default settings: no `workers` line at all.
            config = config.replacen("workers = 0\n", "", 1);
        }
        Ok((FulcrumProcess::start(&config)?, listen))
    };
    let (default_fulcrum, default_listen) = fulcrum(0)?;
    let (one_worker, one_listen) = fulcrum(1)?;
    eprintln!(
        "Fulcrum {} on {default_listen} (default workers) and {one_listen} (workers = 1)",
        bin.display()
    );
    let pgbouncer = if Path::new(PGBOUNCER).is_file() {
        let p = PgBouncer::start_configured(primary.port(), 1000, None)?;
        eprintln!("PgBouncer on {}", p.addr);
        Some(p)
    } else {
        eprintln!("PgBouncer not found at {PGBOUNCER}: Fulcrum alone");
        None
    };
    let machine = pg_machine(primary.sql("SHOW server_version").map_err(Into::into))?;
    machine.warn_if_busy();
    let check_alive = || -> Result<()> {
        fulcrum_alive(&default_fulcrum)?;
        fulcrum_alive(&one_worker)?;
        if let Some(p) = &pgbouncer {
            p.check_alive()?;
        }
        Ok(())
    };

    let mut sections = Vec::new();
    for protocol in PROTOCOLS {
        for clients in CLIENTS {
            let mut o = opts.clone();
            o.protocol = protocol.into();
            o.clients = clients;
            let mut targets = vec![
                Target::new("PostgreSQL direct", primary.addr()),
                Target::new("Fulcrum, default settings", default_listen.clone())
                    .proxy(Some(default_fulcrum.pid())),
                Target::new("Fulcrum, workers = 1", one_listen.clone())
                    .proxy(Some(one_worker.pid())),
            ];
            if let (Some(p), "simple") = (&pgbouncer, protocol) {
                targets.push(Target::new("PgBouncer", p.addr.clone()).proxy(p.pid()));
            }
            eprintln!("-M {protocol}, {clients} clients");
            measure(
                &o,
                Workload::Select,
                Path::new(""),
                None,
                &mut targets,
                check_alive,
            )?;
            sections.push((protocol, clients, targets));
        }
    }
    drop(pgbouncer);
    drop(one_worker);
    drop(default_fulcrum);
    drop(cluster);

    let mut out = String::new();
    let _ = writeln!(
        out,
        "### Proxy CPU per pgbench -S transaction, user and system apart ({} rounds x {} s, -j {}, scale {})\n",
        opts.rounds, opts.seconds, opts.jobs, opts.scale
    );
    let _ = writeln!(out, "| -M | clients | target | median TPS | TPS / direct | user µs/txn | system µs/txn | switches/txn |");
    let _ = writeln!(out, "|---|---:|---|---:|---:|---:|---:|---:|");
    for (protocol, clients, targets) in &sections {
        let direct = &targets[0].tps;
        for t in targets {
            let ratios: Vec<f64> = t.tps.iter().zip(direct).map(|(a, d)| a / d).collect();
            let (user, system, switches) = match t.user_system() {
                None => ("-".to_string(), "-".to_string(), "-".to_string()),
                Some((u, s)) => (
                    format!("{u:.1}"),
                    format!("{s:.1}"),
                    format!("{:.2}", median(&t.switches_per_txn)),
                ),
            };
            let _ = writeln!(
                out,
                "| {protocol} | {clients} | {} | {:.0} | {:.2}x | {user} | {system} | {switches} |",
                t.name,
                median(&t.tps),
                median(&ratios),
            );
        }
    }
    out.push('\n');
    for line in machine_lines(opts, &machine, started.elapsed()) {
        let _ = writeln!(out, "- {line}");
    }
    publish_report(&out, "bench-cpu-split.md")?;
    Ok(())
}
