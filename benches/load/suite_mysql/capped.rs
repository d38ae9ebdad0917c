//! The capped regime of the MariaDB suite: a primary and 2 GTID replicas,
//! each `mariadbd` in its own CPU-capped cgroup, one Fulcrum daemon with a
//! listener per node set; `my-scale-out` (with its TCP relay control row)
//! and the `my-s1-*` scenarios (published scenario 1).

use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster, MariaNode};

use super::counts::{counts_notes, cpu_ticks, status, Counts, NodeCounts};
use super::{
    cluster_section, listen_addr, record_version, rounds_text, sysbench_sample, POOL_SIZE,
};
use crate::cpu_caps::CpuCaps;
use crate::fulcrum::fulcrum_alive;
use crate::fulcrum::fulcrum_config;
use crate::measure::switches;
use crate::relay::{RelayKind, TcpRelay};
use crate::report::{self, Goal, Row, Scenario};
use crate::suite::SuiteReport;
use crate::sysbench::{sysbench, SYSBENCH_PREPARE_TIMEOUT, SYSBENCH_TABLES};
use crate::{Options, Result};

/// Capped regime: a primary and 2 replicas.
const CAPPED_NODES: usize = 3;
/// The capped servers' own settings. MariaDB's thread pool: with a thread per
/// connection, a capped server pays a sleep and a wake-up per request
/// whenever the client's next request arrives after the thread went back to
/// wait, so its CPU per request depends on the client's round trip. On
/// loopback a direct client is fast enough to spare it most of them and any
/// hop (HAProxy, socat, Fulcrum) is not: 17 against 22 µs of server CPU per
/// point select, the hop measured instead of the node. The pool's workers
/// take queued requests of any connection without sleeping, so the cost per
/// request is the same direct and through a relay (docs/benchmarks-history.md,
/// "A faithful capped regime for MariaDB"). And one thread group, as MariaDB
/// sizes `thread_pool_size` to the CPUs a server has: the cap gives each
/// server a tenth of one. With the default (one group per core of the
/// machine, 2 here) the servers' CPU per query grew as each was less
/// loaded: 13 µs direct against 16-17 µs at 2 and 3 nodes, 1.67x / 2.34x;
/// with one group it is flatter (13-14 direct, 13-16 through Fulcrum) and
/// three runs gave 2.12x / 2.98x, 1.88x / 2.83x, 1.76x / 2.51x, direct's
/// TPS unchanged (docs/benchmarks.md, "Pool size and the servers' CPU per
/// query"); four more on another machine 2.17-2.46x / 3.14-3.68x
/// ("Both targets in four runs back to back").
const CAPPED_SETTINGS: [(&str, &str); 2] = [
    ("thread_handling", "pool-of-threads"),
    ("thread_pool_size", "1"),
];
/// The capped servers' settings as the report names them: [`CAPPED_SETTINGS`],
/// then `--mysql-setting`'s, "`k=v`, ..." (a later one overrides an earlier).
fn capped_settings_text(opts: &Options) -> String {
    CAPPED_SETTINGS
        .iter()
        .copied()
        .chain(
            opts.mysql_settings
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str())),
        )
        .map(|(k, v)| format!("`{k}={v}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `my-scale-out`: the name of the control row (a plain TCP relay).
fn relay_target(kind: RelayKind) -> &'static str {
    match kind {
        RelayKind::Socat => "TCP relay (socat), 1 node",
        RelayKind::Haproxy => "TCP relay (HAProxy), 1 node",
    }
}
/// `my-scale-out`: sysbench `--threads`.
const SCALE_OUT_THREADS: u32 = 16;
/// `my-scale-out`: how long the idle cluster's `Questions` are counted.
const IDLE_SECONDS: u64 = 5;
/// `my-scale-out`: the least each node count must reach, as a ratio to direct.
const SCALE_OUT_GOALS: [(usize, f64); 2] = [(2, 1.88), (3, 2.70)];
/// `my-s1-*`: sysbench `--threads` (the published runs used 20-65 clients).
const S1_THREADS: u32 = 32;
/// `my-s1-write-only`: the least Fulcrum must reach, as a ratio to direct.
const S1_WRITE_GOAL: f64 = 0.97;

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

/// The capped regime: cgroups, a primary and 2 replicas with the sysbench
/// tables, one daemon; then `my-scale-out` and the `my-s1-*` scenarios.
pub(super) fn run(opts: &Options, report: &mut SuiteReport) -> Result<()> {
    // Declared first, so dropped last: the servers have stopped by then.
    let Some(caps) = crate::suite::caps(opts, CAPPED_NODES, report) else {
        eprintln!("MariaDB capped scenarios SKIPPED (see the report's record)");
        return Ok(());
    };
    let mut builder = MariaCluster::builder().replicas(CAPPED_NODES - 1);
    for (key, value) in CAPPED_SETTINGS {
        builder = builder.setting(key, value);
    }
    // After the defaults, so `--mysql-setting` overrides them.
    for (key, value) in &opts.mysql_settings {
        builder = builder.setting(key, value);
    }
    let cluster = builder.start()?;
    report.records.push(format!(
        "capped MariaDB servers: the harness's settings, then {}; the TCP relay control: {}",
        capped_settings_text(opts),
        opts.relay.name()
    ));
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
        let relay = match TcpRelay::start(opts.relay, free_port(), &cluster.primary().addr()) {
            Ok(relay) => Some(relay),
            Err(e) => {
                eprintln!("the TCP relay control is left out: {e}");
                None
            }
        };
        report.add(bench.scale_out(&scale_listens, relay.as_ref().map(|r| r.addr.as_str()))?);
        Ok(())
    });
    let s1 = if opts.skip.iter().any(|s| s == "my-s1") {
        &[][..]
    } else {
        &S1_WORKLOADS[..]
    };
    for workload in s1 {
        let what = format!("MariaDB scenario 1, {} ({})", workload.label, workload.id);
        report.attempt(&what, |report| {
            report.add(bench.scenario_1(workload, &s1_listen)?);
            Ok(())
        });
    }
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
                 balanced by the default `balance = \"least_connections\"`; the servers run \
                 with {settings}. {control}{rounds}",
                settings = capped_settings_text(opts),
                control = if relay.is_some() {
                    format!(
                        "The control `{}`: {}, so its loss against direct is what any \
                         extra hop costs this capped server. ",
                        relay_target(opts.relay),
                        opts.relay.describe()
                    )
                } else {
                    format!(
                        "The TCP relay control was left out: `{}` is not installed. ",
                        opts.relay.name()
                    )
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
                .push(Row::new(relay_target(opts.relay), relay.to_string()).with_nodes(1));
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
        scenario.notes.push(self.idle_note()?);
        Ok(scenario)
    }

    /// The note on what the cluster is sent with no client for
    /// [`IDLE_SECONDS`]: `Questions` per second on each node (the daemon's
    /// health probes, the counters' own reads), read after the runs.
    fn idle_note(&self) -> Result<String> {
        let nodes: Vec<&MariaNode> = self.cluster.nodes().collect();
        let before = self.node_counts(&nodes)?;
        std::thread::sleep(std::time::Duration::from_secs(IDLE_SECONDS));
        let after = self.node_counts(&nodes)?;
        let rates: Vec<f64> = before
            .iter()
            .zip(&after)
            .map(|(b, a)| a.questions.saturating_sub(b.questions) as f64 / IDLE_SECONDS as f64)
            .collect();
        let cells: Vec<String> = rates.iter().map(|r| format!("{r:.1}")).collect();
        Ok(format!(
            "With no client for {IDLE_SECONDS} s after the runs, `Questions` per second on \
             {} (Fulcrum's health probes of every listener's cluster, and the counters' \
             own reads: 2 statements per node in all): {}, {:.1} in all.",
            self.names.join(" / "),
            cells.join(" / "),
            rates.iter().sum::<f64>()
        ))
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
            .map(|r| Counts::new(r.target.clone(), nodes.len()))
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
                let status = status(node)?;
                Ok(NodeCounts {
                    selects: status.selects,
                    questions: status.questions,
                    throttling: self.caps.throttling(i),
                    cpu_ticks: node.pid().and_then(cpu_ticks).unwrap_or(0),
                    switches: node.pid().and_then(switches).unwrap_or_default(),
                })
            })
            .collect()
    }
}
