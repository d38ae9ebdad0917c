//! A reads-only mirror (`mirror_writes = false`, the default), MariaDB:
//! writes hidden behind a harmless first statement (`SET @a=1; INSERT`,
//! `BEGIN; INSERT; COMMIT`, `USE db; INSERT`) and `SET PASSWORD` reach the
//! primary only; the mirror's table stays as it was and its login's
//! password still works. Two single-node servers of its own.

use std::time::{Duration, Instant};

use fulcrum_suite::{maria_connect, maria_opts, maria_toml, rss_kb, show_mirror, with_console};
use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster, APP_DB, APP_PASSWORD, APP_USER};
use mysql_async::prelude::Queryable;

/// `mirror` of `main`, as `[[cluster.mirror]]` with `extra` lines, on `port`.
pub(crate) fn mirrored_toml(
    main: &MariaCluster,
    mirror: &MariaCluster,
    port: u16,
    extra: &str,
) -> String {
    let main = maria_toml(main, port, "");
    let shadow =
        maria_toml(mirror, free_port(), "").replacen("name = \"shop\"", "name = \"shadow\"", 1);
    let (_, shadow_cluster) = shadow.split_once("[[cluster]]").expect("a cluster");
    format!(
        "{main}\n[[cluster.mirror]]\ncluster = \"shadow\"\n{extra}\n\n[[cluster]]{shadow_cluster}"
    )
}

/// Waits until SHOW MIRROR counts `sent` units (of any digest) at least.
async fn mirrored(admin: u16, sent: u64) -> Vec<(String, u64, u64, u64)> {
    let start = Instant::now();
    loop {
        let rows = show_mirror(admin).await;
        if rows.iter().map(|r| r.1).sum::<u64>() >= sent
            || start.elapsed() > Duration::from_secs(20)
        {
            return rows;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reads_only_mirror_runs_no_write_behind_a_harmless_first_statement() {
    let a = MariaCluster::builder().start().expect("MariaDB");
    let b = MariaCluster::builder().start().expect("mirror MariaDB");
    for c in [&a, &b] {
        c.primary()
            .sql("CREATE TABLE mirrored (id INT PRIMARY KEY)")
            .unwrap();
    }
    let (port, admin) = (free_port(), free_port());
    let toml = mirrored_toml(&a, &b, port, "");
    let _p = FulcrumProcess::start(&with_console(&toml, admin)).expect("start fulcrum");

    let mut conn = maria_connect(port).await;
    for sql in [
        "SET @a=1; INSERT INTO mirrored VALUES (1)".to_owned(),
        "BEGIN; INSERT INTO mirrored VALUES (2); COMMIT".to_owned(),
        format!("USE {APP_DB}; INSERT INTO mirrored VALUES (3)"),
        "SET PASSWORD = PASSWORD('changed-by-the-client')".to_owned(),
    ] {
        conn.query_drop(&sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    // The primary's login comes back (the mirror's must never have changed).
    a.primary()
        .sql(&format!(
            "SET PASSWORD FOR '{APP_USER}'@'%' = PASSWORD('{APP_PASSWORD}')"
        ))
        .unwrap();
    // A read the mirror takes, and waits for: what came before it is done.
    let n: Option<i64> = conn
        .query_first("SELECT COUNT(*) FROM mirrored")
        .await
        .unwrap();
    assert_eq!(n, Some(3), "the primary has the three rows");
    let rows = mirrored(admin, 1).await;
    assert!(
        rows.iter().any(|r| r.0.contains("mirrored") && r.1 > 0),
        "the read was mirrored: {rows:?}"
    );
    drop(conn);

    assert_eq!(
        b.primary().sql("SELECT COUNT(*) FROM mirrored").unwrap(),
        "0",
        "the mirror's table is unchanged: {rows:?}"
    );
    let direct = mysql_async::Conn::new(maria_opts(b.primary().port())).await;
    assert!(
        direct.is_ok(),
        "the mirror login's password still works: {:?}",
        direct.err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirrored_long_transaction_of_large_selects_keeps_memory_bounded() {
    let a = MariaCluster::builder().start().expect("MariaDB");
    let b = MariaCluster::builder().start().expect("mirror MariaDB");
    let (port, admin) = (free_port(), free_port());
    let toml = mirrored_toml(&a, &b, port, "mirror_max_transaction_bytes = \"2MB\"");
    let p = FulcrumProcess::start(&with_console(&toml, admin)).expect("start fulcrum");

    let mut conn = maria_connect(port).await;
    let select = format!("SELECT LENGTH('{}')", "x".repeat(60_000));
    // Warm up: buffers, pools and caches grow to their size first.
    for _ in 0..50 {
        conn.query_drop(&select).await.unwrap();
    }
    let before = rss_kb(p.pid());
    conn.query_drop("BEGIN").await.unwrap();
    const SELECTS: u64 = 2000; // 120 MB of client bytes in one transaction.
    for i in 0..SELECTS {
        conn.query_drop(&select).await.unwrap();
        if i % 500 == 0 {
            eprintln!("{i}: VmRSS {} kB", rss_kb(p.pid()));
        }
    }
    let during = rss_kb(p.pid());
    conn.query_drop("COMMIT").await.unwrap();
    eprintln!("VmRSS before {before} kB, at the transaction's end {during} kB");
    assert!(
        during < before + 40_000,
        "a mirrored client's open transaction is bounded: VmRSS {before} kB -> {during} kB"
    );
    // The transaction was dropped whole, and counted.
    let start = Instant::now();
    let dropped = loop {
        let rows = show_mirror(admin).await;
        let dropped: u64 = rows.iter().map(|r| r.2).sum();
        if dropped >= SELECTS || start.elapsed() > Duration::from_secs(10) {
            break dropped;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(dropped >= SELECTS, "{dropped} units counted as dropped");
}
