//! Health checks, replication lag and failover on real clusters: a replica
//! killed under a read load, a replica made to lag, the primary killed under
//! a write load with `failover = "promote"` (synchronous standby, every
//! acknowledged write counted afterwards, the old primary fenced when it
//! returns), and `failover = "follow"` after an external promotion.
//!
//! Each test wrecks its own cluster; they run one at a time (a lock, shared
//! with the binary's other tests that kill servers: `fulcrum_suite::serial`)
//! so their timings are not distorted by each other on a small machine.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fulcrum_suite::{serial, try_pg_connect, try_scrape, with_metrics, PgProxyConfig};
use fulcrum_testkit::{FulcrumProcess, PgCluster, PgNode, APP_DB};
use tokio_postgres::{Client, SimpleQueryMessage};

/// Fulcrum in front of `c`, probing as the superuser (promotion needs it).
pub(crate) fn config(c: &PgCluster, extra: &[&str]) -> PgProxyConfig {
    let mut cfg = PgProxyConfig::new(&c.primary().addr()).client_auth("md5");
    for r in c.replicas() {
        cfg = cfg.replica(&r.addr());
    }
    cfg = cfg
        .extra("health_user = \"postgres\"")
        .extra("health_password = \"\"");
    if !extra.iter().any(|e| e.starts_with("pool_timeout")) {
        cfg = cfg.extra("pool_timeout = \"10s\"");
    }
    for e in extra {
        cfg = cfg.extra(e);
    }
    cfg
}

async fn port_of(client: &Client, sql: &str) -> Result<u16, tokio_postgres::Error> {
    let msgs = client.simple_query(sql).await?;
    Ok(msgs
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(|p| p.parse().unwrap()),
            _ => None,
        })
        .expect("a row"))
}

fn scalar(node: &PgNode, sql: &str) -> String {
    node.sql_db(APP_DB, sql).unwrap().trim().to_string()
}

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
