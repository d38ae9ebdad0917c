//! `my-connections` (published scenario 4): a storm of 2,000 mysql_async
//! clients, each connecting, running `SELECT 1` and disconnecting 5 times,
//! against a server with fewer `max_connections`, directly and through
//! Fulcrum.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fulcrum_testkit::{FulcrumProcess, MariaNode, APP_DB, APP_PASSWORD, APP_USER};
use mysql_async::prelude::Queryable;

use super::{port_of, MAX_CONNECTIONS, POOL_SIZE};
use crate::fulcrum::fulcrum_alive;
use crate::process::first_line;
use crate::report::{Goal, Row, Sample, Scenario};
use crate::Result;

/// `my-connections`: clients started at once, and the units (connect,
/// `SELECT 1`, disconnect) each runs one after another.
const STORM_CLIENTS: u64 = 2_000;
const STORM_UNITS: u64 = 5;
/// `my-connections`: units still running after this are counted as not done.
const STORM_DEADLINE: Duration = Duration::from_secs(60);

/// `my-connections`: the connection storm directly, then through Fulcrum.
pub(super) fn connections(
    primary: &MariaNode,
    listen: &str,
    fulcrum: &FulcrumProcess,
) -> Result<Scenario> {
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
