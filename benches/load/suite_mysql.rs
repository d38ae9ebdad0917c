//! `--suite` on MariaDB: the published comparisons' shapes with sysbench and
//! mysql_async against a primary and GTID replicas this module starts,
//! direct vs Fulcrum, uncapped and with each server CPU-capped.
//!
//! Two regimes, each on servers of its own, torn down (with the daemon and
//! the cgroups) when it ends or fails:
//!
//! - **Capped**: a primary and 2 GTID replicas, each `mariadbd` in its own
//!   CPU-capped cgroup (after `sysbench prepare`, which runs uncapped), and one
//!   Fulcrum daemon with a listener per node set. `my-scale-out`: sysbench
//!   `oltp_point_select` directly and through Fulcrum reading from 1, 2 and 3
//!   nodes. `my-s1-*` (published scenario 1, MySQL Proxy with 1 master + 1
//!   slave): simple read, complex read, write and combined, direct vs Fulcrum
//!   on 2 nodes. Skipped, with the reason in the report, where CPU cannot be
//!   capped.
//! - **Uncapped**: one server with `max_connections = 100`. `my-overhead-N`
//!   (published scenario 3): `SELECT VERSION()` from a sysbench Lua script at
//!   1, 5 and 45 clients, latency percentiles from sysbench's histogram.
//!   `my-connections` (published scenario 4): 2,000 mysql_async clients each
//!   connecting, running `SELECT 1` and disconnecting 5 times, all at once.
//!
//! Each scenario runs inside [`SuiteReport::attempt`], so one that fails is
//! reported and the others still run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fulcrum_testkit::{
    free_port, FulcrumProcess, MariaCluster, MariaNode, APP_DB, APP_PASSWORD, APP_USER,
};
use mysql_async::prelude::Queryable;

use crate::cpu_caps::CpuCaps;
use crate::fulcrum::fulcrum_config;
use crate::process::{first_line, tail};
use crate::relay::TcpRelay;
use crate::report::{self, Goal, Row, Sample, Scenario};
use crate::suite::SuiteReport;
use crate::sysbench::{
    com_select, sysbench, SysbenchResult, SYSBENCH_PREPARE_TIMEOUT, SYSBENCH_TABLES,
};
use crate::{Options, Result, RUN_GRACE, WARMUP_SECONDS};

/// Capped regime: a primary and 2 replicas.
const CAPPED_NODES: usize = 3;
/// `my-scale-out`: the name of the control row (a plain TCP relay).
const RELAY_TARGET: &str = "TCP relay (socat), 1 node";
/// `my-scale-out`: sysbench `--threads`.
const SCALE_OUT_THREADS: u32 = 16;
/// `my-scale-out`: the least each node count must reach, as a ratio to direct.
const SCALE_OUT_GOALS: [(usize, f64); 2] = [(2, 1.88), (3, 2.70)];
/// `my-s1-*`: sysbench `--threads` (the published runs used 20-65 clients).
const S1_THREADS: u32 = 32;
/// `my-s1-write-only`: the least Fulcrum must reach, as a ratio to direct.
const S1_WRITE_GOAL: f64 = 0.97;
/// `my-overhead-*`: sysbench `--threads`, one scenario each.
const OVERHEAD_CLIENTS: [u32; 3] = [1, 5, 45];
/// `my-overhead-1`: the most Fulcrum may add to the p50, in ms.
const OVERHEAD_GOAL_MS: f64 = 0.050;
/// Uncapped regime: the server's `max_connections` (`my-connections`).
const MAX_CONNECTIONS: u32 = 100;
/// `my-connections`: clients started at once, and the units (connect,
/// `SELECT 1`, disconnect) each runs one after another.
const STORM_CLIENTS: u64 = 2_000;
const STORM_UNITS: u64 = 5;
/// `my-connections`: units still running after this are counted as not done.
const STORM_DEADLINE: Duration = Duration::from_secs(60);
/// Fulcrum's `pool_size` in every cluster here (server connections per node).
const POOL_SIZE: u32 = crate::POOL_SIZE;
/// sysbench's latency histogram: 1,024 logarithmic buckets from 0.001 ms to
/// 100,000 ms (`sb_histogram_init` in sysbench 1.0).
const HISTOGRAM_BUCKETS: f64 = 1024.0;
const HISTOGRAM_RANGE: (f64, f64) = (0.001, 100_000.0);

/// `my-overhead-*`: one `SELECT VERSION()` per sysbench event, on one
/// connection per thread opened before the clock starts.
const SELECT_VERSION_SCRIPT: &str = r#"-- Fulcrum load bench: one SELECT VERSION() per event.
function thread_init()
  drv = sysbench.sql.driver()
  con = drv:connect()
end

function thread_done()
  con:disconnect()
end

function event()
  con:query("SELECT VERSION()")
end
"#;

/// One sysbench workload of published scenario 1 (MySQL Proxy, 1 master +
/// 1 slave).
struct S1Workload {
    id: &'static str,
    /// The published comparison's name for it.
    label: &'static str,
    args: &'static [&'static str],
}

const S1_WORKLOADS: [S1Workload; 4] = [
    S1Workload {
        id: "my-s1-point-select",
        label: "simple read",
        args: &["oltp_point_select"],
    },
    S1Workload {
        id: "my-s1-read-only",
        label: "complex read",
        args: &["oltp_read_only", "--skip-trx=on"],
    },
    S1Workload {
        id: "my-s1-write-only",
        label: "write",
        args: &["oltp_write_only"],
    },
    S1Workload {
        id: "my-s1-read-write",
        label: "combined",
        args: &["oltp_read_write"],
    },
];

/// Runs every MariaDB scenario, adding each result (or failure) to `report`.
pub fn run(opts: &Options, report: &mut SuiteReport) {
    report.attempt("MariaDB, capped: cluster and Fulcrum", |report| {
        capped(opts, report)
    });
    report.attempt("MariaDB, uncapped: server and Fulcrum", |report| {
        uncapped(opts, report)
    });
}

// ---------------------------------------------------------------- capped --

/// The capped regime: cgroups, a primary and 2 replicas with the sysbench
/// tables, one daemon; then `my-scale-out` and the `my-s1-*` scenarios.
fn capped(opts: &Options, report: &mut SuiteReport) -> Result<()> {
    // Declared first, so dropped last: the servers have stopped by then.
    let Some(caps) = crate::suite::caps(opts, CAPPED_NODES, report) else {
        eprintln!("MariaDB capped scenarios SKIPPED (see the report's record)");
        return Ok(());
    };
    let cluster = MariaCluster::builder().replicas(CAPPED_NODES - 1).start()?;
    record_version(&cluster, report)?;
    prepare_tables(opts, &cluster)?;
    let names = cap_nodes(&caps, &cluster, opts.cpu_quota)?;
    let addrs: Vec<String> = cluster.nodes().map(MariaNode::addr).collect();

    // Listeners: reads from the first 1, 2, 3 nodes (eventual), and the
    // scenario 1 cluster (default consistency) on the primary and replica 1.
    let scale_listens: Vec<String> = (0..CAPPED_NODES).map(|_| listen_addr()).collect();
    let s1_listen = listen_addr();
    let mut sections: Vec<String> = scale_listens
        .iter()
        .enumerate()
        .map(|(i, listen)| {
            let name = format!("nodes{}", i + 1);
            cluster_section(&name, listen, Some("eventual"), &addrs[..=i])
        })
        .collect();
    sections.push(cluster_section("s1", &s1_listen, None, &addrs[..2]));
    let fulcrum = FulcrumProcess::start(&fulcrum_config(opts.workers, &sections))?;
    eprintln!(
        "Fulcrum: 1, 2, 3 nodes (eventual) on {}; 2 nodes (session) on {s1_listen}",
        scale_listens.join(", ")
    );
    let bench = Capped {
        opts,
        caps: &caps,
        cluster: &cluster,
        names: &names,
        fulcrum: &fulcrum,
    };

    report.attempt("MariaDB read scale-out, capped (my-scale-out)", |report| {
        // The control: the cost of an extra hop alone, with no proxy logic.
        let relay = match TcpRelay::start(free_port(), &cluster.primary().addr()) {
            Ok(relay) => Some(relay),
            Err(e) => {
                eprintln!("the TCP relay control is left out: {e}");
                None
            }
        };
        report.add(bench.scale_out(&scale_listens, relay.as_ref().map(|r| r.addr.as_str()))?);
        Ok(())
    });
    for workload in &S1_WORKLOADS {
        let what = format!("MariaDB scenario 1, {} ({})", workload.label, workload.id);
        report.attempt(&what, |report| {
            report.add(bench.scenario_1(workload, &s1_listen)?);
            Ok(())
        });
    }
    Ok(())
}

/// `SELECT VERSION()` of the primary into the report's versions.
fn record_version(cluster: &MariaCluster, report: &mut SuiteReport) -> Result<()> {
    let version = cluster.primary().sql("SELECT VERSION()")?;
    report.version(format!("MariaDB {}", version.trim()));
    Ok(())
}

/// `sysbench oltp_common prepare` directly on the primary (uncapped), then
/// waits for the replicas to apply it.
fn prepare_tables(opts: &Options, cluster: &MariaCluster) -> Result<()> {
    eprintln!(
        "sysbench oltp_common prepare ({} tables x {} rows) on the primary ...",
        SYSBENCH_TABLES, opts.table_size
    );
    sysbench(
        opts,
        cluster.primary().port(),
        &["oltp_common", "prepare"],
        SYSBENCH_PREPARE_TIMEOUT,
    )
    .map_err(|e| format!("sysbench prepare: {e}"))?;
    cluster.wait_replicas_caught_up(SYSBENCH_PREPARE_TIMEOUT)?;
    Ok(())
}

/// Moves each node's `mariadbd` into its cgroup (one process: every thread,
/// replication's included, moves with it). Returns the nodes' names.
fn cap_nodes(caps: &CpuCaps, cluster: &MariaCluster, quota: f64) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for (i, node) in cluster.nodes().enumerate() {
        let pid = node
            .pid()
            .ok_or_else(|| format!("{}: mariadbd is not running", node.name()))?;
        caps.add_process(i, pid)?;
        eprintln!(
            "{}: mariadbd {pid} in {} ({quota} CPU)",
            node.name(),
            caps.groups[i].display()
        );
        names.push(node.name().to_string());
    }
    Ok(names)
}

/// What the capped scenarios share: the capped cluster and the daemon.
struct Capped<'a> {
    opts: &'a Options,
    caps: &'a CpuCaps,
    cluster: &'a MariaCluster,
    /// The nodes' names, in [`MariaCluster::nodes`] order.
    names: &'a [String],
    fulcrum: &'a FulcrumProcess,
}

impl Capped<'_> {
    /// `my-scale-out`: `oltp_point_select` directly on the primary and
    /// through Fulcrum reading from 1, 2 and 3 nodes (`listens[i]`: i + 1).
    /// The last row is `relay` (a plain TCP relay to the primary) when there
    /// is one: the control that separates the cost of any extra hop from
    /// Fulcrum's own.
    fn scale_out(&self, listens: &[String], relay: Option<&str>) -> Result<Scenario> {
        let opts = self.opts;
        let mut scenario = Scenario::new(
            "my-scale-out",
            format!(
                "MariaDB read scale-out, each server capped at {} CPU: sysbench \
                 oltp_point_select, {SCALE_OUT_THREADS} threads",
                opts.cpu_quota
            ),
            format!(
                "A MariaDB primary and 2 GTID replicas, each `mariadbd` in its own cgroup \
                 capped at {quota} CPU (the tables are prepared before capping); sysbench \
                 and Fulcrum are not capped. sysbench `oltp_point_select`, \
                 {SCALE_OUT_THREADS} threads, {tables} tables x {rows} rows, \
                 `--db-ps-mode={ps}`. Targets: the primary directly, and one Fulcrum daemon \
                 (`workers = {workers}`, transaction pooling, `pool_size = {POOL_SIZE}`) \
                 with a listener per node set: the primary alone, the primary and replica 1, \
                 all three; `reads_on_primary = true`, `consistency = \"eventual\"`, reads \
                 round robin. {control}{rounds}",
                control = if relay.is_some() {
                    format!(
                        "The control `{RELAY_TARGET}`: `socat` copying bytes between sysbench \
                         and the primary (TCP_NODELAY both sides), one process per connection \
                         and no parsing, so its loss against direct is what any extra hop \
                         costs this capped server. "
                    )
                } else {
                    "The TCP relay control was left out: `socat` is not installed. ".to_string()
                },
                quota = opts.cpu_quota,
                tables = SYSBENCH_TABLES,
                rows = opts.table_size,
                ps = opts.ps_mode,
                workers = opts.workers,
                rounds = rounds_text(opts),
            ),
        );
        scenario
            .rows
            .push(Row::new("MariaDB direct", self.cluster.primary().addr()).with_nodes(1));
        for (i, listen) in listens.iter().enumerate() {
            let nodes = i + 1;
            let name = if nodes == 1 {
                "Fulcrum, 1 node".to_string()
            } else {
                format!("Fulcrum, {nodes} nodes")
            };
            scenario
                .rows
                .push(Row::new(name, listen.clone()).with_nodes(nodes));
        }
        if let Some(relay) = relay {
            scenario
                .rows
                .push(Row::new(RELAY_TARGET, relay.to_string()).with_nodes(1));
        }
        let counts = self.measure(
            &mut scenario.rows,
            &["oltp_point_select"],
            SCALE_OUT_THREADS,
        )?;
        for (nodes, min) in SCALE_OUT_GOALS {
            let goal = Goal::ratio_at_least(
                "MariaDB read scale-out, capped, oltp_point_select",
                &scenario.rows[nodes],
                &scenario.rows[0],
                min,
            );
            scenario.goals.push(goal);
        }
        scenario.notes.extend(counts_notes(self.names, &counts));
        Ok(scenario)
    }

    /// One `my-s1-*`: `workload` directly on the primary and through the
    /// 2-node session cluster on `listen`.
    fn scenario_1(&self, workload: &S1Workload, listen: &str) -> Result<Scenario> {
        let opts = self.opts;
        let command = workload.args.join(" ");
        let mut scenario = Scenario::new(
            workload.id,
            format!(
                "MariaDB scenario 1, {}: sysbench {command}, {S1_THREADS} threads, 1 primary \
                 + 1 replica, each capped at {} CPU",
                workload.label, opts.cpu_quota
            ),
            format!(
                "The shape of the published MySQL Proxy comparison (1 master + 1 slave, \
                 sysbench simple read, complex read, write and combined, 20-65 clients, proxy \
                 vs direct): MySQL Proxy reached +87.7 % over direct on simple reads, +92.5 % \
                 on complex reads, and matched direct on writes. Here ({}): sysbench `{command}`, {S1_THREADS} threads, {tables} tables x {rows} \
                 rows, `--db-ps-mode={ps}`, on the capped cluster of the scale-out scenario \
                 ({quota} CPU per server). Targets: the primary directly, and Fulcrum in \
                 front of the primary and replica 1 (`reads_on_primary = true`, the default \
                 `consistency = \"session\"`, transaction pooling, `pool_size = {POOL_SIZE}`). \
                 Autocommit reads may go to either node; transactions (BEGIN ... COMMIT) and \
                 writes go to the primary. {rounds}",
                workload.label,
                tables = SYSBENCH_TABLES,
                rows = opts.table_size,
                ps = opts.ps_mode,
                quota = opts.cpu_quota,
                rounds = rounds_text(opts),
            ),
        );
        scenario.rows = vec![
            Row::new("MariaDB direct", self.cluster.primary().addr()).with_nodes(1),
            Row::new("Fulcrum, 2 nodes", listen).with_nodes(2),
        ];
        let counts = self.measure(&mut scenario.rows, workload.args, S1_THREADS)?;
        if workload.id == "my-s1-write-only" {
            scenario.goals.push(Goal::ratio_at_least(
                "MariaDB scenario 1, write (oltp_write_only), capped",
                &scenario.rows[1],
                &scenario.rows[0],
                S1_WRITE_GOAL,
            ));
        }
        scenario.notes.extend(counts_notes(self.names, &counts));
        Ok(scenario)
    }

    /// Warm-up and rounds of `workload` over `rows`; returns, per row, what
    /// its measured runs did on each node.
    fn measure(&self, rows: &mut [Row], workload: &[&str], threads: u32) -> Result<Vec<Counts>> {
        let nodes: Vec<&MariaNode> = self.cluster.nodes().collect();
        let mut counts: Vec<Counts> = rows
            .iter()
            .map(|r| Counts {
                target: r.target.clone(),
                transactions: 0,
                nodes: vec![NodeCounts::default(); nodes.len()],
            })
            .collect();
        report::alternate(
            rows,
            self.opts.rounds,
            true,
            |row, warm_up| {
                let before = self.node_counts(&nodes)?;
                let (sample, transactions) =
                    sysbench_sample(self.opts, &row.addr, workload, threads, warm_up)?;
                let after = self.node_counts(&nodes)?;
                if let Some(c) = counts.iter_mut().find(|c| c.target == row.target) {
                    if !warm_up {
                        c.add(transactions, &before, &after);
                    }
                }
                Ok(sample)
            },
            || fulcrum_alive(self.fulcrum),
        )?;
        Ok(counts)
    }

    /// Each node's counters now.
    fn node_counts(&self, nodes: &[&MariaNode]) -> Result<Vec<NodeCounts>> {
        nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let (periods, throttled) = self.caps.throttling(i);
                Ok(NodeCounts {
                    selects: com_select(node)?,
                    periods,
                    throttled,
                    cpu_ticks: node.pid().and_then(cpu_ticks).unwrap_or(0),
                })
            })
            .collect()
    }
}

/// One node's counters: `Com_select`, its cgroup's CPU periods and
/// throttled periods (`cpu.stat`), and the CPU time its `mariadbd` used.
#[derive(Debug, Clone, Default)]
struct NodeCounts {
    selects: u64,
    periods: u64,
    throttled: u64,
    /// User + system time of every thread, in clock ticks.
    cpu_ticks: u64,
}

/// Clock ticks per second of `/proc/<pid>/stat` times (`USER_HZ`, 100 on
/// every Linux architecture Debian ships).
const TICKS_PER_SECOND: f64 = 100.0;

/// User + system CPU time of process `pid` (all its threads), in clock ticks:
/// fields 14 and 15 of `/proc/<pid>/stat`, counted after the parenthesised
/// command name (which may hold spaces).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_ticks(&stat)
}

fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// What one target's measured runs did on each node.
struct Counts {
    target: String,
    /// sysbench transactions (events) over those runs.
    transactions: u64,
    /// Increments over those runs, per node.
    nodes: Vec<NodeCounts>,
}

impl Counts {
    /// Adds one run: its transactions and each node's increments.
    fn add(&mut self, transactions: u64, before: &[NodeCounts], after: &[NodeCounts]) {
        self.transactions += transactions;
        for (sum, (b, a)) in self.nodes.iter_mut().zip(before.iter().zip(after)) {
            sum.selects += a.selects.saturating_sub(b.selects);
            sum.periods += a.periods.saturating_sub(b.periods);
            sum.throttled += a.throttled.saturating_sub(b.throttled);
            sum.cpu_ticks += a.cpu_ticks.saturating_sub(b.cpu_ticks);
        }
    }
}

/// The notes of a capped scenario: how often the cap throttled each node,
/// the server CPU each transaction cost, and where the SELECTs ran, per
/// target.
fn counts_notes(names: &[String], counts: &[Counts]) -> [String; 3] {
    let nodes = names.join(" / ");
    let per_target = |cell: &dyn Fn(&Counts, &NodeCounts) -> String| -> String {
        let targets: Vec<String> = counts
            .iter()
            .map(|c| {
                let cells: Vec<String> = c.nodes.iter().map(|n| cell(c, n)).collect();
                format!("{} {}", c.target, cells.join(" / "))
            })
            .collect();
        targets.join("; ")
    };
    let throttled = per_target(&|_, n| {
        if n.periods == 0 {
            "idle".to_string()
        } else {
            format!("{:.0} %", 100.0 * n.throttled as f64 / n.periods as f64)
        }
    });
    let selects =
        per_target(&|c, n| format!("{:.2}", n.selects as f64 / c.transactions.max(1) as f64));
    let cpu = counts
        .iter()
        .map(|c| {
            let ticks: u64 = c.nodes.iter().map(|n| n.cpu_ticks).sum();
            let micros = ticks as f64 / TICKS_PER_SECOND * 1e6 / c.transactions.max(1) as f64;
            format!("{} {micros:.0}", c.target)
        })
        .collect::<Vec<_>>()
        .join("; ");
    [
        format!(
            "Share of its CPU periods (100 ms, counted while it had work) in which the cap \
             throttled each server ({nodes}), during each target's measured runs: \
             {throttled}. Near 100 % means that server's cap bounded the target's \
             throughput, not the proxy or sysbench."
        ),
        format!(
            "`Com_select` per sysbench transaction on {nodes} (executed prepared SELECTs \
             included; health checks add a little), during each target's measured runs: \
             {selects}."
        ),
        format!(
            "Server CPU per sysbench transaction, in µs (user + system time of the \
             `mariadbd` processes, all nodes summed), during each target's measured runs: \
             {cpu}. With the caps binding, throughput is the caps' CPU divided by this."
        ),
    ]
}

// -------------------------------------------------------------- uncapped --

/// The uncapped regime: one server, one Fulcrum listener in front of it;
/// then `my-overhead-*` and `my-connections`.
fn uncapped(opts: &Options, report: &mut SuiteReport) -> Result<()> {
    // Before anything starts: the daemon and the server inherit it.
    fulcrum_testkit::raise_fd_limit();
    let cluster = MariaCluster::builder()
        .setting("max-connections", &MAX_CONNECTIONS.to_string())
        // 2,000 clients dropped at the deadline must not get 127.0.0.1
        // blocked (ERR 1129) for the rest of the run.
        .setting("max-connect-errors", "1000000000")
        .start()?;
    record_version(&cluster, report)?;
    let listen = listen_addr();
    let section = cluster_section("single", &listen, None, &[cluster.primary().addr()]);
    let fulcrum = FulcrumProcess::start(&fulcrum_config(opts.workers, &[section]))?;
    eprintln!(
        "MariaDB on {} (max_connections = {MAX_CONNECTIONS}), Fulcrum on {listen}",
        cluster.primary().addr()
    );
    let script = TempFile::create("select-version.lua", SELECT_VERSION_SCRIPT)?;
    let primary = cluster.primary();

    for clients in OVERHEAD_CLIENTS {
        let what = format!(
            "MariaDB per-query overhead, {} (my-overhead-{clients})",
            clients_text(clients)
        );
        report.attempt(&what, |report| {
            report.add(overhead(
                opts, clients, &script, primary, &listen, &fulcrum,
            )?);
            Ok(())
        });
    }
    report.attempt(
        "MariaDB more clients than max_connections (my-connections)",
        |report| {
            report.add(connections(primary, &listen, &fulcrum)?);
            Ok(())
        },
    );
    Ok(())
}

/// One `my-overhead-N`: `SELECT VERSION()` at `clients` threads directly
/// and through Fulcrum on `listen`.
fn overhead(
    opts: &Options,
    clients: u32,
    script: &TempFile,
    primary: &MariaNode,
    listen: &str,
    fulcrum: &FulcrumProcess,
) -> Result<Scenario> {
    let mut scenario = Scenario::new(
        &format!("my-overhead-{clients}"),
        format!(
            "MariaDB per-query overhead: SELECT VERSION(), {}, uncapped",
            clients_text(clients)
        ),
        format!(
            "The shape of published scenario 3 (the latency a proxy adds to a trivial \
             query). One MariaDB server, uncapped; a sysbench 1.0 Lua script whose event is \
             one `SELECT VERSION()` on a connection per thread opened before the clock \
             starts; {clients} sysbench threads, so TPS is queries per second. \
             Targets: the server directly, and Fulcrum in front of it (`workers = {}`, \
             transaction pooling, `pool_size = {POOL_SIZE}`). Latency percentiles come \
             from sysbench's `--histogram`. {}",
            opts.workers,
            rounds_text(opts)
        ),
    );
    scenario.rows = vec![
        Row::new(
            format!("MariaDB direct, {}", clients_text(clients)),
            primary.addr(),
        ),
        Row::new(format!("Fulcrum, {}", clients_text(clients)), listen),
    ];
    let script_path = script.path();
    report::alternate(
        &mut scenario.rows,
        opts.rounds,
        true,
        |row, warm_up| {
            sysbench_sample(opts, &row.addr, &[script_path.as_str()], clients, warm_up)
                .map(|(sample, _)| sample)
        },
        || fulcrum_alive(fulcrum),
    )?;
    let (direct, proxied) = (&scenario.rows[0], &scenario.rows[1]);
    let (Some(d), Some(f)) = (direct.latency(0), proxied.latency(0)) else {
        return Err("no p50 from sysbench's histogram".into());
    };
    let added = f - d;
    if clients == 1 {
        scenario.goals.push(Goal {
            what: format!(
                "added latency p50, 1 client, SELECT VERSION() (MariaDB): <= \
                 {OVERHEAD_GOAL_MS:.3} ms over direct"
            ),
            measured: format!("{added:.3} ms"),
            met: added <= OVERHEAD_GOAL_MS,
        });
    }
    scenario.notes.push(format!(
        "Added at p50 (median of rounds, Fulcrum minus direct): {added:.3} ms ({d:.3} ms \
         direct, {f:.3} ms through Fulcrum). {}",
        histogram_note(d)
    ));
    Ok(scenario)
}

/// "1 client", "5 clients".
fn clients_text(clients: u32) -> String {
    match clients {
        1 => "1 client".into(),
        n => format!("{n} clients"),
    }
}

/// How fine sysbench's latency histogram is around `ms`.
fn histogram_note(ms: f64) -> String {
    let (low, high) = HISTOGRAM_RANGE;
    let step = (high / low).powf(1.0 / HISTOGRAM_BUCKETS);
    format!(
        "sysbench's histogram has {HISTOGRAM_BUCKETS} logarithmic buckets from {low} ms to \
         {:.0} s, each {:.1} % wider than the one below, and prints bucket values to 0.001 \
         ms: around {ms:.3} ms a percentile is known to about {:.3} ms, so each p50 here \
         is exact to that step and the difference to about twice it.",
        high / 1000.0,
        100.0 * (step - 1.0),
        (ms * (step - 1.0)).max(0.001)
    )
}

/// `my-connections`: the connection storm directly, then through Fulcrum.
fn connections(primary: &MariaNode, listen: &str, fulcrum: &FulcrumProcess) -> Result<Scenario> {
    let attempted = STORM_CLIENTS * STORM_UNITS;
    let mut scenario = Scenario::new(
        "my-connections",
        format!(
            "MariaDB, more clients than the server allows: {STORM_CLIENTS} clients x \
             {STORM_UNITS} connect / SELECT 1 / disconnect, max_connections = {MAX_CONNECTIONS}"
        ),
        format!(
            "The shape of published scenario 4 (more clients than the server accepts). One \
             MariaDB server with `max_connections = {MAX_CONNECTIONS}`, uncapped. \
             {STORM_CLIENTS} mysql_async clients start at once (a tokio runtime with 2 \
             worker threads); each runs {STORM_UNITS} units one after another: connect \
             (handshake and login only: `max_allowed_packet` and `wait_timeout` are given, \
             so the driver runs no query of its own), `SELECT 1`, disconnect. {attempted} \
             units in all; a unit that fails counts as not completed and the client goes on \
             with its next one; units still running {} s after the start are not completed \
             either. TPS is completed units per second over the run (until the last client \
             finished, or the deadline). Targets: the server directly, and \
             Fulcrum in front of it (transaction pooling, `pool_size = {POOL_SIZE}`). One \
             run per target.",
            STORM_DEADLINE.as_secs()
        ),
    );
    scenario.rows = vec![
        Row::new("MariaDB direct", primary.addr()),
        Row::new("Fulcrum", listen),
    ];
    let held = threads_connected(primary)?;
    let backlogs: Vec<String> = scenario
        .rows
        .iter()
        .map(|r| format!("{} {}", r.target, listen_backlog(&r.addr)))
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut results = Vec::new();
    for row in &mut scenario.rows {
        eprintln!(
            "  {STORM_CLIENTS} clients x {STORM_UNITS} units: {}",
            row.target
        );
        let storm = connection_storm(&runtime, port_of(&row.addr)?);
        fulcrum_alive(fulcrum)?;
        eprintln!("  {}: {}", row.target, storm.summary());
        row.samples.push(storm.sample());
        results.push(storm);
    }
    runtime.shutdown_timeout(Duration::from_secs(5));
    let fulcrum_storm = &results[1];
    scenario.goals.push(Goal {
        what: format!(
            "{STORM_CLIENTS} clients x {STORM_UNITS} connect / SELECT 1 / disconnect, \
             max_connections = {MAX_CONNECTIONS} (MariaDB): Fulcrum completes 100 %"
        ),
        measured: format!(
            "{} / {} ({:.1} %)",
            fulcrum_storm.done,
            fulcrum_storm.attempted,
            fulcrum_storm.percent()
        ),
        met: fulcrum_storm.done == fulcrum_storm.attempted,
    });
    for (row, storm) in scenario.rows.iter().zip(&results) {
        scenario
            .notes
            .push(format!("{}: {}", row.target, storm.summary()));
    }
    if fulcrum_storm.done < fulcrum_storm.attempted {
        scenario.notes.push(fulcrum_warnings(fulcrum));
    }
    scenario.notes.push(format!(
        "During the direct run Fulcrum's idle server connections and health checks were \
         connected to the same server too: {held} connections were open before it started \
         (`Threads_connected`), leaving the direct clients {} of the {MAX_CONNECTIONS} \
         slots. Direct clients beyond the limit are expected to fail with ERR 1040 \"Too \
         many connections\"; that is the point of the comparison, not a failure of the run.",
        (MAX_CONNECTIONS as u64).saturating_sub(held)
    ));
    scenario.notes.push(format!(
        "Listen queues (the listening socket's backlog, `ss` Send-Q): {}. When more \
         clients connect at once than a listener's queue holds and it is not drained fast \
         enough, the kernel drops handshakes (the listen queue overflows above). With SYN \
         cookies (`net.ipv4.tcp_syncookies` = {}), a connection whose last handshake \
         packet was dropped is open on the client's side only; a MySQL client then waits \
         for the server's greeting, which never comes (the server speaks first): those \
         are the clients still connecting at the deadline.",
        backlogs.join(", "),
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_syncookies")
            .map_or("unknown".into(), |v| v.trim().to_string())
    ));
    Ok(scenario)
}

/// The daemon's last warning and error lines, for a storm it did not finish.
fn fulcrum_warnings(fulcrum: &FulcrumProcess) -> String {
    let log = fulcrum.log_contents();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    let last: Vec<&str> = lines[lines.len().saturating_sub(5)..].to_vec();
    if last.is_empty() {
        return "Fulcrum's log has no warning or error.".into();
    }
    format!(
        "Fulcrum's log: {} warning or error lines; the last ones:\n\n```\n{}\n```",
        lines.len(),
        last.join("\n")
    )
}

/// `SHOW GLOBAL STATUS LIKE 'Threads_connected'` on `node`, not counting
/// the query's own connection.
fn threads_connected(node: &MariaNode) -> Result<u64> {
    let text = node.sql("SHOW GLOBAL STATUS LIKE 'Threads_connected'")?;
    text.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse::<u64>().ok())
        .map(|n| n.saturating_sub(1))
        .ok_or_else(|| format!("Threads_connected: unexpected answer {text:?}").into())
}

/// What one connection storm did.
struct Storm {
    done: u64,
    attempted: u64,
    /// Units that returned an error, by kind: (count, first error's text).
    errors: BTreeMap<String, (u64, String)>,
    /// From the start until every client finished or the deadline.
    elapsed: Duration,
    /// The kernel's `TcpExt` `ListenOverflows` and `ListenDrops` during the
    /// run (machine-wide): connection attempts a full listen queue dropped.
    listen_drops: (u64, u64),
    /// Clients connecting, in `SELECT 1` and disconnecting at the deadline;
    /// `None` when every client finished before it.
    stuck: Option<[u64; 3]>,
}

impl Storm {
    fn failed(&self) -> u64 {
        self.errors.values().map(|e| e.0).sum()
    }

    fn percent(&self) -> f64 {
        100.0 * self.done as f64 / self.attempted.max(1) as f64
    }

    fn sample(&self) -> Sample {
        Sample {
            tps: self.done as f64 / self.elapsed.as_secs_f64().max(1e-3),
            latency_ms: None,
            completed: Some((self.done, self.attempted)),
        }
    }

    /// One line: completed, failed by kind (with the first error's text),
    /// cut off at the deadline.
    fn summary(&self) -> String {
        let mut out = format!(
            "{} of {} units completed ({:.1} %) in {:.1} s",
            self.done,
            self.attempted,
            self.percent(),
            self.elapsed.as_secs_f64()
        );
        if self.errors.is_empty() {
            out.push_str(", no errors");
        }
        let (overflows, drops) = self.listen_drops;
        let _ = write!(
            out,
            "; listen queue overflows {overflows}, SYNs or ACKs dropped {drops} (kernel \
             counters, machine-wide)"
        );
        for (kind, (count, first)) in &self.errors {
            let _ = write!(out, "; {count} failed with {kind} (first: {first})");
        }
        let unfinished = self.attempted.saturating_sub(self.done + self.failed());
        if let Some([connecting, querying, closing]) = self.stuck {
            let _ = write!(
                out,
                "; {unfinished} not finished at the {} s deadline (clients then still \
                 connecting: {connecting}, in SELECT 1: {querying}, disconnecting: {closing})",
                STORM_DEADLINE.as_secs()
            );
        }
        out
    }
}

/// Errors of the storm's units, by kind.
type StormErrors = Arc<Mutex<BTreeMap<String, (u64, String)>>>;

/// Storm clients in each step of a unit right now.
#[derive(Default)]
struct InFlight {
    connecting: AtomicU64,
    querying: AtomicU64,
    closing: AtomicU64,
}

impl InFlight {
    fn now(&self) -> [u64; 3] {
        [&self.connecting, &self.querying, &self.closing].map(|n| n.load(Ordering::Relaxed))
    }
}

/// [`STORM_CLIENTS`] clients against `port` at once, each running
/// [`STORM_UNITS`] units, stopped at [`STORM_DEADLINE`].
fn connection_storm(runtime: &tokio::runtime::Runtime, port: u16) -> Storm {
    let done = Arc::new(AtomicU64::new(0));
    let errors: StormErrors = Arc::default();
    let in_flight = Arc::new(InFlight::default());
    let drops_before = listen_drops();
    let started = Instant::now();
    let stuck = runtime.block_on(async {
        let mut clients = tokio::task::JoinSet::new();
        for _ in 0..STORM_CLIENTS {
            let (done, errors, in_flight) = (done.clone(), errors.clone(), in_flight.clone());
            clients.spawn(storm_client(port, done, errors, in_flight));
        }
        let all = async { while clients.join_next().await.is_some() {} };
        let finished = tokio::time::timeout(STORM_DEADLINE, all).await.is_ok();
        let stuck = (!finished).then(|| in_flight.now());
        clients.abort_all();
        while clients.join_next().await.is_some() {}
        stuck
    });
    let elapsed = started.elapsed().min(STORM_DEADLINE);
    let drops_after = listen_drops();
    let listen_drops = (
        drops_after.0.saturating_sub(drops_before.0),
        drops_after.1.saturating_sub(drops_before.1),
    );
    let errors = std::mem::take(&mut *errors.lock().unwrap_or_else(|e| e.into_inner()));
    Storm {
        done: done.load(Ordering::Relaxed),
        attempted: STORM_CLIENTS * STORM_UNITS,
        errors,
        elapsed,
        listen_drops,
        stuck,
    }
}

/// The backlog of the socket listening on `addr` (`ss -ltnH`'s Send-Q),
/// or "unknown".
fn listen_backlog(addr: &str) -> String {
    let Ok(port) = port_of(addr) else {
        return "unknown".into();
    };
    let line = first_line("ss", &["-ltnH", &format!("sport = :{port}")]);
    line.split_whitespace()
        .nth(2)
        .filter(|n| n.parse::<u64>().is_ok())
        .unwrap_or("unknown")
        .to_string()
}

/// `TcpExt: ListenOverflows` and `ListenDrops` from /proc/net/netstat
/// (zeros if unreadable).
fn listen_drops() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return (0, 0);
    };
    let field = |name: &str| -> u64 {
        names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0)
    };
    (field("ListenOverflows"), field("ListenDrops"))
}

/// One storm client: [`STORM_UNITS`] units, counting each success in
/// `done` and each error in `errors`.
async fn storm_client(
    port: u16,
    done: Arc<AtomicU64>,
    errors: StormErrors,
    in_flight: Arc<InFlight>,
) {
    for _ in 0..STORM_UNITS {
        match storm_unit(port, &in_flight).await {
            Ok(()) => {
                done.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                let mut errors = errors.lock().unwrap_or_else(|e| e.into_inner());
                let entry = errors
                    .entry(error_kind(&e))
                    .or_insert_with(|| (0, e.to_string()));
                entry.0 += 1;
            }
        }
    }
}

/// Connect, `SELECT 1`, disconnect, each step counted in `in_flight`
/// while it runs.
async fn storm_unit(port: u16, in_flight: &InFlight) -> mysql_async::Result<()> {
    let opts = mysql_async::OptsBuilder::default()
        .ip_or_hostname("127.0.0.1")
        .tcp_port(port)
        .user(Some(APP_USER))
        .pass(Some(APP_PASSWORD))
        .db_name(Some(APP_DB))
        .prefer_socket(false)
        // Given, so the driver does not ask the server for them.
        .max_allowed_packet(Some(16 << 20))
        .wait_timeout(Some(28_800));
    let mut conn = step(&in_flight.connecting, mysql_async::Conn::new(opts)).await?;
    step(&in_flight.querying, conn.query_drop("SELECT 1")).await?;
    step(&in_flight.closing, conn.disconnect()).await
}

/// Awaits `f` with `count` one higher meanwhile (left higher if the task
/// is aborted inside it: the deadline's snapshot is taken before the abort).
async fn step<T>(count: &AtomicU64, f: impl std::future::Future<Output = T>) -> T {
    count.fetch_add(1, Ordering::Relaxed);
    let out = f.await;
    count.fetch_sub(1, Ordering::Relaxed);
    out
}

/// A short name for an error's kind: "ERR 1040", "I/O error", ...
fn error_kind(e: &mysql_async::Error) -> String {
    match e {
        mysql_async::Error::Server(s) => format!("ERR {}", s.code),
        mysql_async::Error::Io(_) => "an I/O error".into(),
        mysql_async::Error::Driver(_) => "a driver error".into(),
        _ => "another error".into(),
    }
}

// ---------------------------------------------------------------- shared --

/// One timed sysbench run of `workload` (a built-in test and its options,
/// or a script's path) at `threads` against `addr`, with `--histogram=on`:
/// `WARMUP_SECONDS` for a warm-up, `opts.seconds` otherwise. Fails on
/// everything [`sysbench`] rejects, on no transactions, on a
/// reconnect, on an ignored error (a deadlock) in a workload that does not
/// write, and on a missing histogram. Returns the sample and the number
/// of transactions (events).
fn sysbench_sample(
    opts: &Options,
    addr: &str,
    workload: &[&str],
    threads: u32,
    warm_up: bool,
) -> Result<(Sample, u64)> {
    let seconds = if warm_up {
        WARMUP_SECONDS
    } else {
        opts.seconds
    };
    let mut args: Vec<String> = workload.iter().map(|a| a.to_string()).collect();
    args.extend([
        format!("--threads={threads}"),
        format!("--time={seconds}"),
        "--events=0".to_string(),
        "--histogram=on".to_string(),
        "run".to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let timeout = Duration::from_secs(seconds) + RUN_GRACE;
    let stdout = sysbench(opts, port_of(addr)?, &args, timeout)?;
    let result = SysbenchResult::parse(&stdout)?;
    let writes = workload[0].starts_with("oltp_") && workload[0].contains("write");
    if result.transactions == 0 || result.reconnects > 0 || (!writes && result.ignored_errors > 0) {
        return Err(format!(
            "sysbench {}: {} transactions, {} ignored errors, {} reconnects\n{}",
            args.join(" "),
            result.transactions,
            result.ignored_errors,
            result.reconnects,
            tail(&stdout, 30)
        )
        .into());
    }
    let latency = report::sysbench_percentiles(&stdout)
        .ok_or_else(|| format!("sysbench {}: no latency histogram", args.join(" ")))?;
    let sample = Sample {
        tps: result.tps,
        latency_ms: Some(latency),
        completed: None,
    };
    Ok((sample, result.transactions))
}

/// One MariaDB `[[cluster]]` on `listen` in front of `backends` (the first
/// is the primary, the others replicas), reads spread over all of them
/// (`reads_on_primary = true`); `consistency` left at its default (session)
/// when `None`.
fn cluster_section(
    name: &str,
    listen: &str,
    consistency: Option<&str>,
    backends: &[String],
) -> String {
    let mut out = format!(
        "[[cluster]]\nname = \"{name}\"\nprotocol = \"mysql\"\nlisten = \"{listen}\"\n\
         pool_mode = \"transaction\"\npool_size = {POOL_SIZE}\n\
         health_user = \"root\"\nhealth_password = \"\"\nreads_on_primary = true\n"
    );
    if let Some(consistency) = consistency {
        let _ = writeln!(out, "consistency = \"{consistency}\"");
    }
    for (i, address) in backends.iter().enumerate() {
        let role = if i == 0 { "primary" } else { "replica" };
        let _ = write!(
            out,
            "\n[[cluster.backend]]\naddress = \"{address}\"\nrole = \"{role}\"\n"
        );
    }
    let _ = writeln!(
        out,
        "\n[[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\""
    );
    out
}

/// "Warm-up then N rounds x S s" for a setup text.
fn rounds_text(opts: &Options) -> String {
    format!(
        "A {} s warm-up run per target, then {} rounds x {} s, targets alternating.",
        WARMUP_SECONDS, opts.rounds, opts.seconds
    )
}

/// A free loopback address for a listener.
fn listen_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// The port of `host:port`.
fn port_of(addr: &str) -> Result<u16> {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .ok_or_else(|| format!("{addr}: no port").into())
}

/// Fails with the log's tail when the daemon has exited.
fn fulcrum_alive(fulcrum: &FulcrumProcess) -> Result<()> {
    match fulcrum.try_wait() {
        None => Ok(()),
        Some(status) => Err(format!(
            "fulcrum exited with {status}; log tail:\n{}",
            tail(&fulcrum.log_contents(), 30)
        )
        .into()),
    }
}

/// A file in the temp dir, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    /// `<tmp>/fulcrum-bench-<pid>-<name>` holding `text`.
    fn create(name: &str, text: &str) -> Result<TempFile> {
        let path =
            std::env::temp_dir().join(format!("fulcrum-bench-{}-{name}", std::process::id()));
        std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        Ok(TempFile(path))
    }

    fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
