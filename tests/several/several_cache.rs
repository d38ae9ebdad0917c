//! Several Fulcrum instances with the result cache (issue 46), each
//! consuming the primary's change stream on its own, so entries stay right
//! across instances: two instances in front of one primary (PostgreSQL:
//! logical decoding, a temporary slot each; MariaDB: the binlog, a server
//! id each), both with `[cluster.cache] mode = "rules", invalidation =
//! "stream"` and a rule on one table. Each round both keep the same entry
//! (a read answered from the cache, shown by the hit counter); a write
//! through instance A is read through B within a second (B learns of it
//! from its own stream; A at once, from its own write), and a write made
//! directly on the primary is read through both within a second. The
//! worst delays are printed. No etcd: the instances need not know of each
//! other. Each test has its own primary and takes its turn
//! (`fulcrum_suite::serial`) so its timings are not those of a loaded
//! machine.

use std::time::{Duration, Instant};

use fulcrum_suite::{
    family_sum, maria_opts, maria_toml, pg_connect_str, serial, try_maria_connect, try_pg_connect,
    try_scrape, with_metrics,
};
use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster, PgCluster, APP_DB, SUPERUSER};
use mysql_async::prelude::Queryable;
use tokio_postgres::{Client, SimpleQueryMessage};

/// A statement that takes longer than this fails the test.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How soon every instance must read a committed write.
const WITHIN: Duration = Duration::from_secs(1);
const CACHE: &str =
    "cache = { mode = \"rules\", invalidation = \"stream\", rule = [{ tables = [\"sc_t\"] }] }";

/// `fulcrum_cache_hits_total` of the instance whose metrics are on `port`.
fn hits(port: u16) -> f64 {
    try_scrape(port).map_or(0.0, |t| family_sum(&t, "fulcrum_cache_hits_total", &[]))
}

/// A client through one instance that reads `v` of `sc_t`'s row 1.
trait Reader {
    async fn value(&mut self) -> i64;
}

impl Reader for Client {
    async fn value(&mut self) -> i64 {
        pg_value(self).await
    }
}

impl Reader for mysql_async::Conn {
    async fn value(&mut self) -> i64 {
        maria_value(self).await
    }
}

/// Reads until one is answered from the cache of the instance whose
/// metrics are on `metrics` (its hit counter rises across the read);
/// every answer must be `want`.
async fn until_kept(what: &str, metrics: u16, want: i64, reader: &mut impl Reader) {
    let start = Instant::now();
    loop {
        let before = tokio::task::block_in_place(|| hits(metrics));
        assert_eq!(
            reader.value().await,
            want,
            "{what}: a read while waiting for a hit"
        );
        if tokio::task::block_in_place(|| hits(metrics)) > before {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what}: no read answered from the cache within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Reads until `want` is read; how long that took. Panics after `WITHIN`.
async fn until_seen(what: &str, want: i64, reader: &mut impl Reader) -> Duration {
    let start = Instant::now();
    loop {
        if reader.value().await == want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < WITHIN,
            "{what}: {want} not read within {WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
}

/// The worst of `delays`, and their median, for the report.
fn summary(delays: &mut [Duration]) -> String {
    delays.sort();
    format!(
        "median {:?}, worst {:?}",
        delays[delays.len() / 2],
        delays[delays.len() - 1]
    )
}

async fn pg_value(client: &Client) -> i64 {
    let sql = "SELECT v FROM sc_t WHERE id = 1";
    let answer = tokio::time::timeout(CALL_TIMEOUT, client.simple_query(sql))
        .await
        .unwrap_or_else(|_| panic!("{sql}: no answer in {CALL_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{sql}: {e} {:?}", e.as_db_error()));
    answer
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).and_then(|v| v.parse().ok()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{sql}: no row"))
}

async fn pg_run(client: &Client, sql: &str) {
    tokio::time::timeout(CALL_TIMEOUT, client.batch_execute(sql))
        .await
        .unwrap_or_else(|_| panic!("{sql}: no answer in {CALL_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{sql}: {e} {:?}", e.as_db_error()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_instances_each_learn_every_write_from_their_own_change_stream() {
    let _serial = serial().await;
    let c =
        tokio::task::block_in_place(|| PgCluster::builder().replicas(0).start()).expect("cluster");
    c.primary()
        .sql_db(
            APP_DB,
            "CREATE TABLE sc_t (id int PRIMARY KEY, v bigint); INSERT INTO sc_t VALUES (1, 0)",
        )
        .unwrap();
    // A login waits for the relation catalog, so its reads are kept.
    let extra = [
        CACHE.to_owned(),
        "function_catalog_wait = \"10s\"".to_owned(),
    ];
    let fleet = crate::fleet::start_fleet(&c, 2, &extra);
    let (a, b) = (&fleet[0], &fleet[1]);
    let mut a_reader = try_pg_connect(&a.cfg).await.expect("connect to A");
    let mut b_reader = try_pg_connect(&b.cfg).await.expect("connect to B");
    // The writers have settings of their own (synchronous_commit), so their
    // reads would not share the readers' entries: they only write.
    let a_writer = try_pg_connect(&a.cfg).await.expect("connect to A");
    let direct = pg_connect_str(&format!(
        "host=127.0.0.1 port={} user={SUPERUSER} dbname={APP_DB}",
        c.primary().port()
    ))
    .await
    .expect("a direct connection");

    let mut v = 0;
    // (PostgreSQL's default, then the harness's: logical decoding reads
    // flushed WAL only, so `off` adds the WAL writer's delay.)
    for commit in ["on", "off"] {
        for w in [&a_writer, &direct] {
            pg_run(w, &format!("SET synchronous_commit = {commit}")).await;
        }
        let (mut through_a, mut direct_a, mut direct_b) = (vec![], vec![], vec![]);
        for i in 0..10 {
            // A write through A: A reads it at once, B within 1 s.
            until_kept("A", a.metrics, v, &mut a_reader).await;
            until_kept("B", b.metrics, v, &mut b_reader).await;
            v += 1;
            pg_run(&a_writer, &format!("UPDATE sc_t SET v = {v} WHERE id = 1")).await;
            assert_eq!(
                pg_value(&a_reader).await,
                v,
                "A reads its own write at once"
            );
            let what = format!("{commit} {i}: B after a write through A");
            through_a.push(until_seen(&what, v, &mut b_reader).await);

            // A write directly on the primary: both within 1 s.
            until_kept("A", a.metrics, v, &mut a_reader).await;
            until_kept("B", b.metrics, v, &mut b_reader).await;
            v += 1;
            pg_run(&direct, &format!("UPDATE sc_t SET v = {v} WHERE id = 1")).await;
            let written = Instant::now();
            let what = format!("{commit} {i}: A after a direct write");
            direct_a.push(until_seen(&what, v, &mut a_reader).await);
            let what = format!("{commit} {i}: B after a direct write");
            until_seen(&what, v, &mut b_reader).await;
            direct_b.push(written.elapsed());
        }
        eprintln!(
            "PostgreSQL, two instances, synchronous_commit = {commit}, 10 rounds: a write through A \
             read through B after {}; a direct write read through A after {}, through B (read \
             after A) after {}",
            summary(&mut through_a),
            summary(&mut direct_a),
            summary(&mut direct_b)
        );
    }
    // Each instance streamed on its own: two walsenders for the cache.
    let senders = c
        .primary()
        .sql("SELECT count(*) FROM pg_stat_replication WHERE application_name = 'fulcrum_cache'")
        .unwrap();
    assert_eq!(senders.trim(), "2", "one change stream per instance");
}

async fn maria_value(conn: &mut mysql_async::Conn) -> i64 {
    let sql = "SELECT v FROM sc_t WHERE id = 1";
    tokio::time::timeout(CALL_TIMEOUT, conn.query_first::<i64, _>(sql))
        .await
        .unwrap_or_else(|_| panic!("{sql}: no answer in {CALL_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .unwrap_or_else(|| panic!("{sql}: no row"))
}

async fn maria_run(conn: &mut mysql_async::Conn, sql: &str) {
    tokio::time::timeout(CALL_TIMEOUT, conn.query_drop(sql))
        .await
        .unwrap_or_else(|_| panic!("{sql}: no answer in {CALL_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_instances_each_learn_every_write_from_their_own_binlog_stream() {
    let _serial = serial().await;
    let c = tokio::task::block_in_place(|| MariaCluster::builder().replicas(0).start())
        .expect("MariaDB");
    c.primary()
        .sql_db(
            APP_DB,
            "CREATE TABLE sc_t (id INT PRIMARY KEY, v BIGINT); INSERT INTO sc_t VALUES (1, 0)",
        )
        .unwrap();
    let fleet: Vec<(u16, u16, FulcrumProcess)> = (0..2)
        .map(|_| {
            let (port, metrics) = (free_port(), free_port());
            let toml = with_metrics(&maria_toml(&c, port, CACHE), metrics);
            let p = tokio::task::block_in_place(|| FulcrumProcess::start(&toml))
                .expect("start fulcrum");
            (port, metrics, p)
        })
        .collect();
    let (a, b) = (&fleet[0], &fleet[1]);
    let connect = |port| async move {
        tokio::time::timeout(CALL_TIMEOUT, try_maria_connect(port))
            .await
            .expect("bounded login")
            .expect("login")
    };
    let (mut a_reader, mut b_reader) = (connect(a.0).await, connect(b.0).await);
    let mut a_writer = connect(a.0).await;
    let mut direct = tokio::time::timeout(
        CALL_TIMEOUT,
        mysql_async::Conn::new(maria_opts(c.primary().port())),
    )
    .await
    .expect("bounded login")
    .expect("a direct connection");

    let mut v = 0;
    let (mut through_a, mut direct_a, mut direct_b) = (vec![], vec![], vec![]);
    for i in 0..20 {
        until_kept("A", a.1, v, &mut a_reader).await;
        until_kept("B", b.1, v, &mut b_reader).await;
        v += 1;
        maria_run(
            &mut a_writer,
            &format!("UPDATE sc_t SET v = {v} WHERE id = 1"),
        )
        .await;
        assert_eq!(
            maria_value(&mut a_reader).await,
            v,
            "A reads its own write at once"
        );
        let what = format!("{i}: B after a write through A");
        through_a.push(until_seen(&what, v, &mut b_reader).await);

        until_kept("A", a.1, v, &mut a_reader).await;
        until_kept("B", b.1, v, &mut b_reader).await;
        v += 1;
        maria_run(
            &mut direct,
            &format!("UPDATE sc_t SET v = {v} WHERE id = 1"),
        )
        .await;
        let written = Instant::now();
        let what = format!("{i}: A after a direct write");
        direct_a.push(until_seen(&what, v, &mut a_reader).await);
        let what = format!("{i}: B after a direct write");
        until_seen(&what, v, &mut b_reader).await;
        direct_b.push(written.elapsed());
    }
    eprintln!(
        "MariaDB, two instances, 20 rounds: a write through A read through B after {}; a direct \
         write read through A after {}, through B (read after A) after {}",
        summary(&mut through_a),
        summary(&mut direct_a),
        summary(&mut direct_b)
    );
    // Each instance streamed on its own: two binlog dumps.
    let dumps = c
        .primary()
        .sql(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%'",
        )
        .unwrap();
    assert_eq!(dumps.trim(), "2", "one binlog stream per instance");
}
