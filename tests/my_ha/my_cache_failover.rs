//! The result cache's binlog stream across a failover (issue 46), as
//! `tests/pg_ha/pg_cache_failover.rs` for PostgreSQL: a MariaDB primary and
//! one GTID replica, `[cluster.cache] mode = "rules", invalidation =
//! "stream"` with a rule on one table, `failover = "promote"`. A direct
//! write on the primary is read through Fulcrum within a second; then the
//! replica stops replicating and a last direct write (lost with the
//! primary) is read and kept. The primary is killed and Fulcrum promotes
//! the replica: every read through Fulcrum gives the new primary's value,
//! never the lost write the entry held (the new stream starts at the new
//! primary's binlog end and never speaks of it: only the entries dropped
//! when the old stream was lost keep it out); the cache serves again (its
//! hits rise) once the stream is up on the new primary's binlog, and direct
//! writes there are read within a second. The delays are printed.
//!
//! It wrecks its own cluster, so it takes its turn (`fulcrum_suite::serial`).

use std::time::{Duration, Instant};

use fulcrum_suite::{family_sum, maria_opts, maria_toml, serial, try_scrape, with_metrics};
use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster, MariaNode, APP_DB};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;

const READ: &str = "SELECT v FROM cf_t WHERE id = 1";
/// A statement that takes longer than this fails the test.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// `fulcrum_cache_hits_total` of the instance whose metrics are on `port`.
fn hits(port: u16) -> f64 {
    try_scrape(port).map_or(0.0, |t| family_sum(&t, "fulcrum_cache_hits_total", &[]))
}

/// A login on `port` (Fulcrum's, or a server's directly).
async fn connect(port: u16) -> Result<Conn, String> {
    tokio::time::timeout(CALL_TIMEOUT, Conn::new(maria_opts(port)))
        .await
        .map_err(|_| format!("no login in {CALL_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())
}

/// `READ`'s value through `conn`, or the error (a read may fail while the
/// primary is being replaced; the connection is then made again).
async fn read(conn: &mut Option<Conn>, port: u16) -> Result<i64, String> {
    if conn.is_none() {
        *conn = Some(connect(port).await?);
    }
    let answer = tokio::time::timeout(CALL_TIMEOUT, conn.as_mut().unwrap().query_first(READ))
        .await
        .map_err(|_| format!("no answer in {CALL_TIMEOUT:?}"))
        .and_then(|r| r.map_err(|e| e.to_string()));
    match answer {
        Ok(Some(v)) => Ok(v),
        Ok(None) => Err("no row".into()),
        Err(e) => {
            *conn = None;
            Err(e)
        }
    }
}

/// Reads until one is answered from the cache (the hit counter rises
/// across it); every answer must be `want` (a read that fails is tried
/// again, and counted).
async fn until_kept(conn: &mut Option<Conn>, port: u16, metrics: u16, want: i64) {
    let start = Instant::now();
    let mut errors = Vec::new();
    loop {
        let before = tokio::task::block_in_place(|| hits(metrics));
        match read(conn, port).await {
            Ok(v) => assert_eq!(v, want, "a read while waiting for a hit"),
            Err(e) => errors.push(e),
        }
        if tokio::task::block_in_place(|| hits(metrics)) > before {
            if !errors.is_empty() {
                eprintln!("reads that failed before a hit: {errors:?}");
            }
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no read answered from the cache within 10 s (failed reads: {errors:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads until `want` is read; how long that took. Panics after 1 s.
async fn until_seen(conn: &mut Option<Conn>, port: u16, want: i64, what: &str) -> Duration {
    let start = Instant::now();
    let mut errors = Vec::new();
    loop {
        match read(conn, port).await {
            Ok(v) if v == want => break,
            Ok(_) => {}
            Err(e) => errors.push(e),
        }
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{what}: {want} not read through Fulcrum within 1 s (failed reads: {errors:?})"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    if !errors.is_empty() {
        eprintln!("{what}: reads that failed before {want} was read: {errors:?}");
    }
    start.elapsed()
}

/// Sets `v` directly on `node` (not through Fulcrum) with `conn`, a login
/// there; returns when the server has answered the commit.
async fn set_v(conn: &mut Conn, node: &MariaNode, v: i64) {
    let sql = format!("UPDATE cf_t SET v = {v} WHERE id = 1");
    tokio::time::timeout(CALL_TIMEOUT, conn.query_drop(&sql))
        .await
        .expect("bounded")
        .unwrap_or_else(|e| panic!("{sql} on {}: {e}", node.name()));
    assert_eq!(conn.affected_rows(), 1, "{sql}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_moves_the_cache_binlog_stream_to_the_new_primary() {
    let _serial = serial().await;
    let c = tokio::task::block_in_place(|| MariaCluster::builder().replicas(1).start())
        .expect("cluster");
    c.primary()
        .sql_db(
            APP_DB,
            "CREATE TABLE cf_t (id INT PRIMARY KEY, v BIGINT); INSERT INTO cf_t VALUES (1, 0)",
        )
        .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    let (port, metrics) = (free_port(), free_port());
    let toml = maria_toml(
        &c,
        port,
        "pool_timeout = \"10s\"\nhealth_interval = \"300ms\"\nfailover = \"promote\"\n\
         failover_timeout = \"1s\"\n\
         cache = { mode = \"rules\", invalidation = \"stream\", rule = [{ tables = [\"cf_t\"] }] }",
    );
    let p = tokio::task::block_in_place(|| FulcrumProcess::start(&with_metrics(&toml, metrics)))
        .unwrap();
    let mut client = None;

    // Before: kept, and a direct write on the primary seen within 1 s.
    until_kept(&mut client, port, metrics, 0).await;
    let mut old = connect(c.primary().port()).await.expect("direct login");
    set_v(&mut old, c.primary(), 1).await;
    let before = until_seen(&mut client, port, 1, "on the old primary").await;
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();

    // The replica stops replicating: the next write (v = 2) is lost with
    // the primary, as an asynchronous replica's last commits are. It is
    // read through Fulcrum and kept.
    let replica = &c.replicas()[0];
    replica.sql_db("mysql", "STOP SLAVE").unwrap();
    set_v(&mut old, c.primary(), 2).await;
    until_seen(&mut client, port, 2, "the write the replica lacks").await;
    until_kept(&mut client, port, metrics, 2).await;
    let on_replica = replica
        .sql_db(APP_DB, "SELECT v FROM cf_t WHERE id = 1")
        .unwrap();
    assert_eq!(on_replica.trim(), "1");
    drop(old);

    // The primary killed with the entry (v = 2) kept; Fulcrum promotes the
    // replica, where v is 1.
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    let killed = Instant::now();
    let new = replica;
    loop {
        if tokio::task::block_in_place(|| new.read_only()).is_ok_and(|r| !r) {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "the replica was never promoted:\n{}",
            p.log_contents()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let promoted = killed.elapsed();
    // The new primary's value, never the lost write the entry held, until
    // and after the cache serves again (the new stream starts at the new
    // primary's binlog end and never speaks of v = 2: only dropping the
    // entries when the old stream was lost does).
    until_kept(&mut client, port, metrics, 1).await;
    let serving = killed.elapsed();
    assert_eq!(read(&mut client, port).await, Ok(1));

    // A direct write on the new primary: seen within 1 s, and so for 10 more.
    let mut fresh = connect(new.port()).await.expect("direct login");
    set_v(&mut fresh, new, 3).await;
    let first = until_seen(&mut client, port, 3, "first on the new primary").await;
    let mut worst = first;
    let mut current = 3;
    for i in 0..10 {
        until_kept(&mut client, port, metrics, current).await;
        current = 10 + i;
        set_v(&mut fresh, new, current).await;
        let what = format!("round {i} on the new primary");
        worst = worst.max(until_seen(&mut client, port, current, &what).await);
    }
    eprintln!(
        "MariaDB cache across a failover: a direct write seen in {before:?} before it; primary \
         killed, replica promoted {promoted:?} later (test's view), the cache serving again \
         {serving:?} after the kill; 11 direct writes on the new primary seen within {worst:?} \
         at worst (the first in {first:?})"
    );
    assert!(
        p.log_contents().contains("cache binlog stream up"),
        "{}",
        p.log_contents()
    );
}
