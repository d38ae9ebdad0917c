//! pgbench: the scripts it runs ([`Workload`]), starting the PostgreSQL
//! cluster and `pgbench -i` on it, one bounded run with its failures
//! checked ([`bench_run`], [`pgbench_bounded`]), and latency percentiles
//! from its per-transaction logs.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use fulcrum_testkit::{pg_bin, PgCluster, PgbenchResult, APP_DB, APP_PASSWORD, APP_USER};

use crate::process::{run_bounded, tail};
use crate::{Options, Result, RUN_GRACE};

/// `--workload write-read`: an autocommit write, then a read of the same row.
pub(crate) const WRITE_READ_SCRIPT: &str = "\\set aid random(1, 100000 * :scale)
\\set delta random(-5000, 5000)
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
";

/// `--cache`: one point read of the first 1,000 accounts (the result
/// cache's must-show workload, issue 46).
pub(crate) const POINT_READ_SCRIPT: &str = "\\set aid random(1, 1000)
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
";

/// A pgbench script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Workload {
    /// `-S`: the built-in select-only script.
    Select,
    /// No script option: the built-in TPC-B-like script (one transaction of
    /// three updates, a select and an insert).
    TpcB,
    /// [`WRITE_READ_SCRIPT`]: two autocommit statements.
    WriteRead,
    /// Every client draws each transaction: TPC-B one time in ten, `-S`
    /// nine times (`-b tpcb-like@1 -b select-only@9`), all as one user:
    /// writers beside readers, what read-your-writes across an
    /// application's connections (`consistency = "user"`) costs.
    Mixed,
    /// [`POINT_READ_SCRIPT`] (`--cache`): `aid` random in 1..1000.
    PointRead,
}

impl Workload {
    pub(crate) fn parse(name: &str) -> Option<Workload> {
        match name {
            "select" => Some(Workload::Select),
            "tpcb" => Some(Workload::TpcB),
            "write-read" => Some(Workload::WriteRead),
            "mixed" => Some(Workload::Mixed),
            _ => None,
        }
    }

    /// How the report's heading names it.
    pub(crate) fn title(self) -> &'static str {
        match self {
            Workload::Select => "pgbench -S",
            Workload::TpcB => "pgbench TPC-B (default script)",
            Workload::WriteRead => "pgbench -f write-read (UPDATE, then SELECT, autocommit)",
            Workload::Mixed => {
                "pgbench TPC-B 1 in 10, -S 9 in 10 (-b tpcb-like@1 -b select-only@9)"
            }
            Workload::PointRead => {
                "pgbench -f point-read (SELECT abalance FROM pgbench_accounts WHERE aid = :aid, \
                 aid random in 1..1000)"
            }
        }
    }

    /// pgbench's script options; `script` is where [`WRITE_READ_SCRIPT`]
    /// (or [`POINT_READ_SCRIPT`]) is.
    fn args(self, script: &Path) -> Vec<String> {
        match self {
            Workload::Select => vec!["-S".into()],
            Workload::TpcB => Vec::new(),
            Workload::WriteRead | Workload::PointRead => {
                vec!["-f".into(), script.display().to_string()]
            }
            Workload::Mixed => ["-b", "tpcb-like@1", "-b", "select-only@9"]
                .map(String::from)
                .to_vec(),
        }
    }
}

/// Deadline for `pgbench -i`, per unit of scale (100,000 accounts) and fixed.
const INIT_SECONDS_PER_SCALE: u64 = 10;
const INIT_SECONDS_FIXED: u64 = 60;

/// The deadline of `pgbench -i -s <scale>`: fixed time plus time per unit of
/// scale.
pub(crate) fn init_timeout(opts: &Options) -> Duration {
    Duration::from_secs(INIT_SECONDS_FIXED + INIT_SECONDS_PER_SCALE * u64::from(opts.scale))
}

/// Starts the PostgreSQL cluster (a primary and `opts.replicas` streaming
/// replicas) and runs `pgbench -i` on the primary.
pub(crate) fn start_cluster(opts: &Options, init_timeout: Duration) -> Result<PgCluster> {
    start_cluster_tls(opts, init_timeout, None)
}

/// pgbench connects with `sslmode=require` (`--tls`).
pub(crate) static TLS_CLIENTS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// As [`start_cluster`], with `ssl = on` and `tls`' certificate when given.
pub(crate) fn start_cluster_tls(
    opts: &Options,
    init_timeout: Duration,
    tls: Option<&fulcrum_testkit::TestCerts>,
) -> Result<PgCluster> {
    // Keep the data set in shared buffers: a scale-10 pgbench database is
    // ~160 MB, five times the harness's 32 MB default, and a select-only run
    // spilling to the OS cache would mostly measure the server.
    let shared_buffers = format!("{}MB", 64 + 16 * opts.scale);
    let mut builder = PgCluster::builder()
        .replicas(opts.replicas)
        .setting("shared_buffers", &shared_buffers);
    if let Some(certs) = tls {
        builder = builder.tls(certs, false);
    }
    let cluster = builder.start()?;
    let direct = cluster.primary().addr();
    eprintln!("PostgreSQL primary on {direct} (shared_buffers {shared_buffers})");
    for replica in cluster.replicas() {
        eprintln!("PostgreSQL streaming replica on {}", replica.addr());
    }

    eprintln!("pgbench -i -s {} (directly) ...", opts.scale);
    let init_args = ["-i", "-q", "-s", &opts.scale.to_string()];
    pgbench_bounded(&direct, &init_args, init_timeout)
        .map_err(|e| format!("pgbench -i -s {}: {e}", opts.scale))?;
    if opts.replicas > 0 {
        cluster.wait_replicas_caught_up(init_timeout)?;
    }
    Ok(cluster)
}

/// `<workload> -M <protocol> -c <clients> -j <jobs> -T <seconds>`.
fn bench_args(opts: &Options, workload: Workload, script: &Path, seconds: u64) -> Vec<String> {
    let mut args = workload.args(script);
    args.extend(["-M".to_string(), opts.protocol.clone()]);
    for (flag, value) in [
        ("-c", u64::from(opts.clients)),
        ("-j", u64::from(opts.jobs)),
        ("-T", seconds),
    ] {
        args.push(flag.into());
        args.push(value.to_string());
    }
    args
}

/// The workload for `seconds` against `addr`, failing on any failed
/// transaction as well as on everything [`pgbench_bounded`] rejects. With
/// `log_dir`, pgbench writes its per-transaction logs there (emptied first).
pub(crate) fn bench_run(
    addr: &str,
    opts: &Options,
    workload: Workload,
    script: &Path,
    seconds: u64,
    log_dir: Option<&Path>,
) -> Result<PgbenchResult> {
    let mut args = bench_args(opts, workload, script, seconds);
    if let Some(dir) = log_dir {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        args.push("--log".into());
        args.push(format!("--log-prefix={}", dir.join("tx").display()));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let timeout = Duration::from_secs(seconds) + RUN_GRACE;
    let (stdout, stderr) = pgbench_bounded(addr, &args, timeout)?;
    let result = PgbenchResult::parse(&stdout, &stderr)?;
    if result.failed > 0 || result.transactions == 0 {
        return Err(format!(
            "pgbench reported {} failed and {} successful transactions\n{}",
            result.failed,
            result.transactions,
            outputs(&stdout, &stderr)
        )
        .into());
    }
    Ok(result)
}

/// pgbench as `app` against `addr` (`127.0.0.1:PORT`) with `args`, on the
/// app database, with the libpq variables that would redirect or alter the
/// connection removed.
pub(crate) fn pgbench_command<S: AsRef<std::ffi::OsStr>>(
    addr: &str,
    args: &[S],
) -> Result<Command> {
    let (host, port) = addr.rsplit_once(':').ok_or("address without port")?;
    let mut cmd = Command::new(pg_bin("pgbench"));
    for var in [
        "PGHOST",
        "PGHOSTADDR",
        "PGPORT",
        "PGDATABASE",
        "PGUSER",
        "PGSERVICE",
        "PGOPTIONS",
    ] {
        cmd.env_remove(var);
    }
    if TLS_CLIENTS.load(std::sync::atomic::Ordering::Relaxed) {
        cmd.env("PGSSLMODE", "require");
    }
    cmd.env("PGPASSWORD", APP_PASSWORD)
        .env("PGCONNECT_TIMEOUT", "10")
        .env("LC_MESSAGES", "C")
        .args(["-h", host, "-p", port, "-U", APP_USER])
        .args(args)
        .arg(APP_DB);
    Ok(cmd)
}

/// Runs pgbench as `app` against `addr` (`127.0.0.1:PORT`), killing it after
/// `timeout`; returns (stdout, stderr). A non-zero exit (aborted clients) or
/// an error line on stderr is an error.
pub(crate) fn pgbench_bounded(
    addr: &str,
    args: &[&str],
    timeout: Duration,
) -> Result<(String, String)> {
    let cmd = pgbench_command(addr, args)?;
    let (status, stdout, stderr) = run_bounded(cmd, "pgbench", timeout)?;
    let errors = stderr
        .lines()
        .any(|l| l.to_ascii_lowercase().contains("error"));
    if !status.success() || errors {
        return Err(format!(
            "`pgbench {}` exited with {status}\n{}",
            args.join(" "),
            outputs(&stdout, &stderr)
        )
        .into());
    }
    Ok((stdout, stderr))
}

fn outputs(stdout: &str, stderr: &str) -> String {
    format!(
        "--- pgbench stdout (tail) ---\n{}\n--- pgbench stderr (head) ---\n{}",
        tail(stdout, 20),
        stderr.lines().take(10).collect::<Vec<_>>().join("\n")
    )
}

/// p50, p95 and p99 (nearest rank, ms) of the per-transaction latencies in
/// the pgbench logs in `dir` (`client txn latency_us script epoch us`).
pub(crate) fn latency_percentiles(dir: &Path) -> Result<[f64; 3]> {
    let mut micros: Vec<u64> = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let text = std::fs::read_to_string(entry?.path())?;
        micros.extend(
            text.lines()
                .filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok()),
        );
    }
    if micros.is_empty() {
        return Err(format!("no transactions in the pgbench logs in {}", dir.display()).into());
    }
    micros.sort_unstable();
    let rank = |p: f64| -> f64 {
        let i = ((p * micros.len() as f64).ceil() as usize).clamp(1, micros.len()) - 1;
        micros[i] as f64 / 1000.0
    };
    Ok([rank(0.50), rank(0.95), rank(0.99)])
}
