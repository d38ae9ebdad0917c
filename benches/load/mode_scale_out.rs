//! `--scale-out`: PostgreSQL direct vs Fulcrum reading from 1, 2 and 3
//! nodes (a primary and 2 streaming replicas, each in its own CPU-capped
//! cgroup), `pgbench -S` only; the report goes to `target/bench-scale-out.md`
//! and the TPS-vs-nodes plot to `docs/img/scale-out.png`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use fulcrum_testkit::{free_port, FulcrumProcess};

use crate::cpu_caps::CpuCaps;
use crate::fulcrum::{ensure_fulcrum_built, fulcrum_alive, fulcrum_config, scale_out_section};
use crate::machine::{machine_lines, pg_machine, Machine};
use crate::measure::{measure, time_budget, Target};
use crate::pgbench::{init_timeout, start_cluster, Workload};
use crate::{median, publish_report, target_dir, Error, Options, Result, PLOT_FONTS};

/// `--scale-out`: PostgreSQL servers (a primary and its replicas).
pub(crate) const SCALE_OUT_NODES: usize = 3;

/// `--scale-out`: PostgreSQL direct vs Fulcrum reading from 1, 2 and 3
/// nodes of a primary and 2 streaming replicas, each server in its own
/// CPU-capped cgroup so that one node is the bottleneck.
pub(crate) fn run_scale_out(opts: &Options) -> Result<()> {
    let started = Instant::now();
    // First, before anything starts: without cgroups there is nothing to
    // measure. Declared before the cluster, so dropped after it.
    let caps = if opts.cpu_quota > 0.0 {
        match CpuCaps::create(SCALE_OUT_NODES, opts.cpu_quota, opts.cpu_period_us) {
            Ok(caps) => Some(caps),
            Err(reason) => {
                println!(
                    "scale-out benchmark SKIPPED: cannot cap the CPU of each PostgreSQL \
                     server: {reason} (needs root and a writable cgroup v1 cpu or cgroup v2 \
                     hierarchy; --cpu-quota 0 runs uncapped)"
                );
                return Ok(());
            }
        }
    } else {
        eprintln!("--cpu-quota 0: the servers run uncapped");
        None
    };
    let bin = ensure_fulcrum_built()?;
    let init_timeout = init_timeout(opts);
    let targets = 1 + SCALE_OUT_NODES as u64;
    let (expected, worst) = time_budget(opts, targets, init_timeout);
    eprintln!(
        "read scale-out: {targets} targets x {} rounds x {} s after `pgbench -i -s {}`: \
         about {} s in all; every step has a deadline, so at most {} s",
        opts.rounds,
        opts.seconds,
        opts.scale,
        expected.as_secs(),
        worst.as_secs()
    );

    // `pgbench -i` runs uncapped; the caps apply from here on.
    let cluster = start_cluster(opts, init_timeout)?;
    let mut node_names = Vec::new();
    for (i, node) in cluster.nodes().enumerate() {
        node_names.push(node.name().to_string());
        if let Some(caps) = &caps {
            let moved = caps.add_server(i, node.data_dir())?;
            eprintln!(
                "{}: postmaster and {} other processes in {} ({} CPU)",
                node.name(),
                moved - 1,
                caps.groups[i].display(),
                opts.cpu_quota
            );
        }
    }

    const NAMES: [&str; SCALE_OUT_NODES] =
        ["Fulcrum, 1 node", "Fulcrum, 2 nodes", "Fulcrum, 3 nodes"];
    let primary = cluster.primary().addr();
    let replicas: Vec<String> = cluster.replicas().iter().map(|r| r.addr()).collect();
    let mut targets = vec![Target::new("PostgreSQL direct", primary.clone())];
    let mut sections = Vec::new();
    for (nodes, name) in (1..=SCALE_OUT_NODES).zip(NAMES) {
        let listen = format!("127.0.0.1:{}", free_port());
        sections.push(scale_out_section(
            &format!("nodes{nodes}"),
            &listen,
            &primary,
            &replicas[..nodes - 1],
        ));
        targets.push(Target::new(name, listen));
    }
    // One daemon, three listeners; only one of them has clients at a time.
    let fulcrum = FulcrumProcess::start(&fulcrum_config(opts.workers, &sections))?;
    eprintln!(
        "Fulcrum {}: 1, 2 and 3 nodes on {}",
        bin.display(),
        targets[1..]
            .iter()
            .map(|t| t.addr.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let check_alive = || fulcrum_alive(&fulcrum);

    let machine = pg_machine(
        cluster
            .primary()
            .sql("SHOW server_version")
            .map_err(Into::into),
    )?;
    machine.warn_if_busy();
    let throttling = |caps: &CpuCaps| caps.throttling_all(SCALE_OUT_NODES);
    let before = caps.as_ref().map(throttling);
    measure(
        opts,
        Workload::Select,
        Path::new(""),
        None,
        &mut targets,
        check_alive,
    )?;
    // Per node: the share of CPU periods in which the cap held it back.
    let throttled: Vec<(String, f64)> = match (&caps, before) {
        (Some(caps), Some(before)) => throttling(caps)
            .iter()
            .zip(before)
            .zip(&node_names)
            .map(|((after, before), name)| (name.clone(), after.since(before).share()))
            .collect(),
        _ => Vec::new(),
    };

    drop(fulcrum);
    drop(cluster);
    drop(caps);

    let report = render_scale_out(opts, &machine, &targets, &throttled, started.elapsed());
    publish_report(&report, "bench-scale-out.md")?;
    // The uncapped comparison run must not replace the documented plot.
    let plot = if opts.cpu_quota > 0.0 {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/img/scale-out.png")
    } else {
        target_dir().join("scale-out-uncapped.png")
    };
    plot_scale_out(&plot, opts, &targets)?;
    eprintln!("plot written to {}", plot.display());
    Ok(())
}

/// `--scale-out`: the table, the per-node throttling, then the machine.
fn render_scale_out(
    opts: &Options,
    machine: &Machine,
    targets: &[Target],
    throttled: &[(String, f64)],
    elapsed: Duration,
) -> String {
    let mut out = String::new();
    let cap = if opts.cpu_quota > 0.0 {
        format!("each PostgreSQL server capped at {} CPU", opts.cpu_quota)
    } else {
        "servers uncapped".to_string()
    };
    let _ = writeln!(
        out,
        "### pgbench -S, {} clients, -j {}, -M {}, scale {}, {} rounds x {} s, a primary and \
         {} streaming replicas, {cap}\n",
        opts.clients,
        opts.jobs,
        opts.protocol,
        opts.scale,
        opts.rounds,
        opts.seconds,
        SCALE_OUT_NODES - 1
    );
    let _ = writeln!(
        out,
        "| target | nodes | median TPS | ratio to direct | ratio per node \
         | ratio to Fulcrum 1 node | latency p50 / p95 / p99 (ms) | avg latency (ms) \
         | TPS per round |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---|");
    let direct = &targets[0].tps;
    let one_node = &targets[1].tps;
    for (i, target) in targets.iter().enumerate() {
        let nodes = i.max(1);
        let ratios: Vec<f64> = target.tps.iter().zip(direct).map(|(t, d)| t / d).collect();
        let ratio = median(&ratios);
        let to_one: Vec<f64> = target
            .tps
            .iter()
            .zip(one_node)
            .map(|(t, o)| t / o)
            .collect();
        let pct = |k: usize| -> f64 {
            let values: Vec<f64> = target.latency_pcts.iter().map(|p| p[k]).collect();
            median(&values)
        };
        let rounds: Vec<String> = target.tps.iter().map(|t| format!("{t:.0}")).collect();
        let _ = writeln!(
            out,
            "| {} | {nodes} | {:.0} | {ratio:.2}x | {:.2} | {:.2}x | {:.2} / {:.2} / {:.2} \
             | {:.3} | {} |",
            target.name,
            median(&target.tps),
            ratio / nodes as f64,
            median(&to_one),
            pct(0),
            pct(1),
            pct(2),
            median(&target.latency_ms),
            rounds.join(" / ")
        );
    }
    let _ = writeln!(
        out,
        "\nRatios are medians of per-round ratios (each run against the same round's direct \
         run); \"ratio per node\" is that ratio divided by the nodes serving reads, \"ratio \
         to Fulcrum 1 node\" the same against the round's Fulcrum run on the primary alone. \
         Latency \
         percentiles come from pgbench's per-transaction logs (`--log`, every target alike) \
         and are medians over the rounds."
    );
    if !throttled.is_empty() {
        let shares: Vec<String> = throttled
            .iter()
            .map(|(name, share)| format!("{name} {:.0} %", share * 100.0))
            .collect();
        let _ = writeln!(
            out,
            "\nCPU periods ({} ms) in which the cap throttled the server, over all runs \
             (warm-ups included; a node serves only some of the targets): {}",
            opts.cpu_period_us / 1000,
            shares.join(", ")
        );
    }
    out.push('\n');
    for line in machine_lines(opts, machine, elapsed) {
        let _ = writeln!(out, "- {line}");
    }
    out
}

/// `--scale-out`: a PNG of median TPS against the nodes serving reads:
/// Fulcrum, PostgreSQL direct as a reference line, and direct x nodes as
/// the linear ideal.
fn plot_scale_out(path: &Path, opts: &Options, targets: &[Target]) -> Result<()> {
    use plotters::prelude::*;
    let font = PLOT_FONTS
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .ok_or_else(|| format!("no TrueType font for the plot (looked for {PLOT_FONTS:?})"))?;
    plotters::style::register_font("sans-serif", FontStyle::Normal, font.leak())
        .map_err(|_| "the plot's font is not a usable TrueType font")?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let plot_err =
        |e: &dyn std::fmt::Display| -> Error { format!("plot {}: {e}", path.display()).into() };

    let direct = median(&targets[0].tps);
    let fulcrum: Vec<(f64, f64)> = targets[1..]
        .iter()
        .enumerate()
        .map(|(i, t)| ((i + 1) as f64, median(&t.tps)))
        .collect();
    // As in the table: medians of the per-round ratios to direct.
    let ratios: Vec<f64> = targets[1..]
        .iter()
        .map(|t| {
            let r: Vec<f64> = t
                .tps
                .iter()
                .zip(&targets[0].tps)
                .map(|(t, d)| t / d)
                .collect();
            median(&r)
        })
        .collect();
    let nodes = fulcrum.len() as f64;
    let top = fulcrum
        .iter()
        .map(|&(_, y)| y)
        .fold(direct * nodes, f64::max)
        * 1.12;
    let cap = if opts.cpu_quota > 0.0 {
        format!("{} CPU per server", opts.cpu_quota)
    } else {
        "servers uncapped".into()
    };

    let root = BitMapBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "pgbench -S read scale-out ({cap}, {} clients)",
                opts.clients
            ),
            ("sans-serif", 24),
        )
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(0.8f64..nodes + 0.5, 0f64..top)
        .map_err(|e| plot_err(&e))?;
    chart
        .configure_mesh()
        .x_labels(fulcrum.len())
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .disable_x_mesh()
        .light_line_style(WHITE)
        .x_desc("PostgreSQL nodes serving reads")
        .y_desc("TPS (median of rounds)")
        .label_style(("sans-serif", 16))
        .draw()
        .map_err(|e| plot_err(&e))?;
    let grey = RGBColor(150, 150, 150);
    chart
        .draw_series(DashedLineSeries::new(
            [(1.0, direct), (nodes, direct * nodes)],
            8,
            6,
            grey.stroke_width(2),
        ))
        .map_err(|e| plot_err(&e))?
        .label("target shape: direct x nodes")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], grey.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(
            [(0.8, direct), (nodes + 0.5, direct)],
            RED.stroke_width(2),
        ))
        .map_err(|e| plot_err(&e))?
        .label(format!("PostgreSQL direct: {direct:.0} TPS"))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(fulcrum.clone(), BLUE.stroke_width(3)))
        .map_err(|e| plot_err(&e))?
        .label("Fulcrum (reads_on_primary, eventual)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE.stroke_width(3)));
    chart
        .draw_series(
            fulcrum
                .iter()
                .map(|&(x, y)| Circle::new((x, y), 5, BLUE.filled())),
        )
        .map_err(|e| plot_err(&e))?;
    chart
        .draw_series(fulcrum.iter().zip(&ratios).map(|(&(x, y), ratio)| {
            // Below and right of its point, clear of the line.
            EmptyElement::at((x, y))
                + Text::new(
                    format!("{y:.0} TPS ({ratio:.2}x)"),
                    (10, 8),
                    ("sans-serif", 16).into_font().color(&BLACK),
                )
        }))
        .map_err(|e| plot_err(&e))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| plot_err(&e))?;
    root.present().map_err(|e| plot_err(&e))?;
    Ok(())
}
