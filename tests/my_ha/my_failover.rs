//! Failover through Fulcrum on real MariaDB GTID clusters, as for PostgreSQL:
//! a replica killed under a read load (no client error; re-admitted after a
//! restart), and the primary killed under a write load with
//! `failover = "promote"` (semi-synchronous replication, so acknowledged
//! writes are on a replica): the most advanced replica is promoted, writes
//! resume (the figure is printed), acknowledged writes are counted on it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fulcrum_suite::{console_connect, maria_toml, serial, try_maria_connect, with_console};
use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster, APP_DB, APP_USER};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;

fn config(c: &MariaCluster, port: u16, extra: &str) -> String {
    maria_toml(
        c,
        port,
        &format!("pool_timeout = \"10s\"\nhealth_interval = \"500ms\"\n{extra}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_killed_under_reads_is_ejected_without_errors_and_readmitted() {
    let _serial = serial().await;
    let c = MariaCluster::builder()
        .replicas(2)
        .start()
        .expect("cluster");
    let port = free_port();
    let p = FulcrumProcess::start(&config(&c, port, "")).unwrap();
    let victim = &c.replicas()[0];
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut conn = try_maria_connect(port).await.expect("connect");
                let mut counts: HashMap<u16, u64> = HashMap::new();
                let mut errors = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    match conn.query_first::<u16, _>("SELECT @@port").await {
                        Ok(Some(p)) => *counts.entry(p).or_insert(0) += 1,
                        Ok(None) => errors.push("no row".to_string()),
                        Err(e) => errors.push(e.to_string()),
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                (counts, errors)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    victim.stop_immediate().unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let mut counts: HashMap<u16, u64> = HashMap::new();
    let mut errors = Vec::new();
    for t in tasks {
        let (c, e) = t.await.unwrap();
        for (port, n) in c {
            *counts.entry(port).or_insert(0) += n;
        }
        errors.extend(e);
    }
    eprintln!(
        "MariaDB reads during the kill: {counts:?}; {} errors",
        errors.len()
    );
    assert!(errors.is_empty(), "clients saw errors: {errors:?}");
    assert!(counts.get(&victim.port()).copied().unwrap_or(0) > 0);
    p.wait_for_log("backend down", Duration::from_secs(5))
        .unwrap();

    victim.start().unwrap();
    let mut conn = try_maria_connect(port).await.unwrap();
    let back = Instant::now();
    loop {
        if conn.query_first::<u16, _>("SELECT @@port").await.unwrap() == Some(victim.port()) {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(15),
            "never re-admitted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "MariaDB replica re-admitted {:?} after its restart",
        back.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_under_writes_is_replaced_by_the_most_advanced_replica() {
    let _serial = serial().await;
    let c = MariaCluster::builder()
        .replicas(2)
        .setting("rpl-semi-sync-master-enabled", "1")
        .setting("rpl-semi-sync-slave-enabled", "1")
        .setting("rpl-semi-sync-master-wait-point", "AFTER_SYNC")
        .start()
        .expect("cluster");
    c.primary()
        .sql("CREATE TABLE acked (id BIGINT PRIMARY KEY)")
        .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    // replica1 stops replicating: replica2 is the one to promote.
    let behind = &c.replicas()[0];
    behind.sql_db("mysql", "STOP SLAVE").unwrap();
    let port = free_port();
    let p = FulcrumProcess::start(&config(
        &c,
        port,
        "failover = \"promote\"\nfailover_timeout = \"2s\"",
    ))
    .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::<(u64, Instant)>::new()));
    let failed = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let (stop, acked, failed) = (stop.clone(), acked.clone(), failed.clone());
            tokio::spawn(async move {
                let mut next = w * 1_000_000;
                let mut conn: Option<Conn> = None;
                while !stop.load(Ordering::Relaxed) {
                    if conn.is_none() {
                        conn = try_maria_connect(port).await.ok();
                        if conn.is_none() {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    }
                    next += 1;
                    let sql = format!("INSERT INTO acked VALUES ({next})");
                    match conn.as_mut().unwrap().query_drop(sql).await {
                        Ok(()) => acked.lock().unwrap().push((next, Instant::now())),
                        Err(e) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            if !matches!(e, mysql_async::Error::Server(_)) {
                                conn = None;
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.primary().stop_immediate().unwrap();
    let killed = Instant::now();
    let before_kill = acked.lock().unwrap().len();
    tokio::time::sleep(Duration::from_secs(8)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }

    let new_primary = &c.replicas()[1];
    assert!(
        !new_primary.read_only().unwrap(),
        "replica2 (the most advanced) was promoted"
    );
    assert!(behind.read_only().unwrap(), "replica1 (behind) was not");
    p.wait_for_log("failover: promoted", Duration::from_secs(1))
        .unwrap();
    let acked = acked.lock().unwrap().clone();
    let resumed = acked
        .iter()
        .filter(|(_, at)| *at > killed)
        .map(|(_, at)| at.duration_since(killed))
        .min()
        .expect("writes resumed");
    let rows = new_primary.sql("SELECT id FROM acked").unwrap();
    let present: HashSet<u64> = rows.lines().filter_map(|l| l.trim().parse().ok()).collect();
    let missing: Vec<u64> = acked
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| !present.contains(id))
        .collect();
    eprintln!(
        "MariaDB: writes resumed {resumed:?} after the kill; {} acknowledged ({before_kill} before the kill), {} failed, {} missing after failover",
        acked.len(),
        failed.load(Ordering::Relaxed),
        missing.len()
    );
    assert!(
        resumed < Duration::from_secs(5),
        "writes resumed after {resumed:?}"
    );
    assert!(
        missing.is_empty(),
        "acknowledged writes lost: {} of {}",
        missing.len(),
        acked.len()
    );
    // replica1 follows the new primary once restarted replication points there.
    let want = new_primary.sql("SELECT COUNT(*) FROM acked").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while behind.sql("SELECT COUNT(*) FROM acked").unwrap() != want {
        assert!(
            Instant::now() < deadline,
            "replica1 never caught up with the new primary: {:?}",
            behind.slave_status()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `SWITCHOVER shop TO replica1` through the admin console while 4 clients
/// write: no write fails, new work is held under 2 s, every acknowledged row
/// is on the new primary, the other replica follows it, and the old primary
/// (now read-only and replicating from nobody) is `stale`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switchover_under_writes_loses_no_write() {
    let _serial = serial().await;
    let c = MariaCluster::builder()
        .replicas(2)
        .start()
        .expect("cluster");
    c.primary()
        .sql_db(APP_DB, "CREATE TABLE switched (id BIGINT PRIMARY KEY)")
        .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    let (port, admin_port) = (free_port(), free_port());
    let toml = with_console(&config(&c, port, ""), admin_port);
    let _p = FulcrumProcess::start(&toml).unwrap();
    let admin = console_connect(admin_port).await;
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(Mutex::new(Vec::<i64>::new()));
    let writers: Vec<_> = (0..4i64)
        .map(|w| {
            let (stop, failed, acked) = (stop.clone(), failed.clone(), acked.clone());
            tokio::spawn(async move {
                let mut conn = try_maria_connect(port).await.expect("connect");
                let mut id = w * 1_000_000;
                while !stop.load(Ordering::Relaxed) {
                    id += 1;
                    match conn
                        .query_drop(format!("INSERT INTO switched VALUES ({id})"))
                        .await
                    {
                        Ok(()) => acked.lock().unwrap().push(id),
                        Err(e) => {
                            eprintln!("failed: {e}");
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let target = &c.replicas()[0];
    let msgs = admin
        .simple_query(&format!("SWITCHOVER shop TO {}", target.addr()))
        .await
        .expect("switchover");
    let held: u64 = msgs
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(2).map(|v| v.parse().unwrap()),
            _ => None,
        })
        .expect("a row");
    tokio::time::sleep(Duration::from_millis(800)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    eprintln!(
        "MariaDB switchover held new work for {held} ms; {} writes acknowledged, {} failed",
        acked.len(),
        failed.load(Ordering::Relaxed)
    );
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no write failed");
    assert!(held < 2000, "writes held {held} ms");
    let on_new: usize = target
        .sql_db(APP_DB, "SELECT count(*) FROM switched")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        on_new,
        acked.len(),
        "every acknowledged write is on the new primary"
    );
    // Writes after the switchover landed there (the old primary is read-only).
    let old_count: usize = c
        .primary()
        .sql_db(APP_DB, "SELECT count(*) FROM switched")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        old_count < acked.len(),
        "later writes went to the new primary"
    );
    // The other replica follows the new primary.
    let other = &c.replicas()[1];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n: usize = other
            .sql_db(APP_DB, "SELECT count(*) FROM switched")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        if n == acked.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replica2 has {n} of {} rows",
            acked.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let msgs = admin.simple_query("SHOW CLUSTERS").await.unwrap();
        let old_state = msgs.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r)
                if r.get(2) == Some(c.primary().addr().as_str()) =>
            {
                r.get(4).map(str::to_owned)
            }
            _ => None,
        });
        if old_state.as_deref() == Some("stale") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "old primary is {old_state:?}, not stale"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_in_flight_when_its_server_dies_may_have_committed() {
    let _serial = serial().await;
    // Its own one-node cluster: the test kills its server.
    let c = MariaCluster::builder()
        .replicas(0)
        .start()
        .expect("MariaDB cluster");
    c.primary()
        .sql_db(
            APP_DB,
            &format!(
                "CREATE TABLE slow_write (id INT); GRANT ALL ON {APP_DB}.* TO '{APP_USER}'@'%'"
            ),
        )
        .expect("table");
    let port = free_port();
    let _fulcrum = FulcrumProcess::start(&config(&c, port, "")).expect("fulcrum");
    let mut conn = try_maria_connect(port).await.expect("connect");
    let write = tokio::spawn(async move {
        // An autocommit write that takes a while: the server dies under it.
        let r = conn
            .query_drop("INSERT INTO slow_write SELECT 1 FROM DUAL WHERE SLEEP(5) = 0")
            .await;
        (conn, r)
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let pid = c.primary().pid().expect("mariadbd pid");
    std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    let (_conn, r) = tokio::time::timeout(Duration::from_secs(20), write)
        .await
        .expect("an answer, not a wait without end")
        .unwrap();
    match r {
        Err(mysql_async::Error::Server(e)) => {
            assert_eq!(e.state, "08007", "transaction resolution unknown: {e:?}");
            assert!(e.message.contains("may or may not have committed"), "{e:?}");
        }
        other => panic!("expected 08007 from Fulcrum, got {other:?}"),
    }
}
