//! What the capped MariaDB scenarios count on each node around every
//! measured run (`Com_select`, the cgroup's throttling, the CPU time of
//! `mariadbd`), summed per target, and the notes made of it.

use crate::cpu_caps::Throttling;

/// One node's counters: `Com_select`, its cgroup's CPU periods and
/// throttled periods (`cpu.stat`), and the CPU time its `mariadbd` used.
#[derive(Debug, Clone, Default)]
pub(super) struct NodeCounts {
    pub(super) selects: u64,
    pub(super) throttling: Throttling,
    /// User + system time of every thread, in clock ticks.
    pub(super) cpu_ticks: u64,
}

/// Clock ticks per second of `/proc/<pid>/stat` times (`USER_HZ`, 100 on
/// every Linux architecture Debian ships).
const TICKS_PER_SECOND: f64 = 100.0;

/// User + system CPU time of process `pid` (all its threads), in clock ticks:
/// fields 14 and 15 of `/proc/<pid>/stat`, counted after the parenthesised
/// command name (which may hold spaces).
pub(super) fn cpu_ticks(pid: u32) -> Option<u64> {
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
pub(super) struct Counts {
    pub(super) target: String,
    /// sysbench transactions (events) over those runs.
    pub(super) transactions: u64,
    /// Increments over those runs, per node.
    pub(super) nodes: Vec<NodeCounts>,
}

impl Counts {
    /// Adds one run: its transactions and each node's increments.
    pub(super) fn add(&mut self, transactions: u64, before: &[NodeCounts], after: &[NodeCounts]) {
        self.transactions += transactions;
        for (sum, (b, a)) in self.nodes.iter_mut().zip(before.iter().zip(after)) {
            sum.selects += a.selects.saturating_sub(b.selects);
            sum.throttling.add(a.throttling.since(b.throttling));
            sum.cpu_ticks += a.cpu_ticks.saturating_sub(b.cpu_ticks);
        }
    }
}

/// The notes of a capped scenario: how often the cap throttled each node,
/// the server CPU each transaction cost, and where the SELECTs ran, per
/// target.
pub(super) fn counts_notes(names: &[String], counts: &[Counts]) -> [String; 3] {
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
        if n.throttling.periods == 0 {
            "idle".to_string()
        } else {
            n.throttling.percent()
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
