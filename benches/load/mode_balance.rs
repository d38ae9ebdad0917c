//! `--balance`: the read-balancing policies side by side on the capped
//! scale-out regime (issue 19): a primary and 2 streaming replicas, each in
//! its own CPU-capped cgroup, pgbench -S; PostgreSQL direct (one node),
//! Pgpool-II on the 3 nodes, and Fulcrum on the 3 nodes with each `balance`
//! (one daemon, a listener per policy, only one with clients at a time),
//! and a plain TCP relay (socat or HAProxy, `--relay`) in front of the
//! primary as the control of the regime: it should come close to direct.
//! With `--slow-node`, the second replica runs CPU-heavy queries of its own
//! during every run (sent to it directly, unseen by the proxies), so one
//! node of three is slow. The report goes to `target/bench-balance.md`.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fulcrum_testkit::{free_port, FulcrumProcess};

use crate::cpu_caps::CpuCaps;
use crate::fulcrum::{ensure_fulcrum_built, fulcrum_alive, fulcrum_config, scale_out_section};
use crate::machine::{machine_lines, pg_machine, Machine};
use crate::measure::{measure, time_budget, Target};
use crate::mode_scale_out::SCALE_OUT_NODES;
use crate::pgbench::{init_timeout, start_cluster, Workload};
use crate::pgpool::{Pgpool, PGPOOL, SPARE_CHILDREN};
use crate::{median, publish_report, Options, Result};

/// `--slow-node`: CPU-burning queries kept running on the second replica.
const SLOW_NODE_QUERIES: usize = 2;

/// The policies compared, with their target names.
const POLICIES: [(&str, &str); 3] = [
    ("round_robin", "Fulcrum round_robin"),
    ("least_connections", "Fulcrum least_connections"),
    ("p2c", "Fulcrum p2c"),
];

pub(crate) fn run_balance(opts: &Options) -> Result<()> {
    let started = Instant::now();
    let caps = match CpuCaps::create(SCALE_OUT_NODES, opts.cpu_quota, opts.cpu_period_us) {
        Ok(caps) => caps,
        Err(reason) => {
            println!("balance benchmark SKIPPED: cannot cap the CPU of each server: {reason}");
            return Ok(());
        }
    };
    let bin = ensure_fulcrum_built()?;
    let init_timeout = init_timeout(opts);
    let (expected, worst) = time_budget(opts, 2 + POLICIES.len() as u64, init_timeout);
    eprintln!(
        "balance: {} targets x {} rounds x {} s: about {} s, at most {} s",
        2 + POLICIES.len(),
        opts.rounds,
        opts.seconds,
        expected.as_secs(),
        worst.as_secs()
    );
    let cluster = start_cluster(opts, init_timeout)?;
    for (i, node) in cluster.nodes().enumerate() {
        caps.add_server(i, node.data_dir())?;
    }
    let primary = cluster.primary().addr();
    // `--nodes N`: the proxies read from the first N nodes (the primary and
    // N - 1 replicas); the servers are started, and capped, all the same.
    let replicas: Vec<String> = cluster
        .replicas()
        .iter()
        .take(opts.balance_nodes - 1)
        .map(|r| r.addr())
        .collect();
    let mut targets = vec![Target::new("PostgreSQL direct", primary.clone())];
    let pgpool = if Path::new(PGPOOL).is_file() {
        let p = Pgpool::start(&primary, &replicas, opts.clients + SPARE_CHILDREN)?;
        targets.push(Target::new("Pgpool-II", p.addr.clone()));
        Some(p)
    } else {
        eprintln!("Pgpool-II not installed: left out");
        None
    };
    // The regime's control: a plain TCP relay (socat or HAProxy) in front
    // of the primary costs the hop and nothing else; near direct, the caps
    // measure the nodes, not the hop.
    let relay = crate::relay::TcpRelay::start(opts.relay, free_port(), &primary)?;
    targets.push(Target::new(
        match opts.relay {
            crate::relay::RelayKind::Socat => "socat relay to the primary",
            crate::relay::RelayKind::Haproxy => "HAProxy relay to the primary",
        },
        relay.addr.clone(),
    ));
    let mut sections = Vec::new();
    for (policy, name) in POLICIES {
        let listen = format!("127.0.0.1:{}", free_port());
        sections.push(
            scale_out_section(policy, &listen, &primary, &replicas).replacen(
                "pool_mode =",
                &format!("balance = \"{policy}\"\npool_mode ="),
                1,
            ),
        );
        targets.push(Target::new(name, listen));
    }
    let fulcrum = FulcrumProcess::start(&fulcrum_config(opts.workers, &sections))?;
    for t in targets.iter_mut().filter(|t| t.name.starts_with("Fulcrum")) {
        t.proxy_pid = Some(fulcrum.pid());
    }
    eprintln!("Fulcrum {}", bin.display());
    let check_alive = || {
        fulcrum_alive(&fulcrum)?;
        match &pgpool {
            Some(p) => p.check_alive(),
            None => Ok(()),
        }
    };
    let machine = pg_machine(
        cluster
            .primary()
            .sql("SHOW server_version")
            .map_err(Into::into),
    )?;
    machine.warn_if_busy();
    // `--slow-node`: background queries burn the second replica's CPU for
    // as long as the measurement runs (each bounded by statement_timeout).
    let stop = AtomicBool::new(false);
    let slow = &cluster.replicas()[1];
    let measured = std::thread::scope(|scope| {
        if opts.slow_node {
            for _ in 0..SLOW_NODE_QUERIES {
                scope.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        let _ = slow.sql(
                            "SET statement_timeout = '3s'; \
                             SELECT count(*) FROM generate_series(1, 1000000000)",
                        );
                    }
                });
            }
        }
        let r = measure(
            opts,
            Workload::Select,
            Path::new(""),
            None,
            &mut targets,
            check_alive,
        );
        stop.store(true, Ordering::Relaxed);
        r
    });
    measured?;
    drop(fulcrum);
    drop(relay);
    drop(pgpool);
    drop(cluster);
    drop(caps);
    let report = render(opts, &machine, &targets, started.elapsed());
    publish_report(&report, "bench-balance.md")?;
    Ok(())
}

fn render(opts: &Options, machine: &Machine, targets: &[Target], elapsed: Duration) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### pgbench -S, {} clients, -j {}, -M {}, scale {}, {} rounds x {} s, a primary and \
         2 streaming replicas, each capped at {} CPU (CFS period {} ms); every proxy reads from {} of the nodes{}\n",
        opts.clients,
        opts.jobs,
        opts.protocol,
        opts.scale,
        opts.rounds,
        opts.seconds,
        opts.cpu_quota,
        opts.cpu_period_us / 1000,
        opts.balance_nodes,
        if opts.slow_node {
            format!(
                "; the second replica also runs {SLOW_NODE_QUERIES} CPU-heavy queries of its \
                 own throughout (a slow node)"
            )
        } else {
            String::new()
        }
    );
    let pgpool = targets.iter().find(|t| t.name == "Pgpool-II");
    let _ = writeln!(
        out,
        "| target | median TPS | ratio to direct (1 node) | ratio to Pgpool-II | proxy CPU per txn (µs) | TPS per round |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---|");
    let direct = &targets[0].tps;
    let paired = |t: &[f64], base: &[f64]| -> f64 {
        let r: Vec<f64> = t.iter().zip(base).map(|(a, b)| a / b).collect();
        median(&r)
    };
    for t in targets {
        let rounds: Vec<String> = t.tps.iter().map(|v| format!("{v:.0}")).collect();
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.2}x | {} | {} | {} |",
            t.name,
            median(&t.tps),
            paired(&t.tps, direct),
            pgpool.map_or("-".to_string(), |p| format!(
                "{:.2}x",
                paired(&t.tps, &p.tps)
            )),
            if t.cpu_us_per_txn.is_empty() {
                "-".to_string()
            } else {
                format!("{:.1}", median(&t.cpu_us_per_txn))
            },
            rounds.join(" / ")
        );
    }
    out.push('\n');
    for line in machine_lines(opts, machine, elapsed) {
        let _ = writeln!(out, "- {line}");
    }
    out
}
