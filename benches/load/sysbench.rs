//! sysbench: its workloads and summary ([`SysbenchWorkload`],
//! [`SysbenchResult`]), bounded runs with their failures checked, and
//! MariaDB's `Com_select` counter that the runs are judged by.

use std::process::Command;
use std::time::Duration;

use fulcrum_testkit::{MariaCluster, MariaNode, APP_DB, APP_PASSWORD, APP_USER};

use crate::process::{run_bounded, tail};
use crate::{Options, Result, RUN_GRACE};

/// `--mysql-consistency-cost`: sysbench's `--tables`.
pub(crate) const SYSBENCH_TABLES: u32 = 2;
/// Deadline for `sysbench prepare` and `cleanup`, and for the replicas to
/// apply the prepared tables.
pub(crate) const SYSBENCH_PREPARE_TIMEOUT: Duration = Duration::from_secs(120);

/// A sysbench workload of `--mysql-consistency-cost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SysbenchWorkload {
    /// `oltp_read_write`: BEGIN, 10 point selects, 4 range selects, 2
    /// UPDATEs, a DELETE and an INSERT, COMMIT. Everything runs on the
    /// primary (a transaction opened with BEGIN may write).
    ReadWrite,
    /// `oltp_read_only --skip-trx=on`: the same 14 selects, autocommit, so
    /// Fulcrum may send them to a replica.
    ReadOnly,
    /// `oltp_read_write --skip-trx=on`: the 14 selects and 4 writes of
    /// `oltp_read_write`, each autocommit: every thread (one user) writes
    /// beside its reads, what `consistency = "user"` costs.
    Mixed,
    /// `oltp_point_select`: one primary-key select per transaction,
    /// autocommit (`--mysql-cache`; not in [`SysbenchWorkload::ALL`]).
    PointSelect,
}

impl SysbenchWorkload {
    pub(crate) const ALL: [SysbenchWorkload; 3] = [
        SysbenchWorkload::ReadWrite,
        SysbenchWorkload::ReadOnly,
        SysbenchWorkload::Mixed,
    ];

    fn args(self) -> &'static [&'static str] {
        match self {
            SysbenchWorkload::ReadWrite => &["oltp_read_write"],
            SysbenchWorkload::ReadOnly => &["oltp_read_only", "--skip-trx=on"],
            // Autocommit, a thread's DELETE and INSERT of a row race
            // another's (1062, as directly): retried like deadlocks.
            SysbenchWorkload::Mixed => &[
                "oltp_read_write",
                "--skip-trx=on",
                "--mysql-ignore-errors=1213,1062",
            ],
            SysbenchWorkload::PointSelect => &["oltp_point_select"],
        }
    }

    pub(crate) fn title(self) -> &'static str {
        match self {
            SysbenchWorkload::ReadWrite => "sysbench oltp_read_write",
            SysbenchWorkload::ReadOnly => "sysbench oltp_read_only --skip-trx=on",
            SysbenchWorkload::Mixed => {
                "sysbench oltp_read_write --skip-trx=on (autocommit writes beside reads)"
            }
            SysbenchWorkload::PointSelect => "sysbench oltp_point_select",
        }
    }
}

/// What a `sysbench ... run` reported.
#[derive(Debug)]
pub(crate) struct SysbenchResult {
    pub(crate) transactions: u64,
    pub(crate) tps: f64,
    pub(crate) latency_avg_ms: f64,
    pub(crate) ignored_errors: u64,
    pub(crate) reconnects: u64,
}

impl SysbenchResult {
    /// Fails, with the command and the tail of its output, unless the run
    /// did some work, never reconnected, and had no ignored errors (unless
    /// `errors_allowed`: deadlocks retried by write workloads).
    pub(crate) fn ensure_clean(
        &self,
        args: &[&str],
        stdout: &str,
        errors_allowed: bool,
    ) -> Result<()> {
        if self.transactions == 0
            || self.reconnects > 0
            || (!errors_allowed && self.ignored_errors > 0)
        {
            return Err(format!(
                "sysbench {}: {} transactions, {} ignored errors, {} reconnects\n{}",
                args.join(" "),
                self.transactions,
                self.ignored_errors,
                self.reconnects,
                tail(stdout, 30)
            )
            .into());
        }
        Ok(())
    }

    /// Parses sysbench 1.0's summary ("transactions: N (X per sec.)", ...).
    pub(crate) fn parse(stdout: &str) -> Result<SysbenchResult> {
        let line = |label: &str| -> Result<&str> {
            stdout
                .lines()
                .map(str::trim_start)
                .find_map(|l| l.strip_prefix(label))
                .map(str::trim)
                .ok_or_else(|| format!("no `{label}` line in sysbench's output").into())
        };
        let count = |label: &str| -> Result<u64> {
            let rest = line(label)?;
            rest.split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| format!("sysbench `{label} {rest}`: no count").into())
        };
        let transactions = line("transactions:")?;
        let tps = transactions
            .split_once('(')
            .and_then(|(_, r)| r.split_whitespace().next()?.parse().ok())
            .ok_or_else(|| format!("sysbench `transactions: {transactions}`: no rate"))?;
        let latency_avg_ms = line("avg:")?
            .parse()
            .map_err(|e| format!("sysbench latency avg: {e}"))?;
        Ok(SysbenchResult {
            transactions: count("transactions:")?,
            tps,
            latency_avg_ms,
            ignored_errors: count("ignored errors:")?,
            reconnects: count("reconnects:")?,
        })
    }
}

/// Runs sysbench against `port` as `app` with the bench's tables:
/// `sysbench --db-driver=mysql ... <args>`; returns its stdout. A non-zero
/// exit, a FATAL or ALERT line, or a run past `timeout` is an error.
pub(crate) fn sysbench(
    opts: &Options,
    port: u16,
    args: &[&str],
    timeout: Duration,
) -> Result<String> {
    let connection = [
        "--db-driver=mysql".to_string(),
        "--mysql-host=127.0.0.1".to_string(),
        format!("--mysql-port={port}"),
        format!("--mysql-user={APP_USER}"),
        format!("--mysql-password={APP_PASSWORD}"),
        format!("--mysql-db={APP_DB}"),
        // Only deadlocks are retried; any other error fails the run.
        "--mysql-ignore-errors=1213".to_string(),
    ];
    sysbench_with(&connection, opts, args, timeout)
}

/// Runs sysbench with the driver options in `connection` and the bench's
/// tables and prepared-statement mode, then `args`; returns its stdout. A
/// non-zero exit, a FATAL or ALERT line, or a run past `timeout` is an error.
pub(crate) fn sysbench_with(
    connection: &[String],
    opts: &Options,
    args: &[&str],
    timeout: Duration,
) -> Result<String> {
    let mut cmd = Command::new("sysbench");
    cmd.args(connection)
        .args([
            format!("--db-ps-mode={}", opts.ps_mode),
            format!("--tables={SYSBENCH_TABLES}"),
            format!("--table-size={}", opts.table_size),
        ])
        .args(args)
        .env("LC_ALL", "C");
    let (status, stdout, stderr) = run_bounded(cmd, "sysbench", timeout)?;
    let fatal = stdout
        .lines()
        .chain(stderr.lines())
        .any(|l| l.contains("FATAL") || l.contains("ALERT"));
    if !status.success() || fatal {
        return Err(format!(
            "`sysbench {}` exited with {status}\n--- stdout (tail) ---\n{}\n\
             --- stderr (head) ---\n{}",
            args.join(" "),
            tail(&stdout, 30),
            stderr.lines().take(20).collect::<Vec<_>>().join("\n")
        )
        .into());
    }
    Ok(stdout)
}

/// One timed `sysbench <workload> run` of `seconds` against `port`.
/// Fails on everything [`sysbench`] rejects, on a reconnect, on no
/// transactions, and on an ignored error in a workload that does not write
/// (only writers can deadlock).
pub(crate) fn sysbench_run(
    opts: &Options,
    port: u16,
    workload: SysbenchWorkload,
    seconds: u64,
) -> Result<SysbenchResult> {
    let mut args: Vec<String> = workload.args().iter().map(|a| a.to_string()).collect();
    args.extend([
        format!("--threads={}", opts.clients),
        format!("--time={seconds}"),
        "--events=0".to_string(),
        "run".to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let stdout = sysbench(opts, port, &args, Duration::from_secs(seconds) + RUN_GRACE)?;
    let result = SysbenchResult::parse(&stdout)?;
    let writes = matches!(
        workload,
        SysbenchWorkload::ReadWrite | SysbenchWorkload::Mixed
    );
    result.ensure_clean(&args, &stdout, writes)?;
    Ok(result)
}

/// `SHOW GLOBAL STATUS LIKE 'Com_select'` on `node`.
pub(crate) fn com_select(node: &MariaNode) -> Result<u64> {
    let text = node.sql("SHOW GLOBAL STATUS LIKE 'Com_select'")?;
    text.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("Com_select: unexpected answer {text:?}").into())
}

/// `Com_select` so far: (primary, all replicas).
pub(crate) fn com_selects(cluster: &MariaCluster) -> Result<(u64, u64)> {
    let primary = com_select(cluster.primary())?;
    let mut replicas = 0;
    for replica in cluster.replicas() {
        replicas += com_select(replica)?;
    }
    Ok((primary, replicas))
}
