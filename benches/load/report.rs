//! The `--suite` report: what one scenario measured per target (rounds of
//! throughput and latency percentiles), its markdown table with ratios to the
//! scenario's baseline, its PNG bar chart, and the alternating-rounds loop
//! that fills it. Scenario modules build [`Scenario`]s; the suite renders them.

use std::fmt::Write as _;
use std::path::Path;

use crate::{median, Result, PLOT_FONTS};

/// What one run against one target gave.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Transactions (or queries) per second.
    pub tps: f64,
    /// p50, p95, p99 latency in ms, when the tool reported them.
    pub latency_ms: Option<[f64; 3]>,
    /// (completed, attempted) units, for runs that may not finish everything.
    pub completed: Option<(u64, u64)>,
}

/// One place the load goes to, and its samples, one per round.
#[derive(Debug, Clone)]
pub struct Row {
    pub target: String,
    /// How the load reaches it (address, port, ...), for the runner only.
    pub addr: String,
    /// How many database nodes serve it (shown when a scenario sets it).
    pub nodes: Option<usize>,
    pub samples: Vec<Sample>,
}

impl Row {
    pub fn new(target: impl Into<String>, addr: impl Into<String>) -> Row {
        Row {
            target: target.into(),
            addr: addr.into(),
            nodes: None,
            samples: Vec::new(),
        }
    }

    pub fn with_nodes(mut self, nodes: usize) -> Row {
        self.nodes = Some(nodes);
        self
    }

    pub fn median_tps(&self) -> f64 {
        median(&self.samples.iter().map(|s| s.tps).collect::<Vec<_>>())
    }

    /// Median over rounds of latency percentile `k` (0: p50, 1: p95, 2: p99).
    pub fn latency(&self, k: usize) -> Option<f64> {
        let values: Vec<f64> = self
            .samples
            .iter()
            .filter_map(|s| s.latency_ms.map(|l| l[k]))
            .collect();
        (!values.is_empty()).then(|| median(&values))
    }

    /// Median over rounds of this row's TPS over `base`'s in the same round.
    pub fn ratio_to(&self, base: &Row) -> f64 {
        let ratios: Vec<f64> = self
            .samples
            .iter()
            .zip(&base.samples)
            .map(|(s, b)| s.tps / b.tps)
            .collect();
        median(&ratios)
    }

    /// Completed and attempted units summed over the rounds.
    pub fn completed(&self) -> Option<(u64, u64)> {
        self.samples
            .iter()
            .filter_map(|s| s.completed)
            .reduce(|(a, b), (c, d)| (a + c, b + d))
    }
}

/// A target the scenario is held to, and whether the run met it.
#[derive(Debug, Clone)]
pub struct Goal {
    pub what: String,
    pub measured: String,
    pub met: bool,
}

impl Goal {
    /// `row` over `base` at least `min` (a ratio, e.g. 0.95).
    pub fn ratio_at_least(what: &str, row: &Row, base: &Row, min: f64) -> Goal {
        let r = row.ratio_to(base);
        Goal {
            what: format!("{what}: {} >= {min:.2}x {}", row.target, base.target),
            measured: format!("{r:.2}x"),
            met: r >= min,
        }
    }
}

/// One scenario's results: a table, its goals and a chart.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// File-name stem of its chart: `docs/img/suite-<id>.png`.
    pub id: String,
    pub title: String,
    /// How it was run: tool, clients, duration, nodes, caps.
    pub setup: String,
    pub rows: Vec<Row>,
    /// Index of the row every ratio is taken against (the direct run).
    pub baseline: usize,
    pub goals: Vec<Goal>,
    /// Free text below the table (what the figures mean, what went wrong).
    pub notes: Vec<String>,
}

impl Scenario {
    pub fn new(id: &str, title: impl Into<String>, setup: impl Into<String>) -> Scenario {
        Scenario {
            id: id.into(),
            title: title.into(),
            setup: setup.into(),
            rows: Vec::new(),
            baseline: 0,
            goals: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// The row named `target`, if any.
    pub fn row(&self, target: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.target == target)
    }

    /// The markdown: heading, setup, table, goals, notes, chart link
    /// (`img` is the chart's path relative to the markdown file).
    pub fn markdown(&self, img: Option<&str>) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "### {}\n\n{}\n", self.title, self.setup);
        if self.rows.is_empty() {
            return self.markdown_goals_and_notes(out);
        }
        let nodes = self.rows.iter().any(|r| r.nodes.is_some());
        let latency = self.rows.iter().any(|r| r.latency(0).is_some());
        let completed = self.rows.iter().any(|r| r.completed().is_some());
        let mut head = vec!["target"];
        if nodes {
            head.push("nodes");
        }
        head.extend(["median TPS", "ratio to direct"]);
        if latency {
            head.push("latency p50 / p95 / p99 (ms)");
        }
        if completed {
            head.push("completed");
        }
        head.push("TPS per round");
        let _ = writeln!(out, "| {} |", head.join(" | "));
        let align: Vec<&str> = head
            .iter()
            .map(|h| match *h {
                "target" | "TPS per round" => "---",
                _ => "---:",
            })
            .collect();
        let _ = writeln!(out, "|{}|", align.join("|"));
        let base = &self.rows[self.baseline];
        for row in &self.rows {
            let mut cells = vec![row.target.clone()];
            if nodes {
                cells.push(row.nodes.map_or("".into(), |n| n.to_string()));
            }
            cells.push(format!("{:.0}", row.median_tps()));
            cells.push(format!("{:.2}x", row.ratio_to(base)));
            if latency {
                cells.push(match (row.latency(0), row.latency(1), row.latency(2)) {
                    (Some(a), Some(b), Some(c)) => format!("{a:.3} / {b:.3} / {c:.3}"),
                    _ => "".into(),
                });
            }
            if completed {
                cells.push(row.completed().map_or("".into(), |(done, of)| {
                    format!(
                        "{done} / {of} ({:.0} %)",
                        100.0 * done as f64 / of.max(1) as f64
                    )
                }));
            }
            let rounds: Vec<String> = row
                .samples
                .iter()
                .map(|s| format!("{:.0}", s.tps))
                .collect();
            cells.push(rounds.join(" / "));
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
        let mut out = self.markdown_goals_and_notes(out);
        if let Some(img) = img {
            let _ = writeln!(out, "![{}]({img})\n", self.title);
        }
        out
    }

    /// `out`, then the goals and the notes.
    fn markdown_goals_and_notes(&self, mut out: String) -> String {
        if !self.goals.is_empty() {
            out.push('\n');
            for goal in &self.goals {
                let _ = writeln!(
                    out,
                    "- {} — measured {}: **{}**",
                    goal.what,
                    goal.measured,
                    if goal.met { "met" } else { "NOT met" }
                );
            }
        }
        for note in &self.notes {
            let _ = writeln!(out, "\n{note}");
        }
        out.push('\n');
        out
    }

    /// A PNG bar chart of median TPS per target, each bar labelled with
    /// its ratio to the baseline.
    pub fn plot(&self, path: &Path) -> Result<()> {
        use plotters::prelude::*;
        if self.rows.is_empty() {
            return Err("nothing to plot".into());
        }
        register_font()?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        let plot_err = |e: &dyn std::fmt::Display| -> crate::Error {
            format!("plot {}: {e}", path.display()).into()
        };
        let base = &self.rows[self.baseline];
        let bars: Vec<(String, f64, f64)> = self
            .rows
            .iter()
            .map(|r| (r.target.clone(), r.median_tps(), r.ratio_to(base)))
            .collect();
        let top = bars.iter().map(|b| b.1).fold(1.0, f64::max) * 1.15;
        let n = bars.len();
        let root = BitMapBackend::new(path, (900, 120 + 60 * n as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| plot_err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&self.title, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(230)
            .build_cartesian_2d(0f64..top, (0..n - 1).into_segmented())
            .map_err(|e| plot_err(&e))?;
        let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
        chart
            .configure_mesh()
            .disable_y_mesh()
            .light_line_style(WHITE)
            .x_desc("TPS (median of rounds)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| match y {
                SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .label_style(("sans-serif", 15))
            .draw()
            .map_err(|e| plot_err(&e))?;
        let colour = |name: &str| -> RGBColor {
            if name.contains("Fulcrum") {
                RGBColor(40, 90, 200)
            } else if name.contains("direct") {
                RGBColor(200, 60, 60)
            } else {
                RGBColor(130, 130, 130)
            }
        };
        chart
            .draw_series(bars.iter().enumerate().map(|(i, (name, tps, _))| {
                let mut bar = Rectangle::new(
                    [
                        (0.0, SegmentValue::Exact(i)),
                        (*tps, SegmentValue::Exact(i + 1)),
                    ],
                    colour(name).filled(),
                );
                bar.set_margin(8, 8, 0, 0);
                bar
            }))
            .map_err(|e| plot_err(&e))?;
        chart
            .draw_series(bars.iter().enumerate().map(|(i, (_, tps, ratio))| {
                EmptyElement::at((*tps, SegmentValue::CenterOf(i)))
                    + Text::new(
                        format!("{tps:.0} ({ratio:.2}x)"),
                        (6, -8),
                        ("sans-serif", 15).into_font().color(&BLACK),
                    )
            }))
            .map_err(|e| plot_err(&e))?;
        root.present().map_err(|e| plot_err(&e))?;
        Ok(())
    }
}

/// Registers the first TrueType font found as plotters' "sans-serif" (once).
pub fn register_font() -> Result<()> {
    use std::sync::OnceLock;
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let font = PLOT_FONTS
            .iter()
            .find_map(|p| std::fs::read(p).ok())
            .ok_or_else(|| format!("no TrueType font for the plots (looked for {PLOT_FONTS:?})"))?;
        plotters::style::register_font(
            "sans-serif",
            plotters::style::FontStyle::Normal,
            font.leak(),
        )
        .map_err(|_| "the plot's font is not a usable TrueType font".to_string())
    })
    .clone()
    .map_err(Into::into)
}

/// One warm-up run per row (its sample dropped), then `rounds` rounds of one
/// run per row, starting each round one row later so no row always follows
/// the same other. `run(row)` measures one row; `check` runs after every run
/// (e.g. fails when a proxy died).
pub fn alternate(
    rows: &mut [Row],
    rounds: usize,
    warmup: bool,
    mut run: impl FnMut(&Row, bool) -> Result<Sample>,
    mut check: impl FnMut() -> Result<()>,
) -> Result<()> {
    if warmup {
        for row in rows.iter() {
            eprintln!("  warm-up: {}", row.target);
            run(row, true).map_err(|e| format!("warm-up against {}: {e}", row.target))?;
            check()?;
        }
    }
    let n = rows.len();
    for round in 0..rounds {
        for i in 0..n {
            let row = &mut rows[(round + i) % n];
            let sample = run(row, false)
                .map_err(|e| format!("round {} against {}: {e}", round + 1, row.target))?;
            check()?;
            let lat = sample.latency_ms.map_or(String::new(), |l| {
                format!("  p50/p95/p99 {:.3}/{:.3}/{:.3} ms", l[0], l[1], l[2])
            });
            eprintln!(
                "  round {}/{rounds}: {:<28} {:>9.0} TPS{lat}",
                round + 1,
                row.target,
                sample.tps
            );
            row.samples.push(sample);
        }
    }
    Ok(())
}

/// p50, p95 and p99 (ms) from sysbench's `--histogram` output (lines
/// `value |***  count`, value in ms), by cumulative count.
pub fn sysbench_percentiles(stdout: &str) -> Option<[f64; 3]> {
    let mut buckets: Vec<(f64, u64)> = Vec::new();
    let mut inside = false;
    for line in stdout.lines() {
        if line.contains("Latency histogram") {
            inside = true;
            continue;
        }
        if !inside {
            continue;
        }
        let Some((value, rest)) = line.split_once('|') else {
            if !buckets.is_empty() {
                break;
            }
            continue;
        };
        let (Ok(value), Some(Ok(count))) = (
            value.trim().parse::<f64>(),
            rest.split_whitespace().last().map(str::parse::<u64>),
        ) else {
            continue;
        };
        buckets.push((value, count));
    }
    let total: u64 = buckets.iter().map(|b| b.1).sum();
    if total == 0 {
        return None;
    }
    let at = |p: f64| -> f64 {
        let want = (p * total as f64).ceil() as u64;
        let mut seen = 0;
        for &(value, count) in &buckets {
            seen += count;
            if seen >= want {
                return value;
            }
        }
        buckets.last().map_or(f64::NAN, |b| b.0)
    };
    Some([at(0.50), at(0.95), at(0.99)])
}
