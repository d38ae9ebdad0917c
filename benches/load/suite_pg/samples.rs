//! One measurement of the PostgreSQL suite: a pgbench or sysbench run against
//! one target, bounded, parsed into a `Sample`.

use super::*;

/// One timed pgbench run (`-T seconds`), failing on any failed transaction;
/// with `log`, latency percentiles from its per-transaction log.
pub(super) fn pgbench_sample(
    addr: &str,
    args: &[String],
    seconds: u64,
    log: bool,
) -> Result<Sample> {
    let mut all = args.to_vec();
    all.extend(["-T".to_string(), seconds.to_string()]);
    let dir = log
        .then(|| std::env::temp_dir().join(format!("fulcrum-suite-txlog-{}", std::process::id())));
    if let Some(d) = &dir {
        let _ = std::fs::remove_dir_all(d);
        std::fs::create_dir(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
        all.push("--log".into());
        all.push(format!("--log-prefix={}", d.join("tx").display()));
    }
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    let run = pgbench_bounded(addr, &refs, Duration::from_secs(seconds) + RUN_GRACE);
    let latency = match (&run, &dir) {
        (Ok(_), Some(d)) => Some(latency_percentiles(d)),
        _ => None,
    };
    if let Some(d) = &dir {
        let _ = std::fs::remove_dir_all(d);
    }
    let (stdout, stderr) = run?;
    let result = PgbenchResult::parse(&stdout, &stderr)?;
    if result.failed > 0 || result.transactions == 0 {
        return Err(format!(
            "pgbench: {} failed, {} successful transactions\n{}",
            result.failed,
            result.transactions,
            tail(&stdout, 10)
        )
        .into());
    }
    Ok(Sample {
        tps: result.tps,
        latency_ms: latency.transpose()?,
        completed: None,
    })
}

/// One pgbench run of `-t` transactions per client that may abort clients:
/// how many of `attempted` completed (`actually processed: X/Y`).
pub(super) fn pgbench_completion(addr: &str, args: &[String], attempted: u64) -> Result<Sample> {
    let cmd = pgbench_command(addr, args)?;
    let started = Instant::now();
    let (_status, stdout, stderr) = run_bounded(cmd, "pgbench", COMPLETION_DEADLINE)?;
    let elapsed = started.elapsed().as_secs_f64();
    let done = stdout
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("number of transactions actually processed:")
        })
        .and_then(|rest| rest.trim().split('/').next()?.trim().parse::<u64>().ok())
        .unwrap_or(0);
    if done == 0 && !stdout.contains("actually processed") {
        eprintln!(
            "  pgbench printed no summary: {}",
            stderr.lines().next().unwrap_or("")
        );
    }
    let tps = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("tps = "))
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(done as f64 / elapsed);
    Ok(Sample {
        tps,
        latency_ms: None,
        completed: Some((done, attempted)),
    })
}

/// `sysbench --db-driver=pgsql` against `addr` as the app user.
pub(super) fn sysbench_pg(
    opts: &Options,
    addr: &str,
    args: &[&str],
    timeout: Duration,
) -> Result<String> {
    let (host, port) = addr.rsplit_once(':').ok_or("address without port")?;
    let connection = [
        "--db-driver=pgsql".to_string(),
        format!("--pgsql-host={host}"),
        format!("--pgsql-port={port}"),
        format!("--pgsql-user={APP_USER}"),
        format!("--pgsql-password={APP_PASSWORD}"),
        format!("--pgsql-db={APP_DB}"),
    ];
    sysbench_with(&connection, opts, args, timeout)
}

/// sysbench's tables, created through the primary.
pub(super) fn prepare_sysbench(opts: &Options, cluster: &PgCluster) -> Result<()> {
    eprintln!("sysbench prepare (PostgreSQL) ...");
    sysbench_pg(
        opts,
        &cluster.primary().addr(),
        &["oltp_common", "prepare"],
        SYSBENCH_PREPARE_TIMEOUT,
    )?;
    Ok(())
}

/// One timed sysbench run, with latency percentiles from `--histogram`.
pub(super) fn sysbench_sample(
    opts: &Options,
    addr: &str,
    workload: &[&str],
    seconds: u64,
) -> Result<Sample> {
    let mut args: Vec<String> = workload.iter().map(|a| a.to_string()).collect();
    args.extend([
        format!("--threads={SYSBENCH_THREADS}"),
        format!("--time={seconds}"),
        "--events=0".into(),
        "--histogram=on".into(),
        "run".into(),
    ]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let stdout = sysbench_pg(opts, addr, &refs, Duration::from_secs(seconds) + RUN_GRACE)?;
    let result = SysbenchResult::parse(&stdout)?;
    if result.transactions == 0 || result.reconnects > 0 {
        return Err(format!(
            "sysbench: {} transactions, {} reconnects\n{}",
            result.transactions,
            result.reconnects,
            tail(&stdout, 20)
        )
        .into());
    }
    Ok(Sample {
        tps: result.tps,
        latency_ms: crate::report::sysbench_percentiles(&stdout),
        completed: None,
    })
}
