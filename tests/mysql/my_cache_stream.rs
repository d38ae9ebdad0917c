//! The result cache's change stream on MariaDB (issue 46), at the library
//! level: a MySQL cluster context with `[cluster.cache]` on (set in code)
//! runs its health loop and its binlog stream against a real primary. A
//! database is served once the stream is up; a write made directly on the
//! primary (not through Fulcrum) drops its table's entries within a second
//! (10 rounds; the delays are printed), a write to another table leaves
//! them, and killing the stream's dump thread stops serving until the
//! stream is back. Its own single-node cluster.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fulcrum_cache::{Cache, Lookup, Query, Table};
use fulcrum_cluster::ProtocolContext;
use fulcrum_mysql::frontend::MyClusterContext;
use fulcrum_suite::maria_toml;
use fulcrum_testkit::{free_port, MariaCluster, APP_DB};
use tokio::sync::watch;

fn context(c: &MariaCluster) -> (Arc<MyClusterContext>, watch::Sender<bool>) {
    let toml = maria_toml(c, free_port(), "health_interval = \"100ms\"");
    let mut cluster = fulcrum_config::parse(&toml, Path::new("test.toml"))
        .expect("valid config")
        .clusters
        .remove(0);
    cluster.cache.mode = fulcrum_config::CacheMode::Auto;
    let ctx = MyClusterContext::new(cluster);
    let (tx, rx) = watch::channel(false);
    ctx.start_health(rx);
    assert!(
        ctx.start_change_streams().is_some(),
        "a MySQL cluster with a stream cache starts its binlog stream"
    );
    (ctx, tx)
}

fn tables() -> [Table; 1] {
    [fulcrum_cache::table(APP_DB, "cs_t", true)]
}

fn fill(cache: &Cache, key: &[u8]) -> bool {
    let tables = tables();
    let q = Query {
        key,
        database: APP_DB,
        digest: 1,
        text: "select v from cs_t",
        tables: &tables,
        ttl: Duration::from_secs(600),
        second_miss: false,
    };
    match cache.lookup(&q, false) {
        Lookup::Fill(f) => f.store(Bytes::from_static(b"answer")),
        _ => false,
    }
}

fn hit(cache: &Cache, key: &[u8]) -> bool {
    let tables = tables();
    let q = Query {
        key,
        database: APP_DB,
        digest: 1,
        text: "select v from cs_t",
        tables: &tables,
        ttl: Duration::from_secs(600),
        second_miss: false,
    };
    matches!(cache.lookup(&q, false), Lookup::Hit(_))
}

async fn until(within: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if cond() {
            return Some(start.elapsed());
        }
        if start.elapsed() > within {
            return None;
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_write_drops_the_entries_and_a_lost_binlog_stream_stops_serving() {
    let c = MariaCluster::builder()
        .replicas(0)
        .start()
        .expect("MariaDB");
    c.primary()
        .sql(
            "CREATE TABLE cs_t (id INT PRIMARY KEY, v INT); INSERT INTO cs_t VALUES (1, 0); \
             CREATE TABLE cs_other (id INT)",
        )
        .expect("tables");
    let (ctx, _stop) = context(&c);
    let cache = ctx.cache.clone().expect("the cache is on");
    assert!(cache.uses_streams());
    assert!(!cache.serving(APP_DB), "not before the stream is up");
    let up = until(Duration::from_secs(10), || cache.serving(APP_DB)).await;
    eprintln!("binlog stream up after {up:?}");
    assert!(up.is_some(), "the database is served within 10 s");

    assert!(fill(&cache, b"k"));
    c.primary()
        .sql("INSERT INTO cs_other VALUES (1)")
        .expect("insert");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        hit(&cache, b"k"),
        "a change to another table keeps the entry"
    );

    let mut worst = Duration::ZERO;
    for i in 0..10 {
        assert!(hit(&cache, b"k") || fill(&cache, b"k"), "round {i}: kept");
        // `sql` runs the mariadb client: its commit is answered when it returns.
        c.primary()
            .sql(&format!("UPDATE cs_t SET v = {} WHERE id = 1", i + 1))
            .expect("update");
        let gone = until(Duration::from_secs(1), || !hit(&cache, b"k")).await;
        let gone = gone.unwrap_or_else(|| panic!("round {i}: the entry outlived 1 s"));
        worst = worst.max(gone);
    }
    eprintln!("a direct write dropped the entry within {worst:?} at worst (10 rounds)");

    // The stream lost: the dump thread killed on the server.
    assert!(hit(&cache, b"k") || fill(&cache, b"k"));
    c.primary()
        .sql(
            "SET @id = (SELECT ID FROM information_schema.PROCESSLIST \
             WHERE COMMAND LIKE 'Binlog Dump%' LIMIT 1); \
             EXECUTE IMMEDIATE CONCAT('KILL ', @id)",
        )
        .expect("kill the dump thread");
    let down = until(Duration::from_secs(2), || !cache.serving(APP_DB)).await;
    assert!(down.is_some(), "the lost stream stops serving");
    assert!(!hit(&cache, b"k"), "its entries are gone");
    let back = until(Duration::from_secs(10), || cache.serving(APP_DB)).await;
    eprintln!("stream lost: serving stopped in {down:?}, back after {back:?}");
    assert!(back.is_some(), "the stream comes back");
    assert!(fill(&cache, b"k"));
    c.primary()
        .sql("DELETE FROM cs_t WHERE id = 1")
        .expect("delete");
    assert!(
        until(Duration::from_secs(1), || !hit(&cache, b"k"))
            .await
            .is_some(),
        "the stream invalidates again after it is back"
    );
}
