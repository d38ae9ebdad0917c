//! sysbench (Debian's, with its MySQL driver) through Fulcrum on a real
//! MariaDB primary with two GTID replicas: the OLTP workloads with
//! server-side prepared statements (`--db-ps-mode=auto`) and without
//! (`disable`) finish with 0 errors, and the replicas' own counters show the
//! reads spread over them.

use std::sync::OnceLock;
use std::time::Duration;

use fulcrum_suite::{com_select, maria_toml};
use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster};

/// This module's own cluster, not shared: its test reads the replicas'
/// `Com_select` counters, which any other module's reads would move.
fn cluster() -> &'static MariaCluster {
    static CLUSTER: OnceLock<MariaCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        MariaCluster::builder()
            .replicas(2)
            .start()
            .expect("MariaDB cluster")
    })
}

fn fulcrum() -> &'static (FulcrumProcess, u16) {
    static P: OnceLock<(FulcrumProcess, u16)> = OnceLock::new();
    P.get_or_init(|| {
        let port = free_port();
        let t = maria_toml(cluster(), port, "");
        (FulcrumProcess::start(&t).expect("fulcrum"), port)
    })
}

/// sysbench on `port`: two tables of 1000 rows.
fn sysbench(port: u16, args: &[&str]) -> String {
    fulcrum_suite::sysbench(port, 2, 1000, args)
}

/// sysbench's "ignored errors:" figure from its summary (a fatal error
/// makes sysbench fail instead, which `sysbench` reports).
fn errors(summary: &str) -> u64 {
    summary
        .lines()
        .find(|l| l.trim_start().starts_with("ignored errors:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no errors line in:\n{summary}"))
}

#[test]
fn oltp_workloads_run_without_errors_and_reads_spread_over_the_replicas() {
    let (_, port) = fulcrum();
    let port = *port;
    sysbench(port, &["oltp_read_write", "prepare"]);
    cluster()
        .wait_replicas_caught_up(Duration::from_secs(60))
        .unwrap();
    // Deadlocks are what sysbench ignores and retries; the same workload run
    // directly on the primary shows how many the workload itself makes.
    let direct = sysbench(
        cluster().primary().port(),
        &[
            "oltp_write_only",
            "run",
            "--threads=4",
            "--events=400",
            "--time=0",
        ],
    );
    eprintln!(
        "oltp_write_only directly on the primary: {} ignored errors",
        errors(&direct)
    );
    for ps_mode in ["auto", "disable"] {
        for (workload, extra) in [
            ("oltp_point_select", ""),
            ("oltp_read_only", "--skip-trx=on"),
            ("oltp_read_only", "--skip-trx=off"),
            ("oltp_read_write", ""),
            ("oltp_write_only", ""),
        ] {
            let before: Vec<u64> = cluster().nodes().map(com_select).collect();
            let mode = format!("--db-ps-mode={ps_mode}");
            let mut args = vec![workload, "run", "--threads=4", "--events=400", "--time=0"];
            args.push(&mode);
            if !extra.is_empty() {
                args.push(extra);
            }
            let out = sysbench(port, &args);
            let after: Vec<u64> = cluster().nodes().map(com_select).collect();
            let delta: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
            eprintln!("{workload} {extra} ps-mode={ps_mode}: {} errors; SELECTs on primary/replica1/replica2: {delta:?}", errors(&out));
            // Any error but a deadlock makes sysbench fail (checked in
            // `sysbench`); deadlocks it retries ("ignored errors") are the
            // workload's own when it writes (see the direct run above).
            if !workload.contains("write") {
                assert_eq!(errors(&out), 0, "{workload} {ps_mode}:\n{out}");
            }
            // Reads outside transactions spread; a transaction opened with
            // BEGIN stays on the primary (its later statements may write).
            if workload == "oltp_point_select" || extra == "--skip-trx=on" {
                assert!(
                    delta[1] > 0 && delta[2] > 0,
                    "{workload} {ps_mode}: reads on both replicas: {delta:?}"
                );
            }
        }
    }
    sysbench(port, &["oltp_read_write", "cleanup"]);
}
