//! The result cache's change stream across a failover (issue 46): a
//! primary and one replica, `[cluster.cache] mode = "rules", invalidation =
//! "stream"` with a rule on one table, `failover = "promote"`. A direct
//! write on the primary (not through Fulcrum) is read through Fulcrum
//! within a second; then the replica stops streaming, and a last direct
//! write (one the replica never gets, as an asynchronous standby loses its
//! last commits with the primary) is read and kept. The primary is killed
//! and Fulcrum promotes the replica: every read through Fulcrum gives the
//! new primary's value, never the lost write the entry held, while the
//! cache comes back and after (the new stream, made after the failover,
//! never speaks of that write: only the entries dropped when the old stream
//! was lost keep it out); the cache serves again (its hits rise) once the
//! stream is up on the new primary, and direct writes there are read within
//! a second. The delays are printed.
//!
//! It wrecks its own cluster, so it takes its turn (`fulcrum_suite::serial`).

use std::time::{Duration, Instant};

use fulcrum_suite::{family_sum, pg_connect_str, serial, try_pg_connect, try_scrape, with_metrics};
use fulcrum_testkit::{free_port, FulcrumProcess, PgCluster, PgNode, APP_DB, SUPERUSER};
use tokio_postgres::{Client, SimpleQueryMessage};

const READ: &str = "SELECT v FROM cf_t WHERE id = 1";
/// A statement that takes longer than this fails the test.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// `fulcrum_cache_hits_total` of the instance whose metrics are on `port`.
fn hits(port: u16) -> f64 {
    try_scrape(port).map_or(0.0, |t| family_sum(&t, "fulcrum_cache_hits_total", &[]))
}

/// `READ`'s value through `client`, or the error (a read may fail while the
/// primary is being replaced).
async fn read(client: &Client) -> Result<String, String> {
    let answer = tokio::time::timeout(CALL_TIMEOUT, client.simple_query(READ))
        .await
        .map_err(|_| format!("no answer in {CALL_TIMEOUT:?}"))?
        .map_err(|e| format!("{e} {:?}", e.as_db_error()))?;
    Ok(answer
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap_or_default())
}

/// Reads until one is answered from the cache (the hit counter rises
/// across it); every answer must be `want` (a read that fails is tried
/// again, and counted). Returns how long that took.
async fn until_kept(client: &Client, metrics: u16, want: &str, within: Duration) -> Duration {
    let start = Instant::now();
    let mut errors = Vec::new();
    loop {
        let before = tokio::task::block_in_place(|| hits(metrics));
        let got = read(client).await;
        let after = tokio::task::block_in_place(|| hits(metrics));
        match got {
            Ok(v) => assert_eq!(v, want, "a read while waiting for a hit"),
            Err(e) => errors.push(e),
        }
        if after > before {
            if !errors.is_empty() {
                eprintln!("reads that failed before a hit: {errors:?}");
            }
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "no read answered from the cache within {within:?} (failed reads: {errors:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads until `want` is read; returns how long that took (a read that
/// fails meanwhile is tried again). Panics after `within`.
async fn until_seen(client: &Client, want: &str, within: Duration, what: &str) -> Duration {
    let start = Instant::now();
    let mut errors = 0;
    loop {
        match read(client).await {
            Ok(v) if v == want => break,
            Ok(_) => {}
            Err(_) => errors += 1,
        }
        assert!(
            start.elapsed() < within,
            "{what}: {want} not read through Fulcrum within {within:?} ({errors} reads failed)"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    if errors > 0 {
        eprintln!("{what}: {errors} reads failed before {want} was read");
    }
    start.elapsed()
}

fn scalar(node: &PgNode, sql: &str) -> String {
    node.sql_db(APP_DB, sql).unwrap().trim().to_string()
}

/// A superuser connection straight to `node` (not through Fulcrum).
async fn direct(node: &PgNode) -> Client {
    pg_connect_str(&format!(
        "host=127.0.0.1 port={} user={SUPERUSER} dbname={APP_DB}",
        node.port()
    ))
    .await
    .expect("a direct connection")
}

async fn set_v(direct: &Client, v: i32) {
    let sql = format!("UPDATE cf_t SET v = {v} WHERE id = 1");
    let n = tokio::time::timeout(CALL_TIMEOUT, direct.execute(sql.as_str(), &[]))
        .await
        .expect("bounded")
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    assert_eq!(n, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_moves_the_cache_stream_to_the_new_primary() {
    let _serial = serial().await;
    let c =
        tokio::task::block_in_place(|| PgCluster::builder().replicas(1).start()).expect("cluster");
    c.primary()
        .sql_db(
            APP_DB,
            "CREATE TABLE cf_t (id int PRIMARY KEY, v int); INSERT INTO cf_t VALUES (1, 0)",
        )
        .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    let metrics = free_port();
    let cfg = super::pg_failover::config(
        &c,
        &[
            "health_interval = \"300ms\"",
            "failover = \"promote\"",
            "failover_timeout = \"1s\"",
            // A login waits for the relation catalog, so its reads are kept.
            "function_catalog_wait = \"10s\"",
            "cache = { mode = \"rules\", invalidation = \"stream\", rule = [{ tables = [\"cf_t\"] }] }",
        ],
    );
    let p = FulcrumProcess::start(&with_metrics(&cfg.to_toml(), metrics)).unwrap();
    let client = try_pg_connect(&cfg).await.expect("connect");

    // Before: kept, and a direct write on the primary seen within 1 s.
    let up = until_kept(&client, metrics, "0", Duration::from_secs(10)).await;
    eprintln!("cache serving {up:?} after the first read");
    let old = direct(c.primary()).await;
    set_v(&old, 1).await;
    let before = until_seen(&client, "1", Duration::from_secs(1), "on the old primary").await;
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();

    // The replica stops streaming: the next write (v = 2) is lost with the
    // primary, as an asynchronous standby's last commits are. It is read
    // through Fulcrum and kept.
    let replica = &c.replicas()[0];
    replica
        .sql("ALTER SYSTEM SET primary_conninfo = ''")
        .unwrap();
    replica.sql("SELECT pg_reload_conf()").unwrap();
    let stopping = Instant::now();
    while scalar(
        c.primary(),
        "SELECT count(*) FROM pg_stat_replication WHERE application_name <> 'fulcrum_cache'",
    ) != "0"
    {
        assert!(
            stopping.elapsed() < Duration::from_secs(10),
            "the replica still streams"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    set_v(&old, 2).await;
    until_seen(
        &client,
        "2",
        Duration::from_secs(1),
        "the write the replica lacks",
    )
    .await;
    until_kept(&client, metrics, "2", Duration::from_secs(5)).await;
    assert_eq!(scalar(replica, "SELECT v FROM cf_t WHERE id = 1"), "1");

    // The primary killed with the entry (v = 2) kept; Fulcrum promotes the
    // replica, where v is 1.
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    let killed = Instant::now();
    let new = replica;
    loop {
        if tokio::task::block_in_place(|| new.is_in_recovery()).is_ok_and(|r| !r) {
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
    // and after the cache serves again (the new stream never speaks of v =
    // 2: only dropping the entries when the old stream was lost does).
    until_kept(&client, metrics, "1", Duration::from_secs(10)).await;
    let serving = killed.elapsed();
    assert_eq!(read(&client).await.as_deref(), Ok("1"));

    // A direct write on the new primary: seen within 1 s, and so for 10 more.
    let fresh = direct(new).await;
    set_v(&fresh, 3).await;
    let first = until_seen(
        &client,
        "3",
        Duration::from_secs(1),
        "first on the new primary",
    )
    .await;
    let mut worst = first;
    let mut current = 3;
    for i in 0..10 {
        until_kept(
            &client,
            metrics,
            &current.to_string(),
            Duration::from_secs(5),
        )
        .await;
        current = 10 + i;
        set_v(&fresh, current).await;
        let seen = until_seen(
            &client,
            &current.to_string(),
            Duration::from_secs(1),
            &format!("round {i} on the new primary"),
        )
        .await;
        worst = worst.max(seen);
    }
    eprintln!(
        "cache across a failover: a direct write seen in {before:?} before it; primary killed, \
         replica promoted {promoted:?} later (test's view), the cache serving again {serving:?} \
         after the kill; 11 direct writes on the new primary seen within {worst:?} at worst \
         (the first in {first:?})"
    );
    assert!(
        p.log_contents().contains("cache change stream up"),
        "{}",
        p.log_contents()
    );
}
