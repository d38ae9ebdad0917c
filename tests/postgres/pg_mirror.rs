//! Mirroring with a diff (`[[cluster.mirror]]`), PostgreSQL: pgbench TPC-B
//! mirrored with writes into a second cluster leaves both with the same
//! history; a reads-only mirror into a cluster where one table differs
//! reports differences for the digests that read that table only; `sync`
//! holds each answer until the mirror has answered; a dead target costs
//! the client nothing. Two single-node clusters, shared by the module.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fulcrum_suite::{pg_connect, show_mirror, with_console, PgProxyConfig};
use fulcrum_testkit::{
    free_port, pgbench_init, run_pgbench, FulcrumProcess, PgCluster, APP_DB, APP_PASSWORD, APP_USER,
};
use tokio_postgres::SimpleQueryMessage;

/// The primary cluster and the mirror target, each a lone PostgreSQL 15.
fn clusters() -> &'static (PgCluster, PgCluster) {
    static CLUSTERS: OnceLock<(PgCluster, PgCluster)> = OnceLock::new();
    CLUSTERS.get_or_init(|| {
        let a = PgCluster::builder().start().expect("primary cluster");
        let b = PgCluster::builder().start().expect("mirror cluster");
        for c in [&a, &b] {
            // The same tables on both; one row differs on the mirror.
            c.primary()
                .sql(&format!(
                    "CREATE TABLE mirror_same (id int PRIMARY KEY, v text); \
                     CREATE TABLE mirror_diff (id int PRIMARY KEY, v text); \
                     CREATE TABLE mirror_slow (id int); \
                     INSERT INTO mirror_same SELECT g, 'v' || g FROM generate_series(1, 50) g; \
                     INSERT INTO mirror_diff SELECT g, 'v' || g FROM generate_series(1, 50) g; \
                     GRANT ALL ON mirror_same, mirror_diff, mirror_slow TO {APP_USER}"
                ))
                .expect("tables");
        }
        b.primary()
            .sql("UPDATE mirror_diff SET v = 'changed' WHERE id = 5")
            .unwrap();
        // On the mirror, reading mirror_slow takes half a second.
        b.primary()
            .sql(&format!(
                "ALTER TABLE mirror_slow RENAME TO mirror_slow_table; \
                 CREATE FUNCTION mirror_slow_rows() RETURNS SETOF int LANGUAGE sql AS \
                 'SELECT pg_sleep(0.5); SELECT id FROM mirror_slow_table'; \
                 CREATE VIEW mirror_slow AS SELECT id FROM mirror_slow_rows() AS id; \
                 GRANT ALL ON mirror_slow, mirror_slow_table TO {APP_USER}"
            ))
            .unwrap();
        (a, b)
    })
}

/// Fulcrum with cluster `main` on the first cluster, mirrored as `mirror`
/// says (its `[[cluster.mirror]]` lines), and a cluster `shadow` on the
/// second; the console on a free port.
fn start(mirror: &str) -> (FulcrumProcess, PgProxyConfig, u16) {
    let (a, b) = clusters();
    let cfg = PgProxyConfig::new(&a.primary().addr()).client_auth("md5");
    let shadow = PgProxyConfig::new(&b.primary().addr()).client_auth("md5");
    let shadow_toml = shadow
        .to_toml()
        .replacen("name = \"main\"", "name = \"shadow\"", 1);
    let (_, shadow_cluster) = shadow_toml.split_once("[[cluster]]").unwrap();
    let toml = format!(
        "{}\n[[cluster.mirror]]\n{mirror}\n\n[[cluster]]{shadow_cluster}",
        cfg.to_toml()
    );
    let admin = free_port();
    let p = FulcrumProcess::start(&with_console(&toml, admin)).expect("start fulcrum");
    (p, cfg, admin)
}

/// Waits until the mirror has taken `units` units (sent + dropped).
async fn until_mirrored(admin: u16, units: u64) -> Vec<(String, u64, u64, u64)> {
    let start = Instant::now();
    loop {
        let rows = show_mirror(admin).await;
        let done: u64 = rows.iter().map(|r| r.1 + r.2).sum();
        if done >= units || start.elapsed() > Duration::from_secs(60) {
            return rows;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn history(c: &PgCluster) -> String {
    c.primary()
        .sql("SELECT count(*), sum(delta), sum(aid), sum(tid), sum(bid) FROM pgbench_history")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_tpcb_mirrored_with_writes_leaves_both_clusters_the_same_history() {
    let (a, b) = clusters();
    for c in [a, b] {
        pgbench_init(&c.primary().addr(), APP_USER, APP_PASSWORD, APP_DB, 1).unwrap();
    }
    let (_p, cfg, admin) =
        start("cluster = \"shadow\"\nmirror_writes = true\nmirror_queue = 100000");
    let mut done = 0;
    for mode in ["simple", "prepared"] {
        let r = run_pgbench(
            &cfg.listen,
            APP_USER,
            APP_PASSWORD,
            APP_DB,
            &["-n", "-M", mode, "-c", "4", "-j", "2", "-t", "100"],
        )
        .unwrap();
        assert_eq!((r.transactions, r.failed), (400, 0), "{mode}: {}", r.stdout);
        done += 400;
    }
    // A TPC-B transaction is 7 units (BEGIN ... END); -M simple's BEGIN is
    // answered by Fulcrum and travels with the next unit (not counted).
    let rows = until_mirrored(admin, done / 2 * 6 + done / 2 * 7).await;
    let (sent, dropped): (u64, u64) = rows.iter().fold((0, 0), |s, r| (s.0 + r.1, s.1 + r.2));
    eprintln!(
        "TPC-B mirrored: {sent} units sent, {dropped} dropped; {} digests",
        rows.len()
    );
    assert_eq!(dropped, 0, "{rows:?}");
    let start = Instant::now();
    while history(a) != history(b) && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(history(a), history(b), "the same history rows on both");
    assert!(history(a).starts_with("800|"), "{}", history(a));
    let balance = "SELECT sum(abalance), sum(bbalance) FROM pgbench_accounts, \
                   (SELECT sum(bbalance) AS bbalance FROM pgbench_branches) b";
    assert_eq!(
        a.primary().sql(balance).unwrap(),
        b.primary().sql(balance).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_made_to_differ_shows_in_its_digests_only() {
    clusters();
    let (_p, cfg, admin) = start("cluster = \"shadow\"");
    let client = pg_connect(&cfg).await;
    let mut units = 0;
    for id in 1..=10 {
        client
            .simple_query(&format!("SELECT v FROM mirror_same WHERE id = {id}"))
            .await
            .unwrap();
        client
            .simple_query(&format!("SELECT v FROM mirror_diff WHERE id = {id}"))
            .await
            .unwrap();
        units += 2;
    }
    // A write is not mirrored (mirror_writes is off): the target keeps 50 rows.
    client
        .simple_query("INSERT INTO mirror_same VALUES (1000, 'new')")
        .await
        .unwrap();
    let rows = until_mirrored(admin, units).await;
    eprintln!("SHOW MIRROR: {rows:?}");
    let row = |table: &str| {
        rows.iter()
            .find(|r| r.0.contains(table))
            .unwrap_or_else(|| panic!("no digest reading {table}: {rows:?}"))
            .clone()
    };
    let same = row("mirror_same");
    let diff = row("mirror_diff");
    assert_eq!((same.1, same.3), (10, 0), "the same table answers the same");
    assert_eq!((diff.1, diff.3), (10, 1), "one row of ten differs");
    assert!(!rows.iter().any(|r| r.0.contains("INSERT")), "{rows:?}");
    let (_, b) = clusters();
    assert_eq!(
        b.primary()
            .sql("SELECT count(*) FROM mirror_same WHERE id = 1000")
            .unwrap(),
        "0"
    );
    client
        .simple_query("DELETE FROM mirror_same WHERE id = 1000")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_holds_the_answer_until_the_mirror_answers_async_does_not() {
    clusters();
    for (mode, slow) in [("async", false), ("sync", true)] {
        let (_p, cfg, admin) = start(&format!("cluster = \"shadow\"\nmirror_mode = \"{mode}\""));
        let client = pg_connect(&cfg).await;
        client.simple_query("SELECT 1").await.unwrap(); // logged in, warmed up
        let started = Instant::now();
        for _ in 0..3 {
            client
                .simple_query("SELECT * FROM mirror_slow")
                .await
                .unwrap();
        }
        let took = started.elapsed();
        eprintln!("{mode}: 3 reads the mirror answers in 0.5 s each took {took:?}");
        if slow {
            assert!(took >= Duration::from_millis(1500), "{mode}: {took:?}");
        } else {
            assert!(took < Duration::from_millis(1000), "{mode}: {took:?}");
        }
        let rows = until_mirrored(admin, 4).await;
        assert!(
            rows.iter().any(|r| r.0.contains("mirror_slow") && r.1 == 3),
            "{rows:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_mirror_target_costs_the_client_nothing() {
    clusters();
    // Nothing listens there.
    let dead = format!("127.0.0.1:{}", free_port());
    let (_p, cfg, admin) = start(&format!(
        "address = \"{dead}\"\nuser = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\"\nmirror_writes = true"
    ));
    let client = pg_connect(&cfg).await;
    let started = Instant::now();
    for id in 1..=200 {
        let rows = client
            .simple_query(&format!(
                "SELECT v FROM mirror_same WHERE id = {}",
                id % 50 + 1
            ))
            .await
            .unwrap();
        assert!(rows.iter().any(|m| matches!(m, SimpleQueryMessage::Row(_))));
    }
    let took = started.elapsed();
    let rows = until_mirrored(admin, 200).await;
    let dropped: u64 = rows.iter().map(|r| r.2).sum();
    let sent: u64 = rows.iter().map(|r| r.1).sum();
    eprintln!("dead target: 200 reads in {took:?}; mirror sent {sent}, dropped {dropped}");
    assert_eq!((sent, dropped), (0, 200));
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_fulcrum_answers_itself_keep_the_mirror_in_step() {
    // A DEALLOCATE of a statement Fulcrum maps is answered without a server,
    // and a lone BEGIN travels with the next unit: the mirror pairs every
    // later answer with its own unit still (no false differences).
    clusters();
    let (_p, cfg, admin) = start("cluster = \"shadow\"");
    let client = pg_connect(&cfg).await;
    let stmt = client
        .prepare("SELECT v FROM mirror_same WHERE id = $1")
        .await
        .unwrap();
    let mut units = 1; // the Parse/Describe/Sync of prepare()
    for id in 1..=5i32 {
        let row = client.query_one(&stmt, &[&id]).await.unwrap();
        assert_eq!(row.get::<_, String>(0), format!("v{id}"));
        units += 1;
    }
    // Inside a transaction (a server attached), DEALLOCATE ALL is answered
    // by Fulcrum: the statements it maps stay on the shared connections.
    client.simple_query("BEGIN").await.unwrap();
    client
        .simple_query("SELECT v FROM mirror_same WHERE id = 9")
        .await
        .unwrap();
    client.simple_query("DEALLOCATE ALL").await.unwrap();
    client.simple_query("COMMIT").await.unwrap();
    // The BEGIN travels with the SELECT; the DEALLOCATE is replayed, not
    // compared (Fulcrum answered it): neither is counted.
    units += 2;
    for id in 1..=5 {
        client
            .simple_query(&format!(
                "BEGIN; SELECT v FROM mirror_diff WHERE id = {id}; COMMIT"
            ))
            .await
            .unwrap();
        client.simple_query("BEGIN").await.unwrap();
        client
            .simple_query(&format!("SELECT v FROM mirror_same WHERE id = {id}"))
            .await
            .unwrap();
        client.simple_query("COMMIT").await.unwrap();
        units += 3;
    }
    let rows = until_mirrored(admin, units).await;
    eprintln!("{rows:?}");
    for r in rows.iter().filter(|r| !r.0.contains("mirror_diff")) {
        assert_eq!(r.3, 0, "{r:?} in {rows:?}");
    }
    let diff = rows
        .iter()
        .find(|r| r.0.contains("mirror_diff"))
        .expect("mirror_diff mirrored");
    assert_eq!((diff.1, diff.3), (5, 1), "{rows:?}");
}
