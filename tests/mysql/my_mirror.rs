//! Mirroring with a diff (`[[cluster.mirror]]`), MariaDB: a sysbench
//! read-only run (text protocol) through Fulcrum, mirrored into a second
//! MariaDB where one of the two tables was made to differ: only the
//! digests that read that table report differences. Two single-node
//! servers of its own.

use std::time::{Duration, Instant};

use fulcrum_suite::{maria_toml, show_mirror, with_console};
use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster};

/// sysbench on `port`: two tables of 500 rows.
fn sysbench(port: u16, args: &[&str]) -> String {
    fulcrum_suite::sysbench(port, 2, 500, args)
}

/// SHOW MIRROR once the mirror has caught up (async): its counts stopped
/// moving.
async fn settled(admin: u16) -> Vec<(String, u64, u64, u64)> {
    let total = |r: &[(String, u64, u64, u64)]| r.iter().map(|x| x.1 + x.2).sum::<u64>();
    let start = Instant::now();
    let mut rows = show_mirror(admin).await;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let next = show_mirror(admin).await;
        if total(&next) == total(&rows) || start.elapsed() > Duration::from_secs(30) {
            return next;
        }
        rows = next;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sysbench_read_only_mirror_reports_the_table_made_to_differ() {
    let a = MariaCluster::builder().start().expect("MariaDB");
    let b = MariaCluster::builder().start().expect("mirror MariaDB");
    for c in [&a, &b] {
        sysbench(c.primary().port(), &["oltp_read_only", "prepare"]);
        // sysbench's rows are random: the same rows on both servers.
        for t in ["sbtest1", "sbtest2"] {
            c.primary()
                .sql(&format!(
                    "UPDATE {t} SET k = id * 7 % 500, c = CONCAT('c-', id), pad = CONCAT('p-', id)"
                ))
                .unwrap();
        }
    }
    let checksum =
        |c: &MariaCluster, t: &str| c.primary().sql(&format!("CHECKSUM TABLE {t}")).unwrap();
    assert_eq!(
        checksum(&a, "sbtest1"),
        checksum(&b, "sbtest1"),
        "prepared alike"
    );
    assert_eq!(
        checksum(&a, "sbtest2"),
        checksum(&b, "sbtest2"),
        "prepared alike"
    );
    // On the mirror, every row of sbtest2 differs (k and c).
    b.primary()
        .sql("UPDATE sbtest2 SET k = k + 1, c = CONCAT('x', SUBSTRING(c, 2))")
        .unwrap();

    let (port, shadow_port, admin) = (free_port(), free_port(), free_port());
    let main = maria_toml(&a, port, "");
    let shadow =
        maria_toml(&b, shadow_port, "").replacen("name = \"shop\"", "name = \"shadow\"", 1);
    let (_, shadow_cluster) = shadow.split_once("[[cluster]]").unwrap();
    let toml =
        format!("{main}\n[[cluster.mirror]]\ncluster = \"shadow\"\n\n[[cluster]]{shadow_cluster}");
    let _p = FulcrumProcess::start(&with_console(&toml, admin)).expect("start fulcrum");
    let mut rows = Vec::new();

    // The text protocol, then prepared statements (sysbench's default:
    // each execute is mirrored by its statement's text).
    let mut sent_before = 0;
    for mode in ["disable", "auto"] {
        let run = sysbench(
            port,
            &[
                "oltp_read_only",
                &format!("--db-ps-mode={mode}"),
                "--threads=4",
                "--time=4",
                "run",
            ],
        );
        assert!(run.contains("queries performed"), "{run}");
        rows = settled(admin).await;
        for r in &rows {
            eprintln!("{mode}: {r:?}");
        }
        let sent: u64 = rows.iter().map(|r| r.1).sum();
        assert!(
            sent > sent_before + 1000,
            "{mode}: {sent} sent, {sent_before} before"
        );
        sent_before = sent;
        let reading = |t: &str| rows.iter().filter(|r| r.0.contains(t)).collect::<Vec<_>>();
        let (one, two) = (reading("sbtest1"), reading("sbtest2"));
        assert!(
            one.len() >= 4 && two.len() >= 4,
            "{mode}: sysbench's read digests of both tables: {rows:?}"
        );
        for r in &one {
            assert!(
                r.1 > 0 && r.3 == 0,
                "{mode}: sbtest1 answers the same: {r:?}"
            );
        }
        for r in &two {
            assert!(
                r.1 > 0 && r.3 > 0,
                "{mode}: sbtest2 answers differently: {r:?}"
            );
        }
    }
    let dropped: u64 = rows.iter().map(|r| r.2).sum();
    assert_eq!(dropped, 0, "{rows:?}");
}
