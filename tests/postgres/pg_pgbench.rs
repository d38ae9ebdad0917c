//! The real pgbench through Fulcrum: initialisation, select-only and TPC-B in
//! every query mode and with a new connection per transaction (-C), all with
//! zero failed transactions and the row counts a direct run gives.

use fulcrum_suite::PgProxyConfig;
use fulcrum_testkit::{run_pgbench, FulcrumProcess, PgCluster, APP_DB, APP_PASSWORD, APP_USER};

fn count(cluster: &PgCluster, table: &str) -> u64 {
    cluster
        .primary()
        .sql(&format!("SELECT count(*) FROM {table}"))
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn pgbench_runs_through_fulcrum_in_every_mode_with_no_failures() {
    let cluster = PgCluster::builder().replicas(2).start().expect("cluster");
    let mut cfg = PgProxyConfig::new(&cluster.primary().addr()).pool_size(8);
    for r in cluster.replicas() {
        cfg = cfg.replica(&r.addr());
    }
    // Pins are logged at debug level under the target fulcrum_pin: with
    // it on, the log shows whether any pgbench call pinned its client.
    cfg.log = "info,fulcrum_pin=debug";
    let fulcrum = FulcrumProcess::start(&cfg.to_toml()).expect("fulcrum");
    let via = cfg.listen.as_str();

    // Initialise through Fulcrum (COPY, DDL, VACUUM pass through).
    let init = fulcrum_testkit::pgbench(
        &[
            "-i",
            "-q",
            "-s",
            "1",
            "-h",
            "127.0.0.1",
            "-p",
            via.rsplit_once(':').unwrap().1,
            "-U",
            APP_USER,
            APP_DB,
        ],
        Some(APP_PASSWORD),
    )
    .unwrap();
    assert!(
        init.status.success(),
        "pgbench -i: {}",
        String::from_utf8_lossy(&init.stderr)
    );
    assert_eq!(count(&cluster, "pgbench_accounts"), 100_000);
    assert_eq!(count(&cluster, "pgbench_branches"), 1);

    for mode in ["simple", "extended", "prepared"] {
        let s = run_pgbench(
            via,
            APP_USER,
            APP_PASSWORD,
            APP_DB,
            &["-S", "-M", mode, "-c", "8", "-j", "2", "-t", "200"],
        )
        .unwrap();
        assert_eq!(s.failed, 0, "select-only {mode}: {}", s.stdout);
        assert_eq!(s.transactions, 1600, "select-only {mode}");
        let w = run_pgbench(
            via,
            APP_USER,
            APP_PASSWORD,
            APP_DB,
            &["-M", mode, "-c", "4", "-j", "2", "-t", "100"],
        )
        .unwrap();
        assert_eq!(w.failed, 0, "tpc-b {mode}: {}", w.stdout);
        assert_eq!(w.transactions, 400, "tpc-b {mode}");
        // pgbench truncates pgbench_history before each run: every TPC-B
        // transaction of this run inserted exactly one row and committed.
        assert_eq!(
            count(&cluster, "pgbench_history"),
            w.transactions,
            "tpc-b {mode}"
        );
    }
    for mode in ["simple", "extended", "prepared"] {
        let c = run_pgbench(
            via,
            APP_USER,
            APP_PASSWORD,
            APP_DB,
            &["-C", "-M", mode, "-c", "4", "-j", "2", "-t", "50"],
        )
        .unwrap();
        assert_eq!(c.failed, 0, "-C {mode}: {}", c.stdout);
        assert_eq!(c.transactions, 200);
        assert_eq!(
            count(&cluster, "pgbench_history"),
            c.transactions,
            "-C {mode}"
        );
    }
    assert_eq!(count(&cluster, "pgbench_accounts"), 100_000);
    // Balances moved consistently across all runs: every committed transaction
    // changed one account, its teller and its branch by the same delta.
    let consistent = cluster
        .primary()
        .sql("SELECT (SELECT sum(bbalance) FROM pgbench_branches) = (SELECT sum(abalance) FROM pgbench_accounts) AND (SELECT sum(tbalance) FROM pgbench_tellers) = (SELECT sum(abalance) FROM pgbench_accounts)")
        .unwrap();
    assert_eq!(consistent, "t");
    // Default-deny pins what Fulcrum cannot prove harmless; none of
    // pgbench's calls (-i, every mode, -C) is such a thing.
    let pins: Vec<String> = fulcrum
        .log_contents()
        .lines()
        .filter(|l| l.contains("client pinned"))
        .map(str::to_owned)
        .collect();
    assert!(
        pins.is_empty(),
        "pgbench pinned clients:\n{}",
        pins.join("\n")
    );

    // The same workload directly gives the same counts.
    let d = run_pgbench(
        &cluster.primary().addr(),
        APP_USER,
        APP_PASSWORD,
        APP_DB,
        &["-c", "4", "-t", "100"],
    )
    .unwrap();
    assert_eq!(d.failed, 0);
    assert_eq!(count(&cluster, "pgbench_history"), d.transactions);
}
