//! The real PostgreSQL clients, `psql` and `pgbench`, and the real MariaDB
//! client, `mariadb`, pointed at any TCP address (a test node or Fulcrum
//! itself). Includes the parser for pgbench's summary.

use std::process::{Command, Output};

use crate::error::{Result, TestkitError};
use crate::process::{self, client_command, maria_command};

/// What a pgbench run reports (PostgreSQL 15 format; see [`PgbenchResult::parse`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PgbenchResult {
    /// "number of transactions actually processed" (successful ones).
    pub transactions: u64,
    /// "number of failed transactions" (serialization/deadlock failures); 0 when
    /// the line is absent (pgbench before 15 does not print it).
    pub failed: u64,
    /// "tps = X (without initial connection time)".
    pub tps: f64,
    /// "latency average = X ms", when printed.
    pub latency_avg_ms: Option<f64>,
    pub stdout: String,
    pub stderr: String,
}

impl PgbenchResult {
    /// Reads pgbench's summary. In PostgreSQL 15 it looks like:
    ///
    /// ```text
    /// number of transactions actually processed: 50/50      (-t; just "36576" with -T)
    /// number of failed transactions: 0 (0.000%)
    /// latency average = 0.203 ms
    /// initial connection time = 3.268 ms
    /// tps = 4933.885929 (without initial connection time)
    /// ```
    pub fn parse(stdout: &str, stderr: &str) -> Result<PgbenchResult> {
        let parse_err = |reason: &str| TestkitError::Parse {
            what: "pgbench output".into(),
            reason: reason.into(),
            output: format!("{stdout}\n{stderr}"),
        };
        let after = |prefix: &str| {
            stdout
                .lines()
                .find_map(|l| l.trim().strip_prefix(prefix).map(str::trim))
        };
        let first_number = |s: &str| -> Option<f64> {
            let end = s
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(s.len());
            s[..end].parse().ok()
        };

        let transactions = after("number of transactions actually processed:")
            .ok_or_else(|| parse_err("no \"number of transactions actually processed\" line"))?;
        let transactions = first_number(transactions)
            .ok_or_else(|| parse_err("transaction count is not a number"))?
            as u64;
        let failed = match after("number of failed transactions:") {
            Some(s) => {
                first_number(s).ok_or_else(|| parse_err("failed count is not a number"))? as u64
            }
            None => 0,
        };
        // 15 prints one tps line; older versions printed two ("including/
        // excluding connections establishing"): prefer the one without.
        let tps_lines: Vec<&str> = stdout
            .lines()
            .filter_map(|l| l.trim().strip_prefix("tps = "))
            .collect();
        let tps = tps_lines
            .iter()
            .find(|l| l.contains("without initial connection") || l.contains("excluding"))
            .or(tps_lines.first())
            .and_then(|s| first_number(s))
            .ok_or_else(|| parse_err("no \"tps = \" line"))?;
        let latency_avg_ms = after("latency average =").and_then(first_number);
        Ok(PgbenchResult {
            transactions,
            failed,
            tps,
            latency_avg_ms,
            stdout: stdout.to_string(),
            stderr: stderr.to_string(),
        })
    }
}

/// Runs the real pgbench with `args` as given; `password` goes in `PGPASSWORD`.
/// Returns the raw output whatever the exit status (pgbench exits 2 when
/// clients aborted, still printing a summary).
pub fn pgbench(args: &[&str], password: Option<&str>) -> Result<Output> {
    let mut cmd = client(password, "pgbench");
    cmd.args(args);
    process::output(&mut cmd, None)
}

/// Runs a pgbench benchmark against `host_port` (`127.0.0.1:PORT`) and parses
/// its summary; fails if pgbench exits non-zero (e.g. a client aborted).
/// `args` are the benchmark options, e.g. `["-S", "-t", "50"]`.
pub fn run_pgbench(
    host_port: &str,
    user: &str,
    password: &str,
    db: &str,
    args: &[&str],
) -> Result<PgbenchResult> {
    let mut cmd = connect_args(client(Some(password), "pgbench"), host_port, user)?;
    // pgbench's -d is --debug: the database is its positional argument.
    cmd.args(args).arg(db);
    let out = process::run(
        &mut cmd,
        None,
        &format!("pgbench via {host_port} as {user}"),
    )?;
    PgbenchResult::parse(
        &String::from_utf8_lossy(&out.stdout),
        &String::from_utf8_lossy(&out.stderr),
    )
}

/// `pgbench -i -s <scale> -q` against `host_port`.
pub fn pgbench_init(
    host_port: &str,
    user: &str,
    password: &str,
    db: &str,
    scale: u32,
) -> Result<()> {
    let mut cmd = connect_args(client(Some(password), "pgbench"), host_port, user)?;
    cmd.args(["-i", "-q", "-s", &scale.to_string(), db]);
    process::run(
        &mut cmd,
        None,
        &format!("pgbench -i via {host_port} as {user}"),
    )
    .map(|_| ())
}

/// Runs `sql` with the real psql (`-X -At -v ON_ERROR_STOP=1`) against
/// `host_port`; returns stdout, trimmed.
pub fn run_psql(
    host_port: &str,
    user: &str,
    password: &str,
    db: &str,
    sql: &str,
) -> Result<String> {
    let mut cmd = connect_args(client(Some(password), "psql"), host_port, user)?;
    cmd.args(["-d", db, "-X", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql]);
    let out = process::run(&mut cmd, None, &format!("psql via {host_port} as {user}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Runs `sql` with the real MariaDB client over TCP against `host_port`, as
/// `mariadb -h HOST -P PORT -u USER -pPASSWORD DB --batch --skip-column-names
/// -e SQL` (plus `--no-defaults`, so no option file applies); returns stdout,
/// trimmed (tab between columns). A server error fails with its
/// `ERROR NNNN (SQLSTATE)` line, e.g. `ERROR 1290` for a write on a
/// read-only replica.
pub fn run_mariadb(
    host_port: &str,
    user: &str,
    password: &str,
    db: &str,
    sql: &str,
) -> Result<String> {
    let (host, port) = split_host_port(host_port)?;
    let mut cmd = maria_command("mariadb");
    cmd.args(["--protocol=TCP", "-h", host, "-P", port, "-u", user])
        .arg(format!("-p{password}"))
        .args(["--batch", "--skip-column-names", "--connect-timeout=10"])
        .args([db, "-e", sql]);
    let out = process::run(
        &mut cmd,
        None,
        &format!("mariadb via {host_port} as {user}"),
    )?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// [`run_mariadb`] over the Unix socket at `socket` (`mariadb
/// --protocol=SOCKET -S PATH`).
pub fn run_mariadb_socket(
    socket: &std::path::Path,
    user: &str,
    password: &str,
    db: &str,
    sql: &str,
) -> Result<String> {
    let mut cmd = maria_command("mariadb");
    cmd.args(["--protocol=SOCKET", "-S"])
        .arg(socket)
        .args(["-u", user])
        .arg(format!("-p{password}"))
        .args(["--batch", "--skip-column-names", "--connect-timeout=10"])
        .args([db, "-e", sql]);
    let what = format!("mariadb via {} as {user}", socket.display());
    let out = process::run(&mut cmd, None, &what)?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn client(password: Option<&str>, name: &str) -> Command {
    let mut cmd = client_command(name);
    // A wedged proxy should fail a test, not hang it.
    cmd.env("PGCONNECT_TIMEOUT", "10");
    if let Some(password) = password {
        cmd.env("PGPASSWORD", password);
    }
    cmd
}

/// `-h HOST -p PORT -U USER` (the database is passed differently by psql and pgbench).
fn connect_args(mut cmd: Command, host_port: &str, user: &str) -> Result<Command> {
    let (host, port) = split_host_port(host_port)?;
    cmd.args(["-h", host, "-p", port, "-U", user]);
    Ok(cmd)
}

/// `("127.0.0.1", "5433")` from `127.0.0.1:5433` (brackets around IPv6 removed).
fn split_host_port(host_port: &str) -> Result<(&str, &str)> {
    let (host, port) = host_port
        .rsplit_once(':')
        .filter(|(_, p)| p.parse::<u16>().is_ok())
        .ok_or_else(|| TestkitError::Invalid(format!("{host_port:?} is not HOST:PORT")))?;
    Ok((host.trim_start_matches('[').trim_end_matches(']'), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PG15_T: &str = "pgbench (15.20 (Debian 15.20-0+deb12u1))
transaction type: <builtin: select only>
scaling factor: 1
query mode: simple
number of clients: 1
number of threads: 1
maximum number of tries: 1
number of transactions per client: 50
number of transactions actually processed: 50/50
number of failed transactions: 0 (0.000%)
latency average = 0.203 ms
initial connection time = 3.268 ms
tps = 4933.885929 (without initial connection time)
";

    const PG15_DURATION: &str = "duration: 2 s
number of transactions actually processed: 36576
number of failed transactions: 3 (0.008%)
latency average = 0.109 ms
initial connection time = 6.158 ms
tps = 18333.632411 (without initial connection time)
";

    const PG13: &str = "number of transactions actually processed: 1000/1000
latency average = 1.001 ms
tps = 998.1 (including connections establishing)
tps = 1010.5 (excluding connections establishing)
";

    #[test]
    fn pgbench_15_fixed_transaction_run_is_parsed() {
        let r = PgbenchResult::parse(PG15_T, "").unwrap();
        assert_eq!((r.transactions, r.failed), (50, 0));
        assert!((r.tps - 4933.885929).abs() < 1e-6);
        assert_eq!(r.latency_avg_ms, Some(0.203));
    }

    #[test]
    fn pgbench_15_duration_run_is_parsed() {
        let r = PgbenchResult::parse(PG15_DURATION, "").unwrap();
        assert_eq!((r.transactions, r.failed), (36576, 3));
        assert!((r.tps - 18333.632411).abs() < 1e-6);
    }

    #[test]
    fn older_pgbench_without_failed_line_prefers_excluding_tps() {
        let r = PgbenchResult::parse(PG13, "").unwrap();
        assert_eq!((r.transactions, r.failed), (1000, 0));
        assert!((r.tps - 1010.5).abs() < 1e-9);
    }

    #[test]
    fn output_without_summary_is_a_parse_error() {
        let err = PgbenchResult::parse("", "pgbench: error: connection refused").unwrap_err();
        assert!(err.to_string().contains("connection refused"), "{err}");
    }

    #[test]
    fn host_port_must_have_a_port() {
        assert!(connect_args(Command::new("x"), "127.0.0.1", "u").is_err());
        assert!(connect_args(Command::new("x"), "127.0.0.1:5", "u").is_ok());
    }
}
