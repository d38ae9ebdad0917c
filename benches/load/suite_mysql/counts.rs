//! What the capped MariaDB scenarios count on each node around every
//! measured run (`Com_select`, `Questions`, the cgroup's throttling, the CPU
//! time and context switches of `mariadbd`), summed per target, and the notes
//! made of it.

use fulcrum_testkit::MariaNode;

use crate::cpu_caps::Throttling;
use crate::measure::Switches;
use crate::Result;

/// One node's counters: `Com_select`, `Questions`, its cgroup's CPU periods
/// and throttled periods (`cpu.stat`), and the CPU time its `mariadbd` used.
#[derive(Debug, Clone, Default)]
pub(super) struct NodeCounts {
    pub(super) selects: u64,
    /// `Questions`: every statement clients sent (queries, executed prepared
    /// statements, database changes, quits; not pings, prepares or closes),
    /// health probes and the counters' own reads (two per node per read: the
    /// `SHOW` and the client's quit) included.
    pub(super) questions: u64,
    pub(super) throttling: Throttling,
    /// User + system time of every thread, in clock ticks.
    pub(super) cpu_ticks: u64,
    /// Context switches of every thread (voluntary: a thread went to wait
    /// for work; involuntary: it was preempted or throttled).
    pub(super) switches: Switches,
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

/// `Com_select` and `Questions` of one node, read together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Status {
    pub(super) selects: u64,
    pub(super) questions: u64,
}

/// `Com_select` and `Questions` of `node` now, with one statement (which,
/// with the client's `COM_QUIT`, `Questions` counts).
pub(super) fn status(node: &MariaNode) -> Result<Status> {
    match node.global_status(&["Com_select", "Questions"])?[..] {
        [selects, questions] => Ok(Status { selects, questions }),
        _ => Err("Com_select, Questions: not two values".into()),
    }
}

/// What one target's measured runs did on each node.
pub(super) struct Counts {
    pub(super) target: String,
    /// sysbench transactions (events) over those runs.
    pub(super) transactions: u64,
    /// Increments over those runs, per node.
    pub(super) nodes: Vec<NodeCounts>,
    /// `Questions` per transaction of each run, all nodes summed.
    pub(super) questions_per_run: Vec<f64>,
}

impl Counts {
    /// No runs yet, on `nodes` nodes.
    pub(super) fn new(target: String, nodes: usize) -> Counts {
        Counts {
            target,
            transactions: 0,
            nodes: vec![NodeCounts::default(); nodes],
            questions_per_run: Vec::new(),
        }
    }

    /// Adds one run: its transactions and each node's increments.
    pub(super) fn add(&mut self, transactions: u64, before: &[NodeCounts], after: &[NodeCounts]) {
        self.transactions += transactions;
        let mut questions = 0;
        for (sum, (b, a)) in self.nodes.iter_mut().zip(before.iter().zip(after)) {
            sum.selects += a.selects.saturating_sub(b.selects);
            let q = a.questions.saturating_sub(b.questions);
            sum.questions += q;
            questions += q;
            sum.throttling.add(a.throttling.since(b.throttling));
            sum.cpu_ticks += a.cpu_ticks.saturating_sub(b.cpu_ticks);
            sum.switches.voluntary += a.switches.voluntary.saturating_sub(b.switches.voluntary);
            sum.switches.involuntary += a
                .switches
                .involuntary
                .saturating_sub(b.switches.involuntary);
        }
        self.questions_per_run
            .push(questions as f64 / transactions.max(1) as f64);
    }

    /// `Questions` per transaction over all runs, all nodes summed.
    fn questions_per_transaction(&self) -> f64 {
        let questions: u64 = self.nodes.iter().map(|n| n.questions).sum();
        questions as f64 / self.transactions.max(1) as f64
    }

    /// Server CPU (all nodes) per `Questions`, in µs.
    fn cpu_micros_per_question(&self) -> f64 {
        let ticks: u64 = self.nodes.iter().map(|n| n.cpu_ticks).sum();
        let questions: u64 = self.nodes.iter().map(|n| n.questions).sum();
        ticks as f64 / TICKS_PER_SECOND * 1e6 / questions.max(1) as f64
    }

    /// "1.23 + 0.04": the servers' (all nodes) voluntary and involuntary
    /// context switches per `Questions`.
    fn switches_per_question(&self) -> String {
        let questions = self.nodes.iter().map(|n| n.questions).sum::<u64>().max(1) as f64;
        let voluntary: u64 = self.nodes.iter().map(|n| n.switches.voluntary).sum();
        let involuntary: u64 = self.nodes.iter().map(|n| n.switches.involuntary).sum();
        format!(
            "{:.2} + {:.2}",
            voluntary as f64 / questions,
            involuntary as f64 / questions
        )
    }
}

/// The notes of a capped scenario: how often the cap throttled each node,
/// the server CPU each transaction cost, and where the SELECTs ran, per
/// target.
pub(super) fn counts_notes(names: &[String], counts: &[Counts]) -> [String; 5] {
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
        questions_note(names, counts),
        switches_note(counts),
    ]
}

/// The note on the servers' context switches per question, per target: how
/// often a server thread went to wait for work (voluntary) or was
/// preempted or throttled (involuntary) for each statement it ran. A server
/// whose requests arrive together serves several per wake-up and costs less
/// CPU per query.
fn switches_note(counts: &[Counts]) -> String {
    let targets: Vec<String> = counts
        .iter()
        .map(|c| format!("{} {}", c.target, c.switches_per_question()))
        .collect();
    format!(
        "Server context switches per question (every `mariadbd` thread, all nodes \
         summed; voluntary, a thread waiting for work, + involuntary, preempted or \
         throttled), during each target's measured runs: {}.",
        targets.join("; ")
    )
}

/// The note on `Questions`: per target, per transaction with all nodes
/// summed, against the first target's (direct), the spread over runs, and
/// the server CPU per question.
fn questions_note(names: &[String], counts: &[Counts]) -> String {
    let Some(direct) = counts.first() else {
        return String::new();
    };
    let reference = direct.questions_per_transaction();
    let targets: Vec<String> = counts
        .iter()
        .map(|c| {
            format!(
                "{} {}, {:.1} µs per question",
                c.target,
                questions_cell(
                    c.questions_per_transaction(),
                    reference,
                    &c.questions_per_run
                ),
                c.cpu_micros_per_question()
            )
        })
        .collect();
    format!(
        "`Questions` per sysbench transaction, {} summed (every statement the servers \
         were sent: the clients' through the target, Fulcrum's health probes throughout, \
         the counters' own reads), against {}'s, with its spread over rounds, and server \
         CPU per question, during each target's measured runs: {}.",
        names.join(" + "),
        direct.target,
        targets.join("; ")
    )
}

/// "1.0004 (+0.02 %; rounds 1.0003-1.0005)": `per_transaction` against
/// `reference`, and the least and greatest of `per_run`.
fn questions_cell(per_transaction: f64, reference: f64, per_run: &[f64]) -> String {
    let relative = (per_transaction / reference - 1.0) * 100.0;
    let least = per_run.iter().copied().fold(f64::INFINITY, f64::min);
    let most = per_run.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let spread = match per_run.len() {
        0 => String::new(),
        1 => "; 1 round".to_string(),
        n => format!("; {n} rounds {least:.4}-{most:.4}"),
    };
    format!("{per_transaction:.4} ({relative:+.2} %{spread})")
}
