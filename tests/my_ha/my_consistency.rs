//! Read-your-writes and causal reads through Fulcrum on a real MariaDB
//! primary with two GTID replicas that apply events 1 s late on purpose
//! (`MASTER_DELAY = 1`): write-then-read loops count stale reads per
//! `consistency` mode (eventual must show them; session and strong must not),
//! mysql_async inserts N rows with prepared statements then counts them, a
//! reader that never writes keeps the replicas, a read waits on a replica
//! with `causal_wait = "always"` (MASTER_GTID_WAIT), strong sees another
//! client's write, and the hint and `SET/SHOW fulcrum.consistency` work.
//!
//! One cluster for this module's tests (the binary's others do not use it);
//! each test starts its own Fulcrum.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fulcrum_suite::{maria_connect, maria_toml};
use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster, MariaNode, APP_DB};
use mysql_async::prelude::Queryable;

fn cluster() -> &'static MariaCluster {
    static CLUSTER: OnceLock<MariaCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let c = MariaCluster::builder()
            .replicas(2)
            .start()
            .expect("MariaDB cluster");
        c.primary()
            .sql_db(
                APP_DB,
                "CREATE TABLE rw (client INT, i INT, PRIMARY KEY (client, i)); \
                 CREATE TABLE rows_n (round INT, n INT); \
                 CREATE TABLE lag_probe (k INT PRIMARY KEY)",
            )
            .expect("tables");
        c.wait_replicas_caught_up(Duration::from_secs(30))
            .expect("catch up");
        for r in c.replicas() {
            delay(r);
        }
        c
    })
}

fn delay(replica: &MariaNode) {
    replica
        .sql("STOP SLAVE; CHANGE MASTER TO MASTER_DELAY = 1; START SLAVE")
        .expect("delay the replica");
}

/// The precondition the lag tests stand on: a row written on the primary
/// early in a second is on neither replica 200 ms later. A replica that has
/// it is reported (its SHOW SLAVE STATUS and both clocks, on stderr), delayed
/// again and probed again; still not delayed after that, the test fails
/// here, naming the replica, rather than later on a Fulcrum assertion.
///
/// The likely way a replica loses its delay: when its I/O thread connects,
/// MariaDB sets `clock_diff_with_master = time(0) - <the primary's
/// UNIX_TIMESTAMP()>`, and the event is applied at `its timestamp +
/// clock_diff + MASTER_DELAY`. `time(0)` reads the kernel's coarse clock,
/// which lags the precise one by up to a tick (more on a VM whose vCPU was
/// descheduled); a connect across a second boundary can then measure -1,
/// and `MASTER_DELAY = 1` delays nothing until the next reconnect.
/// Delaying again (STOP SLAVE / START SLAVE) reconnects and measures anew.
fn assert_replicas_delayed(c: &MariaCluster) {
    static NEXT: AtomicI32 = AtomicI32::new(0);
    for attempt in 0..3 {
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        early_in_a_second();
        c.primary()
            .sql_db(APP_DB, &format!("INSERT INTO lag_probe VALUES ({k})"))
            .expect("probe row");
        std::thread::sleep(Duration::from_millis(200));
        let undelayed: Vec<&MariaNode> = c
            .replicas()
            .iter()
            .filter(|r| {
                let n = r
                    .sql_db(
                        APP_DB,
                        &format!("SELECT count(*) FROM lag_probe WHERE k = {k}"),
                    )
                    .expect("probe read");
                n.trim() != "0"
            })
            .collect();
        if undelayed.is_empty() {
            return;
        }
        for r in &undelayed {
            let clocks = r
                .sql("SELECT UNIX_TIMESTAMP(NOW(6))")
                .unwrap_or_else(|e| e.to_string());
            eprintln!(
                "attempt {attempt}: replica {} applied probe {k} within 200 ms (clock {}, \
                 primary clock {}); slave status {:?}",
                r.port(),
                clocks.trim(),
                c.primary()
                    .sql("SELECT UNIX_TIMESTAMP(NOW(6))")
                    .unwrap_or_else(|e| e.to_string())
                    .trim(),
                r.slave_status()
            );
            delay(r);
        }
    }
    panic!("a replica does not hold events for MASTER_DELAY = 1 (see stderr)");
}

fn start(extra: &str) -> (FulcrumProcess, u16) {
    let port = free_port();
    let toml = maria_toml(
        cluster(),
        port,
        &format!("client_auth = \"mysql_native_password\"\n{extra}"),
    );
    (FulcrumProcess::start(&toml).expect("fulcrum starts"), port)
}

/// `clients` connections each insert a row then read it back `iterations`
/// times; returns (stale reads, reads by server port).
async fn write_then_read(
    port: u16,
    base: i32,
    clients: i32,
    iterations: i32,
) -> (u64, HashMap<u16, u64>) {
    let tasks: Vec<_> = (0..clients)
        .map(|k| {
            tokio::spawn(async move {
                let mut c = maria_connect(port).await;
                let id = base + k;
                let (mut stale, mut ports) = (0u64, HashMap::new());
                for i in 0..iterations {
                    c.query_drop(format!("INSERT INTO rw VALUES ({id}, {i})"))
                        .await
                        .unwrap();
                    let (n, p): (i64, u16) = c
                        .query_first(format!(
                            "SELECT count(*), @@port FROM rw WHERE client = {id} AND i = {i}"
                        ))
                        .await
                        .unwrap()
                        .unwrap();
                    if n != 1 {
                        stale += 1;
                    }
                    *ports.entry(p).or_insert(0) += 1;
                }
                c.disconnect().await.unwrap();
                (stale, ports)
            })
        })
        .collect();
    let mut stale = 0;
    let mut ports = HashMap::new();
    for t in tasks {
        let (s, p) = t.await.unwrap();
        stale += s;
        for (k, v) in p {
            *ports.entry(k).or_insert(0) += v;
        }
    }
    (stale, ports)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_and_strong_never_read_stale_eventual_does() {
    let c = tokio::task::block_in_place(cluster);
    let mut results = Vec::new();
    for (n, mode) in ["eventual", "session", "strong"].iter().enumerate() {
        let (_p, port) = start(&format!("consistency = \"{mode}\""));
        let (stale, ports) = write_then_read(port, 1000 * (n as i32 + 1), 4, 250).await;
        eprintln!("consistency={mode}: {stale} stale of 1000 reads; reads by port {ports:?}");
        results.push((mode, stale, ports));
    }
    let (_, eventual_stale, eventual_ports) = &results[0];
    assert!(
        *eventual_stale > 0,
        "eventual reads replicas 1 s behind: some reads must be stale ({eventual_ports:?})"
    );
    assert_eq!(eventual_ports.get(&c.primary().port()), None);
    for (mode, stale, _) in &results[1..] {
        assert_eq!(*stale, 0, "consistency={mode} never reads stale");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inserted_rows_are_all_counted_every_time() {
    tokio::task::block_in_place(cluster);
    let (_p, port) = start("");
    let mut conn = maria_connect(port).await;
    for round in 0..20i32 {
        for n in 0..50i32 {
            // Binary protocol (COM_STMT_EXECUTE), as connectors use it.
            conn.exec_drop("INSERT INTO rows_n VALUES (?, ?)", (round, n))
                .await
                .unwrap();
        }
        let got: i64 = conn
            .exec_first("SELECT count(*) FROM rows_n WHERE round = ?", (round,))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, 50, "round {round}: all 50 rows counted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_that_never_write_keep_the_replicas() {
    let c = tokio::task::block_in_place(cluster);
    let (_p, port) = start("");
    let mut reader = maria_connect(port).await;
    let mut ports: HashMap<u16, u64> = HashMap::new();
    for _ in 0..40 {
        let p: u16 = reader.query_first("SELECT @@port").await.unwrap().unwrap();
        *ports.entry(p).or_insert(0) += 1;
    }
    eprintln!("never-writing reader under session: reads by port {ports:?}");
    for r in c.replicas() {
        assert!(
            ports.get(&r.port()).copied().unwrap_or(0) >= 10,
            "replica {} serves its share: {ports:?}",
            r.port()
        );
    }
    assert_eq!(ports.get(&c.primary().port()), None, "{ports:?}");
}

/// Sleeps until the wall clock is 20–40 ms past a whole second.
fn early_in_a_second() {
    loop {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_millis();
        if (20..40).contains(&ms) {
            return;
        }
        std::thread::sleep(Duration::from_millis(u64::from((1020 - ms) % 1000).max(1)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_waits_for_a_replica_when_told_to() {
    let c = tokio::task::block_in_place(cluster);
    tokio::task::block_in_place(|| assert_replicas_delayed(c));
    let (_p, port) = start("causal_wait = \"always\"\ncausal_timeout = \"5s\"");
    let mut conn = maria_connect(port).await;
    let replicas: Vec<u16> = c.replicas().iter().map(|r| r.port()).collect();
    for i in 0..2 {
        // MASTER_DELAY counts whole seconds from the event's timestamp, so a
        // write near the end of a second can be applied almost at once.
        // Writing just after a second begins makes the replica hold it ~1 s.
        tokio::task::block_in_place(early_in_a_second);
        conn.query_drop(format!("INSERT INTO rw VALUES (9000, {i})"))
            .await
            .unwrap();
        let started = Instant::now();
        let (n, p): (i64, u16) = conn
            .query_first(format!(
                "SELECT count(*), @@port FROM rw WHERE client = 9000 AND i = {i}"
            ))
            .await
            .unwrap()
            .unwrap();
        let took = started.elapsed();
        assert_eq!(n, 1, "not stale");
        assert!(replicas.contains(&p), "served by a replica, got {p}");
        assert!(
            took >= Duration::from_millis(300),
            "the read waited for the replica (MASTER_GTID_WAIT): {took:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strong_sees_another_clients_write() {
    tokio::task::block_in_place(cluster);
    let (_p, port) = start("consistency = \"strong\"");
    let mut writer = maria_connect(port).await;
    let mut reader = maria_connect(port).await;
    let mut stale = 0;
    for i in 0..100 {
        writer
            .query_drop(format!("INSERT INTO rw VALUES (20000, {i})"))
            .await
            .unwrap();
        let n: i64 = reader
            .query_first(format!(
                "SELECT count(*) FROM rw WHERE client = 20000 AND i = {i}"
            ))
            .await
            .unwrap()
            .unwrap();
        if n != 1 {
            stale += 1;
        }
    }
    eprintln!("another client's write, consistency=strong: {stale} stale of 100");
    assert_eq!(stale, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hint_and_session_setting_choose_the_mode() {
    tokio::task::block_in_place(cluster);
    let (_p, port) = start("");
    let mut conn = maria_connect(port).await;
    let show = "SHOW fulcrum.consistency";
    let mode: String = conn.query_first(show).await.unwrap().unwrap();
    assert_eq!(mode, "session");
    let mut stale = 0;
    for i in 0..10 {
        conn.query_drop(format!("INSERT INTO rw VALUES (30000, {i})"))
            .await
            .unwrap();
        let n: i64 = conn
            .query_first(format!(
                "/* fulcrum:consistency=eventual */ SELECT count(*) FROM rw WHERE client = 30000 AND i = {i}"
            ))
            .await
            .unwrap()
            .unwrap();
        if n != 1 {
            stale += 1;
        }
    }
    assert!(stale > 0, "the eventual hint reads a lagging replica");
    conn.query_drop("SET fulcrum.consistency = 'eventual'")
        .await
        .unwrap();
    let mode: String = conn.query_first(show).await.unwrap().unwrap();
    assert_eq!(mode, "eventual");
    let err = conn
        .query_drop("SET fulcrum.consistency = 'sometimes'")
        .await
        .unwrap_err();
    match err {
        mysql_async::Error::Server(e) => assert_eq!(e.code, 1231, "{e:?}"),
        other => panic!("expected ERR 1231, got {other:?}"),
    }
    conn.query_drop("RESET fulcrum.consistency").await.unwrap();
    let mode: String = conn.query_first(show).await.unwrap().unwrap();
    assert_eq!(mode, "session");
    conn.query_drop("INSERT INTO rw VALUES (30001, 0)")
        .await
        .unwrap();
    let n: i64 = conn
        .query_first("SELECT count(*) FROM rw WHERE client = 30001")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 1, "session again after RESET");
}

/// `consistency = "user"` on MariaDB: a write on one connection is seen by
/// a read on a fresh connection of the same user; `session` misses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_consistency_covers_every_connection_of_the_user() {
    let c = tokio::task::block_in_place(cluster);
    tokio::task::block_in_place(|| assert_replicas_delayed(c));
    let mut stale_by_mode = Vec::new();
    for (mode, id) in [("session", 50_000), ("user", 60_000)] {
        let (_p, port) = start(&format!("consistency = \"{mode}\""));
        let mut writer = maria_connect(port).await;
        let mut stale = 0;
        for i in 0..12 {
            writer
                .query_drop(format!("INSERT INTO rw VALUES ({id}, {i})"))
                .await
                .unwrap();
            let mut reader = maria_connect(port).await;
            let n: Option<i64> = reader
                .query_first(format!(
                    "SELECT count(*) FROM rw WHERE client = {id} AND i = {i}"
                ))
                .await
                .unwrap();
            if n != Some(1) {
                stale += 1;
            }
            reader.disconnect().await.unwrap();
        }
        stale_by_mode.push((mode, stale));
    }
    assert!(
        stale_by_mode[0].1 > 0,
        "session misses other connections' writes: {stale_by_mode:?}"
    );
    assert_eq!(
        stale_by_mode[1].1, 0,
        "user never misses: {stale_by_mode:?}"
    );
}

/// The causal token on MariaDB: `SELECT @@fulcrum_position` after a write,
/// `SET @@fulcrum_min_position` or the hint on another connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_causal_token_carries_a_write_to_another_connection() {
    tokio::task::block_in_place(cluster);
    let (_p, port) = start("");
    let mut writer = maria_connect(port).await;
    let id = 70_000;
    for i in 0..8 {
        writer
            .query_drop(format!("INSERT INTO rw VALUES ({id}, {i})"))
            .await
            .unwrap();
        let token: String = writer
            .query_first("SELECT @@fulcrum_position")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(token.split('-').count(), 3, "a GTID: {token:?}");
        let mut reader = maria_connect(port).await;
        let count = format!("SELECT count(*) FROM rw WHERE client = {id} AND i = {i}");
        let n: Option<i64> = if i % 2 == 0 {
            reader
                .query_drop(format!("SET @@fulcrum_min_position = '{token}'"))
                .await
                .unwrap();
            reader.query_first(count).await.unwrap()
        } else {
            reader
                .query_first(format!("/* fulcrum:after={token} */ {count}"))
                .await
                .unwrap()
        };
        assert_eq!(n, Some(1), "round {i}: the token's write is seen");
        reader.disconnect().await.unwrap();
    }
    let mut reader = maria_connect(port).await;
    let err = reader
        .query_drop("SET @@fulcrum_min_position = 'nope'")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("1231"), "{err}");
    let one: Option<i64> = reader.query_first("SELECT 1").await.unwrap();
    assert_eq!(one, Some(1));
}
