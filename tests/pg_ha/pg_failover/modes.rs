//! Failover modes and limits: `follow` finds a replica promoted by someone
//! else, `none` keeps reads going and waits for the same primary, and no
//! replica beyond `failover_max_lag` is promoted.

use std::time::{Duration, Instant};

use fulcrum_suite::{serial, try_pg_connect, try_scrape, with_metrics};
use fulcrum_testkit::{FulcrumProcess, PgCluster, APP_DB};

use super::helpers::{config, port_of, scalar};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_finds_a_replica_promoted_by_someone_else() {
    let _serial = serial().await;
    let c = PgCluster::builder().replicas(1).start().expect("cluster");
    let cfg = config(
        &c,
        &["health_interval = \"300ms\"", "failover = \"follow\""],
    );
    let _p = FulcrumProcess::start(&cfg.to_toml()).unwrap();
    let client = try_pg_connect(&cfg).await.unwrap();
    let hint = "/* fulcrum:primary */ SELECT inet_server_port()";
    assert_eq!(port_of(&client, hint).await.unwrap(), c.primary().port());
    c.primary().stop_immediate().unwrap();
    let replica = &c.replicas()[0];
    replica.promote().unwrap();
    let start = Instant::now();
    loop {
        // A failed attempt is fine while Fulcrum notices; it must end well.
        if let Ok(port) = port_of(&client, hint).await {
            assert_eq!(port, replica.port());
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "writes never moved to the promoted replica"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "follow: writes on the promoted replica {:?} after promotion",
        start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn none_keeps_reads_going_and_waits_for_the_same_primary() {
    let _serial = serial().await;
    let c = PgCluster::builder().replicas(1).start().expect("cluster");
    c.primary()
        .sql_db(APP_DB, "CREATE TABLE waits (n int)")
        .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    let cfg = config(
        &c,
        &[
            "health_interval = \"300ms\"",
            "failover = \"none\"",
            "pool_timeout = \"1s\"",
        ],
    );
    let p = FulcrumProcess::start(&cfg.to_toml()).unwrap();
    let client = try_pg_connect(&cfg).await.unwrap();
    client
        .simple_query("INSERT INTO waits VALUES (1)")
        .await
        .unwrap();
    // The replica has the client's write, so its reads may go there under
    // consistency = "session" (with the write missing on the replica they
    // would wait for a primary instead: no stale read; docs/consistency.md).
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    c.primary().stop_immediate().unwrap();
    p.wait_for_log("backend down", Duration::from_secs(5))
        .unwrap();
    // Reads go on from the replica; writes have nowhere to go.
    for _ in 0..10 {
        assert_eq!(
            port_of(&client, "SELECT inet_server_port()").await.unwrap(),
            c.replicas()[0].port()
        );
    }
    let writer = try_pg_connect(&cfg).await.unwrap();
    let err = writer
        .simple_query("INSERT INTO waits VALUES (2)")
        .await
        .unwrap_err();
    assert!(format!("{err:?}").contains("08006"), "{err:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        c.replicas()[0].is_in_recovery().unwrap(),
        "none never promotes"
    );
    // The same primary comes back and takes writes again.
    c.primary().start().unwrap();
    let back = Instant::now();
    loop {
        if let Ok(w) = try_pg_connect(&cfg).await {
            if w.simple_query("INSERT INTO waits VALUES (3)").await.is_ok() {
                break;
            }
        }
        assert!(
            back.elapsed() < Duration::from_secs(15),
            "writes never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "none: writes back {:?} after the primary restarted",
        back.elapsed()
    );
}

/// `fulcrum_failover_blocked` from a scrape of `/metrics` on `port`.
fn failover_blocked_gauge(port: u16) -> Option<String> {
    try_scrape(port)?
        .lines()
        .find(|l| l.starts_with("fulcrum_failover_blocked{"))
        .and_then(|l| l.rsplit(' ').next().map(str::to_owned))
}

/// `failover_max_lag`: with replay paused on the only replica and the
/// primary lost, Fulcrum does not promote a replica that much behind (the
/// gauge says so, the log says why); once replay resumes and the replica
/// has caught up, it promotes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_promotion_of_a_replica_beyond_failover_max_lag() {
    let _s = serial().await;
    let c = tokio::task::block_in_place(|| PgCluster::builder().replicas(1).start()).unwrap();
    let metrics_port = fulcrum_testkit::free_port();
    let cfg = config(
        &c,
        &[
            "health_interval = \"200ms\"",
            "failover = \"promote\"",
            "failover_timeout = \"1s\"",
            "failover_max_lag = \"1MB\"",
        ],
    );
    let p = FulcrumProcess::start(&with_metrics(&cfg.to_toml(), metrics_port)).unwrap();
    let replica = &c.replicas()[0];
    scalar(replica, "SELECT pg_wal_replay_pause()");
    // About 4 MB of WAL the replica receives but does not replay.
    c.primary()
        .sql_db(
            APP_DB,
            "CREATE TABLE lag_fill AS SELECT g, repeat('x', 20) AS pad FROM generate_series(1, 60000) g",
        )
        .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await; // the loop sees the new position
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while failover_blocked_gauge(metrics_port).as_deref() != Some("1") {
        assert!(
            Instant::now() < deadline,
            "never blocked:\n{}",
            p.log_contents()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        scalar(replica, "SELECT pg_is_in_recovery()"),
        "t",
        "not promoted"
    );
    assert!(
        p.log_contents().contains("not promoting") && p.log_contents().contains("failover_max_lag"),
        "{}",
        p.log_contents()
    );
    // Replay resumes: caught up, the replica is promoted.
    scalar(replica, "SELECT pg_wal_replay_resume()");
    let deadline = Instant::now() + Duration::from_secs(20);
    while scalar(replica, "SELECT pg_is_in_recovery()") != "f" {
        assert!(
            Instant::now() < deadline,
            "not promoted after catching up:\n{}",
            p.log_contents()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(failover_blocked_gauge(metrics_port).as_deref(), Some("0"));
}
