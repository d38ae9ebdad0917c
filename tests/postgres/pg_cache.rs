//! The result cache (`[cluster.cache]`, issue 46) through a real Fulcrum in
//! front of a real primary: a kept read is answered from the cache (shown
//! by a write made behind Fulcrum's back, which a cached answer does not
//! see), every write through Fulcrum is seen by the writer and by every
//! other client at once, in both protocols; volatile reads are never kept;
//! one user's entry never answers another under row-level security; a
//! read a write overtook is never stored (the fill race); the hint and the
//! session setting turn it off. Every wait is bounded.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fulcrum_suite::{console_connect, pg_connect, pg_connect_as, with_console, PgProxyConfig};
use fulcrum_testkit::{free_port, FulcrumProcess, PgCluster, APP_DB, APP_MD5_USER, APP_USER};
use tokio_postgres::{Client, SimpleQueryMessage};

const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// This module's primary, with the tables the cases read.
pub(crate) fn cluster() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let c = PgCluster::builder()
            .replicas(0)
            .start()
            .expect("start PostgreSQL");
        c.primary()
            .sql_script(
                APP_DB,
                &format!(
                    "ALTER ROLE {APP_USER} REPLICATION; -- the health user's change stream
                     CREATE TABLE cache_t (id int PRIMARY KEY, v int);
                     INSERT INTO cache_t SELECT i, i FROM generate_series(1, 1000) i;
                     CREATE TABLE cache_other (id int PRIMARY KEY, v int);
                     INSERT INTO cache_other VALUES (1, 1);
                     CREATE TABLE cache_rls (owner text, v int);
                     INSERT INTO cache_rls VALUES ('{APP_USER}', 1), ('{APP_MD5_USER}', 2);
                     ALTER TABLE cache_rls ENABLE ROW LEVEL SECURITY;
                     CREATE POLICY cache_own ON cache_rls USING (owner = current_user);
                     GRANT SELECT ON cache_rls TO PUBLIC;
                     CREATE FUNCTION cache_slow(x int) RETURNS int LANGUAGE plpgsql IMMUTABLE
                       AS $$ BEGIN PERFORM pg_sleep(0.8); RETURN x; END $$;"
                ),
            )
            .expect("set up");
        c
    })
}

/// Fulcrum with a rule keeping reads of `tables`, invalidated by its own
/// writes only (`proxy`: a write behind its back stays unseen, which is
/// how a test tells a cached answer from a fresh one).
fn start(tables: &str, isolation: &str) -> (FulcrumProcess, PgProxyConfig) {
    let (p, cfg, _) = start_with_console(tables, isolation);
    (p, cfg)
}

/// `start`, with the admin console on the returned port.
fn start_with_console(tables: &str, isolation: &str) -> (FulcrumProcess, PgProxyConfig, u16) {
    start_invalidated_by(tables, isolation, "proxy")
}

/// `start_with_console`, invalidated by `invalidation`.
fn start_invalidated_by(
    tables: &str,
    isolation: &str,
    invalidation: &str,
) -> (FulcrumProcess, PgProxyConfig, u16) {
    start_console(cache_config(tables, isolation, invalidation))
}

/// Fulcrum started with `cfg` and the admin console on the returned port.
pub(crate) fn start_console(cfg: PgProxyConfig) -> (FulcrumProcess, PgProxyConfig, u16) {
    let admin = free_port();
    let p = FulcrumProcess::start(&with_console(&cfg.to_toml(), admin)).expect("start fulcrum");
    (p, cfg, admin)
}

/// The config of a Fulcrum with a rule keeping reads of `tables`.
pub(crate) fn cache_config(tables: &str, isolation: &str, invalidation: &str) -> PgProxyConfig {
    PgProxyConfig::new(&cluster().primary().addr())
        // A user function pins its caller unless declared free of session
        // state (default-deny); the fill race's slow read calls this one.
        .extra("session_free_functions = [\"cache_slow\"]")
        // A login waits for its database's catalogs (functions, relations),
        // so its first reads are already kept (a loaded machine may take
        // longer than the default 100 ms).
        .extra("function_catalog_wait = \"10s\"")
        .extra(&format!(
            "cache = {{ mode = \"rules\", invalidation = \"{invalidation}\", isolation = \"{isolation}\", \
             rule = [{{ tables = [{tables}] }}] }}"
        ))
}

/// A write made directly on the primary, not through Fulcrum.
pub(crate) fn behind_its_back(sql: &str) {
    cluster().primary().sql_script(APP_DB, sql).expect(sql);
}

/// The first value of `sql`'s first row (simple protocol).
pub(crate) async fn value(client: &Client, sql: &str) -> String {
    let answer = tokio::time::timeout(CALL_TIMEOUT, client.simple_query(sql))
        .await
        .unwrap_or_else(|_| panic!("{sql}: no answer in {CALL_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{sql}: {e} {:?}", e.as_db_error()));
    answer
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("").to_owned()),
            _ => None,
        })
        .unwrap_or_default()
}

/// All of `sql`'s first column, joined by commas (simple protocol).
async fn column(client: &Client, sql: &str) -> String {
    let answer = tokio::time::timeout(CALL_TIMEOUT, client.simple_query(sql))
        .await
        .expect("bounded")
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let values: Vec<String> = answer
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("").to_owned()),
            _ => None,
        })
        .collect();
    values.join(",")
}

/// `v` of row `id` through a prepared statement (extended protocol).
async fn prepared_v(client: &Client, id: i32) -> i32 {
    let stmt = "SELECT v FROM cache_t WHERE id = $1";
    let row = tokio::time::timeout(CALL_TIMEOUT, client.query_one(stmt, &[&id]))
        .await
        .expect("bounded")
        .unwrap_or_else(|e| panic!("{stmt}: {e}"));
    row.get(0)
}

pub(crate) async fn run(client: &Client, sql: &str) {
    tokio::time::timeout(CALL_TIMEOUT, client.batch_execute(sql))
        .await
        .unwrap_or_else(|_| panic!("{sql}: no answer in {CALL_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{sql}: {e} {:?}", e.as_db_error()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_read_is_answered_from_the_cache_until_a_write_through_fulcrum() {
    let (_p, cfg) = start("\"cache_t\"", "user");
    let a = pg_connect(&cfg).await;
    let b = pg_connect(&cfg).await;
    run(&a, "UPDATE cache_t SET v = 1 WHERE id = 1").await;
    let read = "SELECT v FROM cache_t WHERE id = 1";
    assert_eq!(value(&a, read).await, "1");
    // Behind Fulcrum's back: the kept answer does not see it.
    behind_its_back("UPDATE cache_t SET v = 100 WHERE id = 1");
    assert_eq!(value(&a, read).await, "1", "answered from the cache");
    assert_eq!(
        value(&b, read).await,
        "1",
        "the same user's other client too"
    );
    // Another table's write leaves it.
    run(&b, "UPDATE cache_other SET v = v + 1").await;
    assert_eq!(value(&a, read).await, "1");
    // A write to its table through Fulcrum: everyone reads it at once.
    run(&b, "UPDATE cache_t SET v = 2 WHERE id = 1").await;
    assert_eq!(value(&a, read).await, "2");
    assert_eq!(value(&b, read).await, "2");
    // The extended protocol is answered from the cache too.
    assert_eq!(prepared_v(&a, 1).await, 2);
    behind_its_back("UPDATE cache_t SET v = 200 WHERE id = 1");
    assert_eq!(prepared_v(&b, 1).await, 2, "a prepared read from the cache");
    run(&b, "UPDATE cache_t SET v = 3 WHERE id = 1").await;
    assert_eq!(prepared_v(&a, 1).await, 3);
    // Not listed: not kept.
    let other = "SELECT v FROM cache_other WHERE id = 1";
    let before = value(&a, other).await;
    behind_its_back("UPDATE cache_other SET v = v + 10");
    assert_ne!(value(&a, other).await, before, "a read no rule lists");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_rounds_of_write_then_read_never_see_a_stale_value() {
    let (_p, cfg) = start("\"cache_t\"", "shared");
    let writer = pg_connect(&cfg).await;
    let reader = pg_connect(&cfg).await;
    let read = "SELECT v FROM cache_t WHERE id = 7";
    let started = Instant::now();
    for i in 0..200 {
        // Simple and extended writes, in and out of a transaction.
        match i % 4 {
            0 => run(&writer, &format!("UPDATE cache_t SET v = {i} WHERE id = 7")).await,
            1 => {
                let n = writer
                    .execute("UPDATE cache_t SET v = $1 WHERE id = 7", &[&i])
                    .await
                    .expect("update");
                assert_eq!(n, 1);
            }
            2 => {
                run(
                    &writer,
                    &format!("BEGIN; UPDATE cache_t SET v = {i} WHERE id = 7; COMMIT"),
                )
                .await
            }
            _ => {
                run(&writer, "BEGIN").await;
                run(&writer, &format!("UPDATE cache_t SET v = {i} WHERE id = 7")).await;
                run(&writer, "COMMIT").await;
            }
        }
        // Read twice (the second may be a hit), both ways, by both.
        for client in [&reader, &writer] {
            assert_eq!(value(client, read).await, i.to_string(), "round {i}");
            assert_eq!(value(client, read).await, i.to_string(), "round {i}");
            assert_eq!(prepared_v(client, 7).await, i, "round {i}");
        }
    }
    eprintln!("200 rounds in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volatile_reads_are_never_answered_from_the_cache() {
    let (_p, cfg) = start("\"cache_t\"", "user");
    let a = pg_connect(&cfg).await;
    for sql in [
        "SELECT v + random() FROM cache_t WHERE id = 3",
        "SELECT clock_timestamp()::text || v FROM cache_t WHERE id = 3",
        "SELECT now()::text || v FROM cache_t WHERE id = 3",
        "SELECT current_user || v FROM cache_t WHERE id = 3",
    ] {
        let first = value(&a, sql).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        behind_its_back("UPDATE cache_t SET v = v + 1 WHERE id = 3");
        let second = value(&a, sql).await;
        assert_ne!(first, second, "{sql} was answered from the cache");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_users_entry_never_answers_another_under_row_level_security() {
    let (_p, cfg) = start("\"cache_rls\"", "user");
    let app = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    let md5 = pg_connect_as(&cfg, APP_MD5_USER, APP_DB).await;
    let read = "SELECT v FROM cache_rls ORDER BY v";
    for _ in 0..3 {
        assert_eq!(column(&app, read).await, "1");
        assert_eq!(column(&md5, read).await, "2");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_a_write_overtook_is_never_kept() {
    let (_p, cfg) = start("\"cache_t\"", "user");
    let reader = pg_connect(&cfg).await;
    let writer = pg_connect(&cfg).await;
    run(&writer, "UPDATE cache_t SET v = 5 WHERE id = 5").await;
    // `cache_slow` (IMMUTABLE, 0.8 s) runs per row: the read's snapshot is
    // taken before it sleeps, so its answer is older than the write below.
    let slow = "SELECT v, cache_slow(id) FROM cache_t WHERE id = 5";
    // Until the function catalog vouches for it, the read is not kept: wait
    // for a hit (an answer that a write behind Fulcrum's back does not move).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "the slow read was never kept");
        let kept = value(&reader, slow).await;
        let t = Instant::now();
        let again = value(&reader, slow).await;
        if t.elapsed() < Duration::from_millis(400) {
            assert_eq!(kept, again);
            break;
        }
    }
    run(&writer, "UPDATE cache_t SET v = 6 WHERE id = 5").await;
    // The fill: a miss, 0.8 s long, overtaken by a write 0.3 s in. Its
    // client logs in first, so the 0.3 s are the read's own (a login on a
    // loaded machine took longer, and the read then began after the write).
    let fill = {
        let c = pg_connect(&cfg).await;
        tokio::spawn(async move {
            value(&c, "SELECT v, cache_slow(id) FROM cache_t WHERE id = 5").await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    run(&writer, "UPDATE cache_t SET v = 7 WHERE id = 5").await;
    assert_eq!(fill.await.unwrap(), "6", "the fill read before the write");
    // Its answer was not kept: the next read is the server's, with 7.
    assert_eq!(value(&reader, slow).await, "7");
    assert_eq!(value(&reader, slow).await, "7");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hint_and_the_session_setting_turn_the_cache_off() {
    let (_p, cfg) = start("\"cache_t\"", "user");
    let a = pg_connect(&cfg).await;
    let read = "SELECT v FROM cache_t WHERE id = 9";
    run(&a, "UPDATE cache_t SET v = 9 WHERE id = 9").await;
    assert_eq!(value(&a, read).await, "9");
    behind_its_back("UPDATE cache_t SET v = 90 WHERE id = 9");
    assert_eq!(value(&a, read).await, "9", "kept");
    let hinted = "SELECT v FROM cache_t WHERE id = 9 /* fulcrum:nocache */";
    assert_eq!(value(&a, hinted).await, "90");
    run(&a, "SET fulcrum.cache = off").await;
    assert_eq!(value(&a, read).await, "90", "this client no longer uses it");
    let b = pg_connect(&cfg).await;
    assert_eq!(value(&b, read).await, "9", "other clients still do");
}

/// `SHOW CACHE` on the console: (digest's query, entries, hits, misses) of
/// each digest row.
pub(crate) async fn show_cache(admin: u16) -> Vec<(String, u64, u64, u64)> {
    let n = |r: &tokio_postgres::SimpleQueryRow, c: &str| -> u64 {
        r.get(c).and_then(|v| v.parse().ok()).unwrap_or_default()
    };
    console_connect(admin)
        .await
        .simple_query("SHOW CACHE")
        .await
        .expect("SHOW CACHE")
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) if r.get("digest") != Some("(cluster)") => Some((
                r.get("query").unwrap_or_default().to_owned(),
                n(r, "entries"),
                n(r, "hits"),
                n(r, "misses"),
            )),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_cache_counts_and_flush_cache_drops_entries() {
    let (_p, cfg, admin) = start_with_console("\"cache_t\"", "user");
    let a = pg_connect(&cfg).await;
    run(&a, "UPDATE cache_t SET v = 11 WHERE id = 11").await;
    let read = "SELECT v FROM cache_t WHERE id = 11";
    for _ in 0..3 {
        assert_eq!(value(&a, read).await, "11");
    }
    let rows = show_cache(admin).await;
    let row = rows
        .iter()
        .find(|r| r.0.contains("cache_t"))
        .unwrap_or_else(|| panic!("no cache_t digest in {rows:?}"));
    assert_eq!((row.1, row.2, row.3), (1, 2, 1), "entries, hits, misses");
    behind_its_back("UPDATE cache_t SET v = 110 WHERE id = 11");
    assert_eq!(value(&a, read).await, "11", "kept");
    let console = console_connect(admin).await;
    let flushed = console.simple_query("FLUSH CACHE public.cache_t").await;
    assert!(flushed.is_ok(), "{flushed:?}");
    assert_eq!(
        value(&a, read).await,
        "110",
        "flushed: read from the server"
    );
    assert!(console.simple_query("FLUSH CACHE").await.is_ok());
    assert!(console.simple_query("FLUSH").await.is_err(), "usage error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_behind_fulcrums_back_reach_readers_through_the_change_stream() {
    let (_p, cfg, admin) = start_invalidated_by("\"cache_t\"", "user", "stream");
    let a = pg_connect(&cfg).await;
    let read = "SELECT v FROM cache_t WHERE id = 13";
    let mut worst = Duration::ZERO;
    for i in 0..20 {
        // Kept first (the stream is up once the database is asked for).
        for _ in 0..3 {
            value(&a, read).await;
        }
        behind_its_back(&format!(
            "UPDATE cache_t SET v = {} WHERE id = 13",
            1000 + i
        ));
        let written = Instant::now();
        loop {
            if value(&a, read).await == (1000 + i).to_string() {
                break;
            }
            assert!(
                written.elapsed() < Duration::from_secs(1),
                "round {i}: the direct write not seen within 1 s"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        worst = worst.max(written.elapsed());
    }
    eprintln!("a direct write seen through the cache within {worst:?} at worst (20 rounds)");
    let rows = show_cache(admin).await;
    let hits: u64 = rows.iter().map(|r| r.2).sum();
    assert!(
        hits >= 20,
        "the reads were answered from the cache: {rows:?}"
    );
    // The stream lost, and a write made while it is: the new stream (a new
    // slot, made after the write) never reports it, so only dropping the
    // entries when the loss is noticed keeps them from serving the old value
    // until their TTL (60 s). Seen within milliseconds, as any direct write.
    value(&a, read).await;
    behind_its_back(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'fulcrum_cache'; \
         UPDATE cache_t SET v = 5000 WHERE id = 13",
    );
    let lost = Instant::now();
    while value(&a, read).await != "5000" {
        assert!(
            lost.elapsed() < Duration::from_secs(1),
            "an entry outlived the stream's loss"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    eprintln!(
        "after the stream's loss, the write seen in {:?}",
        lost.elapsed()
    );
    // And the cache serves again once the stream is back.
    let back = Instant::now();
    loop {
        value(&a, read).await;
        let before: u64 = show_cache(admin).await.iter().map(|r| r.2).sum();
        value(&a, read).await;
        let after: u64 = show_cache(admin).await.iter().map(|r| r.2).sum();
        if after > before {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(10),
            "the stream never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
