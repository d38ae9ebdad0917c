//! The result cache's change stream (issue 46), at the library level: a
//! PostgreSQL cluster context with `[cluster.cache]` on (set in code) runs
//! its health loop and change streams against a real primary. A database
//! is served once its stream is up; a write made directly on the primary
//! (not through Fulcrum) drops the entries of its table within a second
//! (the delays are printed); killing the stream's walsender stops serving
//! at once, and serving resumes when the stream reconnects. A primary with
//! `wal_level = replica` gives no stream: the cache falls back to proxy
//! invalidation. Each test has its own single-node cluster.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fulcrum_cache::{Cache, Lookup, Query, Table};
use fulcrum_cluster::ProtocolContext;
use fulcrum_postgres::frontend::ClusterContext;
use fulcrum_suite::{pg_connect_str, PgProxyConfig};
use fulcrum_testkit::{PgCluster, APP_DB, SUPERUSER};
use tokio::sync::watch;

/// A context for `c` with the cache on (`invalidation = "stream"`, the
/// default), its health loop and change streams started.
fn context(c: &PgCluster) -> (Arc<ClusterContext>, watch::Sender<bool>) {
    let toml = PgProxyConfig::new(&c.primary().addr())
        .extra(&format!(
            "health_user = \"{SUPERUSER}\"\nhealth_password = \"\"\nhealth_interval = \"100ms\""
        ))
        .to_toml();
    let mut cluster = fulcrum_config::parse(&toml, Path::new("test.toml"))
        .expect("valid config")
        .clusters
        .remove(0);
    cluster.cache.mode = fulcrum_config::CacheMode::Auto;
    assert_eq!(
        cluster.cache.invalidation,
        fulcrum_config::CacheInvalidation::Stream
    );
    let ctx = ClusterContext::new(cluster);
    let (tx, rx) = watch::channel(false);
    ctx.start_health(rx);
    assert!(
        ctx.start_change_streams().is_some(),
        "a PostgreSQL cluster with a stream cache starts its streams"
    );
    (ctx, tx)
}

fn tables() -> [Table; 1] {
    [fulcrum_cache::table(APP_DB, "public.t", false)]
}

fn query<'a>(key: &'a [u8], tables: &'a [Table]) -> Query<'a> {
    Query {
        key,
        database: APP_DB,
        digest: 1,
        text: "select v from t",
        tables,
        ttl: Duration::from_secs(600),
        second_miss: false,
    }
}

/// Stores an entry for `key` (reading `t`); false when the cache is off.
fn fill(cache: &Cache, key: &[u8]) -> bool {
    let tables = tables();
    match cache.lookup(&query(key, &tables), false) {
        Lookup::Fill(f) => f.store(Bytes::from_static(b"answer")),
        _ => false,
    }
}

fn hit(cache: &Cache, key: &[u8]) -> bool {
    let tables = tables();
    matches!(cache.lookup(&query(key, &tables), false), Lookup::Hit(_))
}

/// Waits up to `within` for `cond`; returns how long it took, or `None`.
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
async fn a_direct_write_drops_the_entries_and_a_lost_stream_stops_serving() {
    let c = PgCluster::builder().start().expect("cluster");
    c.primary()
        .sql_db(
            APP_DB,
            "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0); \
             CREATE TABLE other (id int)",
        )
        .expect("tables");
    let (ctx, _stop) = context(&c);
    let cache = ctx.cache.clone().expect("the cache is on");
    assert!(cache.uses_streams());
    // The first look asks for the stream.
    assert!(!cache.serving(APP_DB));
    let up = until(Duration::from_secs(5), || cache.serving(APP_DB)).await;
    eprintln!("stream up after {up:?}");
    assert!(up.is_some(), "the database is served within 5 s");

    let direct = pg_connect_str(&format!(
        "host=127.0.0.1 port={} user={SUPERUSER} dbname={APP_DB}",
        c.primary().port()
    ))
    .await
    .expect("direct connection");
    // A write to another table leaves the entry.
    assert!(fill(&cache, b"k"));
    direct
        .execute("INSERT INTO other VALUES (1)", &[])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        hit(&cache, b"k"),
        "a change to another table keeps the entry"
    );

    // The harness runs with synchronous_commit = off (and
    // wal_writer_delay = 10ms); logical decoding reads flushed WAL only,
    // so that flush is part of the delay. With synchronous_commit = on
    // (PostgreSQL's default) the commit is flushed before it is answered.
    for commit in ["off", "on"] {
        direct
            .batch_execute(&format!("SET synchronous_commit = {commit}"))
            .await
            .unwrap();
        let mut delays = Vec::new();
        for i in 0..20 {
            // (The first round finds the entry the write to `other` left.)
            assert!(hit(&cache, b"k") || fill(&cache, b"k"), "stored ({i})");
            assert!(hit(&cache, b"k"));
            direct
                .execute("UPDATE t SET v = v + 1 WHERE id = 1", &[])
                .await
                .unwrap();
            let gone = until(Duration::from_secs(1), || cache.is_empty()).await;
            let Some(gone) = gone else {
                panic!("update {i}: the entry is still there after 1 s");
            };
            delays.push(gone);
        }
        delays.sort();
        eprintln!(
            "synchronous_commit = {commit}: entry gone after the UPDATE's commit was answered (20 updates): median {:?}, worst {:?}, all {delays:?}",
            delays[delays.len() / 2],
            delays[delays.len() - 1]
        );
    }

    // Kill the walsender: the database stops being served, its entries go.
    assert!(fill(&cache, b"k"));
    let killed = direct
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_replication WHERE application_name = $1",
            &[&fulcrum_postgres::change_stream::APPLICATION_NAME],
        )
        .await
        .unwrap();
    assert_eq!(killed.len(), 1, "one walsender streams for the cache");
    let down = until(Duration::from_secs(1), || !cache.serving(APP_DB)).await;
    eprintln!("not served {down:?} after the walsender was killed");
    assert!(down.is_some(), "a lost stream stops serving at once");
    assert!(cache.is_empty(), "the database's entries dropped");
    let tables = tables();
    assert!(matches!(
        cache.lookup(&query(b"k", &tables), false),
        Lookup::Off | Lookup::Fill(_)
    ));
    let back = until(Duration::from_secs(5), || cache.serving(APP_DB)).await;
    eprintln!("served again {back:?} later");
    assert!(back.is_some(), "the stream reconnects");
    // And it invalidates again.
    assert!(fill(&cache, b"k"));
    direct
        .execute("DELETE FROM t WHERE id = 1", &[])
        .await
        .unwrap();
    assert!(until(Duration::from_secs(1), || cache.is_empty())
        .await
        .is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_logical_decoding_the_cache_falls_back_to_proxy_invalidation() {
    let c = PgCluster::builder()
        .setting("wal_level", "replica")
        .start()
        .expect("cluster");
    let (ctx, _stop) = context(&c);
    let cache = ctx.cache.clone().expect("the cache is on");
    assert!(!cache.serving(APP_DB), "asks for the stream");
    let fell_back = until(Duration::from_secs(10), || !cache.uses_streams()).await;
    assert!(fell_back.is_some(), "wal_level = replica: no stream");
    assert!(cache.serving(APP_DB), "served on proxy invalidation");
}
