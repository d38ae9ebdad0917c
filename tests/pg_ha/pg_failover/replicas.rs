//! Replicas under read load: one killed is ejected without errors and
//! readmitted, one lagging gets no reads until it catches up.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fulcrum_suite::{serial, try_pg_connect, PgProxyConfig};
use fulcrum_testkit::{FulcrumProcess, PgCluster, APP_DB};

use super::helpers::{config, port_of, scalar};

/// Reads per server port, and the errors seen.
type ReadTally = (HashMap<u16, u64>, Vec<String>);

/// `clients` connections reading `SELECT inet_server_port()` in a loop until
/// `stop`; returns per-port counts and the errors seen.
fn read_load(
    cfg: &PgProxyConfig,
    clients: usize,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<ReadTally>> {
    (0..clients)
        .map(|_| {
            let cfg = cfg.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut counts = HashMap::new();
                let mut errors = Vec::new();
                let client = try_pg_connect(&cfg).await.expect("connect");
                while !stop.load(Ordering::Relaxed) {
                    match port_of(&client, "SELECT inet_server_port()").await {
                        Ok(p) => *counts.entry(p).or_insert(0) += 1,
                        Err(e) => errors.push(format!("{e:?}")),
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                (counts, errors)
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_killed_under_read_load_is_ejected_without_errors_and_readmitted() {
    let _serial = serial().await;
    let c = PgCluster::builder().replicas(2).start().expect("cluster");
    let cfg = config(&c, &["health_interval = \"500ms\""]);
    let p = FulcrumProcess::start(&cfg.to_toml()).unwrap();
    let victim = &c.replicas()[0];
    let stop = Arc::new(AtomicBool::new(false));
    let probe = try_pg_connect(&cfg).await.unwrap();
    let mut before = Vec::new();
    for _ in 0..10 {
        before.push(port_of(&probe, "SELECT inet_server_port()").await.unwrap());
    }
    eprintln!("victim {} reads before the load: {before:?}", victim.port());
    let load = read_load(&cfg, 8, stop.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    victim.stop_immediate().unwrap();
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let mut counts: HashMap<u16, u64> = HashMap::new();
    let mut errors = Vec::new();
    for t in load {
        let (c, e) = t.await.unwrap();
        for (port, n) in c {
            *counts.entry(port).or_insert(0) += n;
        }
        errors.extend(e);
    }
    eprintln!("reads during the kill: {counts:?}; {} errors", errors.len());
    assert!(errors.is_empty(), "clients saw errors: {errors:?}");
    assert!(
        counts.get(&victim.port()).copied().unwrap_or(0) > 0,
        "the victim served reads before the kill"
    );
    p.wait_for_log("backend down", Duration::from_secs(5))
        .unwrap();
    eprintln!("victim marked down {:?} after the kill", killed.elapsed());

    // After a restart, it serves reads again.
    victim.start().unwrap();
    let client = try_pg_connect(&cfg).await.unwrap();
    let back = Instant::now();
    loop {
        if port_of(&client, "SELECT inet_server_port()").await.unwrap() == victim.port() {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(15),
            "the restarted replica never got reads back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("restarted replica readmitted after {:?}", back.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_gets_no_reads_until_it_catches_up() {
    let _serial = serial().await;
    let c = PgCluster::builder().replicas(2).start().expect("cluster");
    c.primary()
        .sql_db(APP_DB, "CREATE TABLE ticks (n int)")
        .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    let slow = &c.replicas()[0];
    let fast = &c.replicas()[1];
    slow.sql("ALTER SYSTEM SET recovery_min_apply_delay = '4s'")
        .unwrap();
    slow.sql("SELECT pg_reload_conf()").unwrap();
    let cfg = config(&c, &["health_interval = \"300ms\"", "max_lag = \"1s\""]);
    let p = FulcrumProcess::start(&cfg.to_toml()).unwrap();
    let client = try_pg_connect(&cfg).await.unwrap();
    // Writes keep the slow replica's apply queue non-empty: its lag grows.
    let writing = Arc::new(AtomicBool::new(true));
    let writer = {
        let cfg = cfg.clone();
        let writing = writing.clone();
        tokio::spawn(async move {
            let w = try_pg_connect(&cfg).await.unwrap();
            while writing.load(Ordering::Relaxed) {
                w.simple_query("INSERT INTO ticks VALUES (1)")
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    p.wait_for_log("replica over max_lag", Duration::from_secs(15))
        .unwrap();
    let mut seen = HashSet::new();
    for _ in 0..40 {
        seen.insert(port_of(&client, "SELECT inet_server_port()").await.unwrap());
    }
    assert_eq!(
        seen,
        HashSet::from([fast.port()]),
        "only the replica within max_lag serves reads"
    );
    // The lag is real: the slow replica has not applied what the fast one has.
    let behind: i64 = scalar(fast, "SELECT count(*) FROM ticks")
        .parse::<i64>()
        .unwrap()
        - scalar(slow, "SELECT count(*) FROM ticks")
            .parse::<i64>()
            .unwrap();
    assert!(behind > 0, "slow replica is behind by {behind} rows");

    writing.store(false, Ordering::Relaxed);
    writer.await.unwrap();
    slow.sql("ALTER SYSTEM RESET recovery_min_apply_delay")
        .unwrap();
    slow.sql("SELECT pg_reload_conf()").unwrap();
    p.wait_for_log("replica caught up", Duration::from_secs(20))
        .unwrap();
    let mut seen = HashSet::new();
    for _ in 0..20 {
        seen.insert(port_of(&client, "SELECT inet_server_port()").await.unwrap());
    }
    assert!(
        seen.contains(&slow.port()),
        "caught-up replica serves reads again: {seen:?}"
    );
}
