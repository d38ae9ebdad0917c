//! The PostgreSQL suite's client-count scenarios: more clients than
//! `max_connections` (`-C -M extended`), and the memory each idle client costs.

use super::*;

/// Scenario 4: `clients` pgbench clients, each connecting anew for every
/// transaction (`-C -M extended`, `SELECT 1`), against a server allowing
/// `max_connections`: how many transactions complete, directly and pooled.
pub(super) fn connections(
    opts: &Options,
    clients: u32,
    max_connections: u32,
    report: &mut SuiteReport,
) -> Result<()> {
    let cluster = PgCluster::builder()
        .max_connections(max_connections)
        .start()?;
    // Pgpool-II opens one server connection per child: stay under the limit.
    let children = (max_connections - 10).min(90);
    let proxies = Proxies::start(opts, &cluster, clients + 100, children)?;
    let script = std::env::temp_dir().join(format!("fulcrum-suite-c-{}.sql", std::process::id()));
    std::fs::write(&script, "SELECT 1;\n")?;
    let per_client = 5u64;
    let args: Vec<String> = vec![
        format!("-f{}", script.display()),
        "-C".into(),
        "-M".into(),
        "extended".into(),
        "-c".into(),
        clients.to_string(),
        "-j".into(),
        "2".into(),
        "-t".into(),
        per_client.to_string(),
    ];
    let mut scenario = Scenario::new(
        &format!("pg-connections-{clients}"),
        format!(
            "{clients} clients against max_connections {max_connections}, `pgbench -C -M \
             extended` (PostgreSQL)"
        ),
        format!(
            "`pgbench -C -M extended -c {clients} -j 2 -t {per_client}` running `SELECT 1` \
             (a new connection for every transaction), against a server with \
             `max_connections = {max_connections}`; Fulcrum and PgBouncer pool 20 server \
             connections, Pgpool-II runs {children} children (one server connection each). \
             One run per target; TPS includes connecting."
        ),
    );
    scenario.rows = proxies.rows(&cluster);
    let attempted = u64::from(clients) * per_client;
    let mut rows = std::mem::take(&mut scenario.rows);
    for row in &mut rows {
        eprintln!("  {}: {clients} clients", row.target);
        let sample = match pgbench_completion(&row.addr, &args, attempted) {
            Ok(sample) => sample,
            Err(e) if e.to_string().contains("still running") => {
                scenario.notes.push(format!(
                    "{}: pgbench had not finished after {} s and was killed; its \
                     transactions are counted as not completed.",
                    row.target,
                    COMPLETION_DEADLINE.as_secs()
                ));
                Sample {
                    tps: 0.0,
                    latency_ms: None,
                    completed: Some((0, attempted)),
                }
            }
            Err(e) => return Err(e),
        };
        proxies.check()?;
        eprintln!(
            "  {:<20} {:?} completed, {:.0} TPS",
            row.target, sample.completed, sample.tps
        );
        row.samples.push(sample);
    }
    scenario.rows = rows;
    let _ = std::fs::remove_file(&script);
    if let Some(f) = scenario.row(FULCRUM) {
        let (done, of) = f.completed().unwrap_or((0, attempted));
        scenario.goals.push(Goal {
            what: format!(
                "{clients} clients against max_connections {max_connections}: 100 % complete \
                 through Fulcrum"
            ),
            measured: format!("{done} / {of}"),
            met: done == of,
        });
    }
    scenario.notes.push(
        "The published PgBouncer comparison: 600 clients against `max_connections` 500 \
         completed 33 % directly and 100 % pooled. Clients that cannot connect are \
         aborted by pgbench; their remaining transactions count as not completed."
            .into(),
    );
    report.add(scenario);
    Ok(())
}

/// Memory per idle client: Fulcrum's resident set before and after
/// [`IDLE_CLIENTS`] clients have logged in and sit idle.
pub(super) fn idle_memory(fulcrum: &FulcrumProcess) -> Result<Scenario> {
    let pid = fulcrum.pid();
    let addr = fulcrum.listen_addrs()[0].clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let before = rss_kb(pid)?;
    let clients = rt.block_on(async {
        let (host, port) = addr.rsplit_once(':').expect("host:port");
        let conf = format!(
            "host={host} port={port} user={APP_USER} password={APP_PASSWORD} dbname={APP_DB}"
        );
        let mut clients = Vec::with_capacity(IDLE_CLIENTS);
        for batch in 0..IDLE_CLIENTS.div_ceil(100) {
            let n = (IDLE_CLIENTS - batch * 100).min(100);
            let connects = (0..n).map(|_| tokio_postgres::connect(&conf, tokio_postgres::NoTls));
            for result in futures_util::future::join_all(connects).await {
                let (client, conn) = result.map_err(|e| format!("idle client: {e}"))?;
                tokio::spawn(conn);
                clients.push(client);
            }
        }
        Ok::<_, crate::Error>(clients)
    })?;
    std::thread::sleep(Duration::from_millis(500));
    let after = rss_kb(pid)?;
    drop(clients);
    drop(rt);
    let per_client = (after.saturating_sub(before)) as f64 / IDLE_CLIENTS as f64;
    let mut s = Scenario::new(
        "pg-memory",
        "Memory per idle client connection (PostgreSQL)",
        format!(
            "Fulcrum's resident set (VmRSS) after a warm run, then with {IDLE_CLIENTS} \
             tokio-postgres clients logged in (SCRAM) and idle."
        ),
    );
    s.goals.push(Goal {
        what: format!("resident set per idle client ({IDLE_CLIENTS} clients): <= 16 kB"),
        measured: format!("{per_client:.1} kB ({before} kB -> {after} kB)"),
        met: per_client <= 16.0,
    });
    Ok(s)
}

/// VmRSS of `pid` in kB.
pub(super) fn rss_kb(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .ok_or_else(|| format!("no VmRSS for pid {pid}").into())
}
