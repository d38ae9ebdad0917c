//! A primary killed: under writes it is replaced by the most advanced
//! replica, and a listener hears notifications sent after the kill.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fulcrum_suite::{serial, try_pg_connect, try_scrape, with_metrics, PgProxyConfig};
use fulcrum_testkit::{FulcrumProcess, PgCluster, PgNode, APP_DB};
use tokio_postgres::Client;

use super::helpers::{config, port_of, scalar};

/// Waits until `cond` holds, polling; panics with `what` after `timeout`.
fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    start.elapsed()
}

/// Writers inserting unique ids through Fulcrum until `stop`; each acked id
/// is recorded. Errors make the writer reconnect if its connection is gone.
fn write_load(
    cfg: &PgProxyConfig,
    writers: u64,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<(u64, Instant)>>>,
    failed: Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..writers)
        .map(|w| {
            let (cfg, stop, acked, failed) =
                (cfg.clone(), stop.clone(), acked.clone(), failed.clone());
            tokio::spawn(async move {
                let mut next = w * 1_000_000;
                let mut client = None;
                while !stop.load(Ordering::Relaxed) {
                    if client.as_ref().is_none_or(|c: &Client| c.is_closed()) {
                        client = try_pg_connect(&cfg).await.ok();
                        if client.is_none() {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    }
                    next += 1;
                    let sql = format!("INSERT INTO acked VALUES ({next})");
                    match client.as_ref().unwrap().simple_query(&sql).await {
                        Ok(_) => acked.lock().unwrap().push((next, Instant::now())),
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_under_writes_is_replaced_by_the_most_advanced_replica() {
    let _serial = serial().await;
    let c = PgCluster::builder()
        .replicas(2)
        .synchronous_standby(true)
        .start()
        .expect("cluster");
    c.primary()
        .sql_db(APP_DB, "CREATE TABLE acked (id bigint PRIMARY KEY)")
        .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    // replica1 stops streaming: when the primary dies it is behind, so the
    // right choice is replica2 (a tie would have gone to replica1).
    let behind = &c.replicas()[0];
    behind
        .sql("ALTER SYSTEM SET primary_conninfo = ''")
        .unwrap();
    behind.sql("SELECT pg_reload_conf()").unwrap();
    let marker = std::env::temp_dir().join(format!("fulcrum-failover-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let command = format!(
        "failover_command = \"echo '%d %h:%p %m %H:%r %c' > {}\"",
        marker.display()
    );
    let cfg = config(
        &c,
        &[
            "health_interval = \"500ms\"",
            "failover = \"promote\"",
            "failover_timeout = \"2s\"",
            &command,
        ],
    );
    let p = FulcrumProcess::start(&cfg.to_toml()).unwrap();

    // A client in a transaction on the primary when it dies.
    let in_txn = try_pg_connect(&cfg).await.unwrap();
    in_txn
        .batch_execute("BEGIN; INSERT INTO acked VALUES (-1)")
        .await
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let failed = Arc::new(AtomicU64::new(0));
    let load = write_load(&cfg, 4, stop.clone(), acked.clone(), failed.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;

    c.primary().stop_immediate().unwrap();
    let killed = Instant::now();
    let acked_before_kill = acked.lock().unwrap().len();
    // What each replica had received when the primary died.
    let received: Vec<String> = c
        .replicas()
        .iter()
        .map(|r| scalar(r, "SELECT pg_last_wal_receive_lsn() - '0/0'"))
        .collect();

    // The open transaction fails with 08006, is never moved; after ROLLBACK
    // the same client's next transaction goes to the new primary.
    let err = in_txn
        .simple_query("INSERT INTO acked VALUES (-2)")
        .await
        .unwrap_err();
    assert_eq!(
        err.code().map(|c| c.code()),
        Some("08006"),
        "error in the dead transaction: {err:?}"
    );
    let err = in_txn.simple_query("SELECT 1").await.unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("25P02"), "{err:?}");
    in_txn.batch_execute("ROLLBACK").await.unwrap();

    tokio::time::sleep(Duration::from_secs(8)).await;
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.await.unwrap();
    }
    in_txn
        .batch_execute("INSERT INTO acked VALUES (-3)")
        .await
        .unwrap();

    let promoted: Vec<&PgNode> = c
        .replicas()
        .iter()
        .filter(|r| !r.is_in_recovery().unwrap())
        .collect();
    assert_eq!(promoted.len(), 1, "exactly one replica promoted");
    let new_primary = promoted[0];
    let idx = c
        .replicas()
        .iter()
        .position(|r| r.port() == new_primary.port())
        .unwrap();
    let positions: Vec<u64> = received.iter().map(|s| s.parse().unwrap()).collect();
    eprintln!(
        "received positions at the kill: {positions:?}; promoted replica{}",
        idx + 1
    );
    assert!(
        positions[0] < positions[1],
        "replica1 was really behind: {positions:?}"
    );
    assert_eq!(idx, 1, "the most advanced replica (replica2) was promoted");

    // failover_command ran with the placeholders filled in.
    wait_until("failover_command's output", Duration::from_secs(10), || {
        std::fs::read_to_string(&marker).is_ok_and(|t| !t.is_empty())
    });
    let told = std::fs::read_to_string(&marker).unwrap();
    let _ = std::fs::remove_file(&marker);
    assert_eq!(
        told.trim(),
        format!(
            "0 127.0.0.1:{} 2 127.0.0.1:{} main",
            c.primary().port(),
            new_primary.port()
        )
    );

    let acked = acked.lock().unwrap().clone();
    let first_after = acked
        .iter()
        .filter(|(_, at)| *at > killed)
        .map(|(_, at)| at.duration_since(killed))
        .min()
        .expect("writes resumed after the kill");
    eprintln!(
        "writes resumed {first_after:?} after the kill; {} writes acknowledged ({} before the kill), {} failed",
        acked.len(),
        acked_before_kill,
        failed.load(Ordering::Relaxed)
    );
    assert!(
        first_after < Duration::from_secs(5),
        "writes resumed after {first_after:?}"
    );

    // Every acknowledged write is on the new primary.
    let rows = new_primary.sql_db(APP_DB, "SELECT id FROM acked").unwrap();
    let present: HashSet<i64> = rows.lines().filter_map(|l| l.trim().parse().ok()).collect();
    let missing: Vec<u64> = acked
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| !present.contains(&(*id as i64)))
        .collect();
    eprintln!(
        "{} acknowledged writes, {} missing after failover",
        acked.len(),
        missing.len()
    );
    assert!(missing.is_empty(), "acknowledged writes lost: {missing:?}");
    assert!(present.contains(&-3) && !present.contains(&-1) && !present.contains(&-2));

    // The other replica follows the new primary.
    let other = behind;
    let want = scalar(new_primary, "SELECT count(*) FROM acked");
    wait_until(
        "the other replica to follow the new primary",
        Duration::from_secs(30),
        || {
            other
                .sql_db(APP_DB, "SELECT count(*) FROM acked")
                .is_ok_and(|n| n.trim() == want)
        },
    );

    // The old primary comes back writable, on the old timeline: fenced.
    c.primary().start().unwrap();
    p.wait_for_log("backend fenced (stale)", Duration::from_secs(10))
        .unwrap();
    let client = try_pg_connect(&cfg).await.unwrap();
    for _ in 0..20 {
        let port = port_of(&client, "SELECT inet_server_port()").await.unwrap();
        assert_ne!(port, c.primary().port(), "a fenced node serves no reads");
    }
    let port = port_of(&client, "/* fulcrum:primary */ SELECT inet_server_port()")
        .await
        .unwrap();
    assert_eq!(port, new_primary.port(), "writes stay on the new primary");
    c.primary().stop_immediate().unwrap();
}

/// LISTEN through transaction pooling across a failover: Fulcrum's
/// listening connection moves to the promoted replica and listens again
/// (`fulcrum_listen_reconnects_total`), so a client that listened before the
/// primary was killed hears what is notified after. (What was notified in
/// between is lost, as across a server restart: the writer sends again
/// until one arrives.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_hears_notifications_sent_after_the_primary_is_killed() {
    use futures_util::StreamExt;
    let _serial = serial().await;
    let c = PgCluster::builder().replicas(1).start().expect("cluster");
    let cfg = config(
        &c,
        &[
            "health_interval = \"300ms\"",
            "failover = \"promote\"",
            "failover_timeout = \"1s\"",
        ],
    );
    let metrics = fulcrum_testkit::free_port();
    let _p = FulcrumProcess::start(&with_metrics(&cfg.to_toml(), metrics)).unwrap();
    let conn_string = cfg.conn_string(fulcrum_testkit::APP_USER, APP_DB);
    let (listener, mut connection) = tokio_postgres::connect(&conn_string, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    listener.batch_execute("LISTEN ha_ch").await.unwrap();
    let writer = try_pg_connect(&cfg).await.unwrap();
    writer
        .batch_execute("NOTIFY ha_ch, 'before'")
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), heard.recv()).await;
    assert_eq!(first.ok().flatten().as_deref(), Some("before"));

    c.primary().stop_immediate().unwrap();
    let start = Instant::now();
    let mut sent = 0;
    loop {
        // Refused while there is no primary; sent again until one is heard.
        if writer.batch_execute("NOTIFY ha_ch, 'after'").await.is_ok() {
            sent += 1;
        }
        if let Ok(Some(p)) = tokio::time::timeout(Duration::from_millis(300), heard.recv()).await {
            assert_eq!(p, "after");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "nothing heard after the failover ({sent} notifications sent)"
        );
    }
    eprintln!(
        "listener: heard a notification {:?} after the primary was killed ({sent} sent)",
        start.elapsed()
    );
    let reconnects = try_scrape(metrics)
        .map(|t| fulcrum_suite::family_sum(&t, "fulcrum_listen_reconnects_total", &[]))
        .unwrap_or_default();
    assert!(reconnects >= 1.0, "reconnects counted: {reconnects}");
    // The listening client itself never lost its session.
    listener.batch_execute("SELECT 1").await.unwrap();
}
