//! A binary upgrade under MariaDB traffic: sysbench `oltp_read_write`, 4
//! threads, 10 s, with SIGUSR2 at 3 s, finishes with no error but the
//! deadlocks the workload makes itself and no reconnect; the new
//! process takes the listener and serves new clients, and sysbench's
//! connections (prepared statements and all) move to it at their next
//! transaction boundary; the old process exits once they have moved.

use std::time::{Duration, Instant};

use fulcrum_suite::{maria_one_replica, maria_toml, sysbench, upgraded_to, KillOnDrop};
use fulcrum_testkit::{
    free_port, run_mariadb, FulcrumProcess, Signal, APP_DB, APP_PASSWORD, APP_USER,
};

/// sysbench's "ignored errors:" figure from its summary.
fn errors(summary: &str) -> u64 {
    summary
        .lines()
        .find(|l| l.trim_start().starts_with("ignored errors:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no errors line in:\n{summary}"))
}

#[test]
fn sysbench_read_write_runs_through_an_upgrade_without_failing() {
    let c = maria_one_replica();
    let port = free_port();
    let p = FulcrumProcess::start(&maria_toml(c, port, "")).expect("fulcrum");
    // sysbench's sbtest tables: no other module of this cluster uses them.
    sysbench(port, 2, 1000, &["oltp_read_write", "prepare"]);
    c.wait_replicas_caught_up(Duration::from_secs(60)).unwrap();
    let run = std::thread::spawn(move || {
        sysbench(
            port,
            2,
            1000,
            &[
                "oltp_read_write",
                "run",
                "--threads=4",
                "--time=10",
                "--events=0",
            ],
        )
    });
    std::thread::sleep(Duration::from_secs(3));
    let signalled = Instant::now();
    p.signal(Signal::Usr2).unwrap();
    p.wait_for_log("handed over to process", Duration::from_secs(60))
        .unwrap();
    eprintln!("handed over {:?} after SIGUSR2", signalled.elapsed());
    let log = p.log_contents();
    let pid = upgraded_to(&log, 1).expect("handed over");
    let _kill = KillOnDrop(pid);
    let summary = run.join().expect("sysbench ran");
    eprintln!("{summary}");
    // Any error but a deadlock fails sysbench (checked in `sysbench`); the
    // deadlocks it retries ("ignored errors") are the workload's own on two
    // small tables, as tests/mysql/my_sysbench.rs shows with a direct run.
    eprintln!("ignored errors (deadlocks retried): {}", errors(&summary));
    let reconnects = summary
        .lines()
        .find(|l| l.trim_start().starts_with("reconnects:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("no reconnects line in:\n{summary}"));
    assert_eq!(reconnects, "0", "{summary}");
    // Its 4 connections moved to the new process at their transaction
    // boundaries (the new process logs the old one's tally), and the old
    // process, left with no client, has exited.
    let log = p.log_contents();
    assert!(
        p.try_wait().is_some() && log.contains("handed_over=4 "),
        "the old process exits once sysbench's connections moved:\n{log}"
    );
    let via = format!("127.0.0.1:{port}");
    let n = run_mariadb(
        &via,
        APP_USER,
        APP_PASSWORD,
        APP_DB,
        "SELECT COUNT(*) FROM sbtest1",
    )
    .unwrap();
    assert_eq!(n, "1000", "the new process serves");
    sysbench(port, 2, 1000, &["oltp_read_write", "cleanup"]);
}
