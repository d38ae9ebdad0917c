//! The result cache (`[cluster.cache]`, issue 46) on MySQL sessions,
//! through a real Fulcrum in front of a real MariaDB primary: a kept read
//! is answered from the cache (shown by a write made behind Fulcrum's back,
//! which a cached answer does not see), in the text and the binary protocol
//! (a prepared read is kept by its parameters); every write through Fulcrum
//! (text or prepared, alone or in a transaction) is seen by the writer and
//! every other client at once; a read a write overtook is not kept (the
//! fill race); volatile reads are never kept; one user's entry never
//! answers another who may not read the table; the `fulcrum:nocache` hint,
//! `SET fulcrum.cache = off` and a session setting of the client's own keep
//! it from a stale answer; sysbench's point selects are mostly hits. Every
//! wait is bounded.
//!
//! The module keeps a primary of its own (no replica: a read that is not
//! kept is read where the write was, so what a test sees is the cache's
//! doing alone).

use std::sync::OnceLock;
use std::time::Duration;

use fulcrum_suite::{maria_opts, maria_toml};
use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster, APP_DB};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;

const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// A second user, who may read `cache_pub` but not `cache_t`.
const OTHER_USER: &str = "cache_other";
const OTHER_PASSWORD: &str = "other-pw";

/// This module's primary, with the tables the cases read.
pub(crate) fn cluster() -> &'static MariaCluster {
    static CLUSTER: OnceLock<MariaCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let c = MariaCluster::builder().start().expect("start MariaDB");
        c.primary()
            .sql_script(
                APP_DB,
                &format!(
                    "CREATE TABLE cache_t (id int PRIMARY KEY, v int);
                     INSERT INTO cache_t SELECT seq, seq FROM seq_1_to_1000;
                     CREATE TABLE cache_pub (id int PRIMARY KEY, v int);
                     INSERT INTO cache_pub VALUES (1, 1);
                     CREATE USER '{OTHER_USER}'@'%' IDENTIFIED BY '{OTHER_PASSWORD}';
                     GRANT SELECT ON {APP_DB}.cache_pub TO '{OTHER_USER}'@'%';"
                ),
            )
            .expect("set up");
        c
    })
}

/// Fulcrum keeping reads of `cache_t`, invalidated by its own writes only
/// (`proxy`: a write behind its back stays unseen, which is how a test
/// tells a cached answer from a fresh one).
fn start() -> (FulcrumProcess, u16) {
    start_with("rule = [{ tables = [\"cache_t\"] }]", None)
}

/// Fulcrum with the cache's `rules`, and metrics on `metrics` if given.
fn start_with(rules: &str, metrics: Option<u16>) -> (FulcrumProcess, u16) {
    let port = free_port();
    let mut toml = maria_toml(
        cluster(),
        port,
        &format!("cache = {{ mode = \"rules\", invalidation = \"proxy\", {rules} }}"),
    );
    if let Some(m) = metrics {
        toml = fulcrum_suite::with_metrics(&toml, m);
    }
    toml.push_str(&format!(
        "[[cluster.user]]\nname = \"{OTHER_USER}\"\npassword = \"{OTHER_PASSWORD}\"\n"
    ));
    let f = tokio::task::block_in_place(|| FulcrumProcess::start(&toml)).expect("start fulcrum");
    (f, port)
}

pub(crate) async fn connect(port: u16) -> Conn {
    tokio::time::timeout(CALL_TIMEOUT, Conn::new(maria_opts(port)))
        .await
        .expect("bounded login")
        .expect("login through fulcrum")
}

/// A write made directly on the primary, not through Fulcrum.
pub(crate) fn behind_its_back(sql: &str) {
    cluster().primary().sql_script(APP_DB, sql).expect(sql);
}

/// The first value of `sql`'s first row (text protocol).
pub(crate) async fn value(conn: &mut Conn, sql: &str) -> i64 {
    tokio::time::timeout(CALL_TIMEOUT, conn.query_first::<i64, _>(sql))
        .await
        .unwrap_or_else(|_| panic!("{sql}: no answer in {CALL_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .unwrap_or_else(|| panic!("{sql}: no row"))
}

/// `v` of row `id`, read by a prepared statement (binary protocol).
async fn prepared(conn: &mut Conn, id: i64) -> i64 {
    let sql = "SELECT v FROM cache_t WHERE id = ?";
    tokio::time::timeout(CALL_TIMEOUT, conn.exec_first::<i64, _, _>(sql, (id,)))
        .await
        .unwrap_or_else(|_| panic!("{sql}: no answer in {CALL_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .unwrap_or_else(|| panic!("{sql}: no row"))
}

pub(crate) async fn run(conn: &mut Conn, sql: &str) {
    tokio::time::timeout(CALL_TIMEOUT, conn.query_drop(sql))
        .await
        .unwrap_or_else(|_| panic!("{sql}: no answer in {CALL_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_read_is_answered_from_the_cache_until_a_write_through_fulcrum() {
    let (f, port) = start();
    let (mut a, mut b) = (connect(port).await, connect(port).await);
    let read = "SELECT v FROM cache_t WHERE id = 1";
    assert_eq!(value(&mut a, read).await, 1, "filled");
    behind_its_back("UPDATE cache_t SET v = 1000 WHERE id = 1");
    // Both clients get the kept answer, which does not see that write.
    assert_eq!(value(&mut a, read).await, 1, "{}", f.log_contents());
    assert_eq!(value(&mut b, read).await, 1, "the same user's entry");
    // Again and again: the stored answer's packets are whole each time.
    for _ in 0..5 {
        assert_eq!(value(&mut b, read).await, 1);
    }
    // A write through Fulcrum, by another client: both see it at once.
    run(&mut b, "UPDATE cache_t SET v = 7 WHERE id = 1").await;
    assert_eq!(value(&mut a, read).await, 7, "the writer's write, at once");
    assert_eq!(value(&mut b, read).await, 7);
    // A statement naming the table by its database too is kept apart and
    // invalidated alike.
    let qualified = format!("SELECT v FROM {APP_DB}.cache_t WHERE id = 1");
    assert_eq!(value(&mut a, &qualified).await, 7);
    run(
        &mut b,
        &format!("UPDATE {APP_DB}.cache_t SET v = 8 WHERE id = 1"),
    )
    .await;
    assert_eq!(value(&mut a, read).await, 8);
    assert_eq!(value(&mut a, &qualified).await, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_reads_are_kept_by_their_parameters() {
    let (f, port) = start();
    let (mut a, mut b) = (connect(port).await, connect(port).await);
    assert_eq!(prepared(&mut a, 6).await, 6, "filled");
    assert_eq!(prepared(&mut a, 7).await, 7, "filled");
    behind_its_back(
        "UPDATE cache_t SET v = 600 WHERE id = 6; UPDATE cache_t SET v = 700 WHERE id = 7",
    );
    for _ in 0..3 {
        // Each execute's answer, by its parameters, for either client.
        assert_eq!(prepared(&mut a, 6).await, 6, "{}", f.log_contents());
        assert_eq!(prepared(&mut b, 7).await, 7);
    }
    // The text protocol's read is another entry (another answer's bytes).
    assert_eq!(
        value(&mut a, "SELECT v FROM cache_t WHERE id = 6").await,
        600
    );
    // A prepared write through Fulcrum drops them all.
    tokio::time::timeout(
        CALL_TIMEOUT,
        b.exec_drop("UPDATE cache_t SET v = ? WHERE id = ?", (66, 6)),
    )
    .await
    .expect("bounded")
    .expect("prepared update");
    assert_eq!(prepared(&mut a, 6).await, 66);
    assert_eq!(prepared(&mut a, 7).await, 700);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_rounds_of_update_then_read_are_never_stale() {
    let (_f, port) = start();
    let (mut writer, mut reader) = (connect(port).await, connect(port).await);
    let read = "SELECT v FROM cache_t WHERE id = 2";
    for i in 0..50i64 {
        let v = 10_000 + i;
        match i % 3 {
            0 => {
                run(
                    &mut writer,
                    &format!("UPDATE cache_t SET v = {v} WHERE id = 2"),
                )
                .await
            }
            // Prepared (COM_STMT_EXECUTE): invalidates as a text write does.
            1 => tokio::time::timeout(
                CALL_TIMEOUT,
                writer.exec_drop("UPDATE cache_t SET v = ? WHERE id = ?", (v, 2)),
            )
            .await
            .expect("bounded")
            .expect("prepared update"),
            // In a transaction: a read meanwhile sees (and may keep) the
            // old value; the COMMIT's answer drops it again.
            _ => {
                run(&mut writer, "BEGIN").await;
                run(
                    &mut writer,
                    &format!("UPDATE cache_t SET v = {v} WHERE id = 2"),
                )
                .await;
                assert_eq!(value(&mut reader, read).await, v - 1, "uncommitted");
                assert_eq!(value(&mut reader, read).await, v - 1, "uncommitted");
                run(&mut writer, "COMMIT").await;
            }
        }
        for _ in 0..2 {
            assert_eq!(value(&mut reader, read).await, v, "round {i}: reader");
            assert_eq!(value(&mut writer, read).await, v, "round {i}: writer");
            assert_eq!(prepared(&mut reader, 2).await, v, "round {i}: prepared");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volatile_reads_are_never_kept() {
    let (_f, port) = start();
    let mut c = connect(port).await;
    let rand = "SELECT v, RAND() FROM cache_t WHERE id = 3";
    let now = "SELECT v, NOW(6) FROM cache_t WHERE id = 3";
    let mut rands = Vec::new();
    let mut nows = Vec::new();
    for _ in 0..3 {
        let r: Option<(i64, f64)> = c.query_first(rand).await.expect(rand);
        rands.push(r.expect("a row").1.to_bits());
        let n: Option<(i64, String)> = c.query_first(now).await.expect(now);
        nows.push(n.expect("a row").1);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    rands.dedup();
    nows.dedup();
    assert_eq!(rands.len(), 3, "RAND() is read afresh each time");
    assert_eq!(nows.len(), 3, "NOW() is read afresh each time: {nows:?}");
    // And a write behind Fulcrum's back is seen by them.
    behind_its_back("UPDATE cache_t SET v = 3333 WHERE id = 3");
    let r: Option<(i64, f64)> = c.query_first(rand).await.expect(rand);
    assert_eq!(r.expect("a row").0, 3333);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_s_entry_never_answers_another() {
    let (_f, port) = start();
    let mut app = connect(port).await;
    let read = "SELECT v FROM cache_t WHERE id = 4";
    assert_eq!(value(&mut app, read).await, 4);
    assert_eq!(value(&mut app, read).await, 4, "kept for app");
    let opts = maria_opts(port)
        .user(Some(OTHER_USER))
        .pass(Some(OTHER_PASSWORD));
    let mut other = Conn::new(opts).await.expect("the other user logs in");
    let e = other
        .query_first::<i64, _>(read)
        .await
        .expect_err("the other user may not read cache_t");
    match e {
        mysql_async::Error::Server(s) => assert_eq!(s.code, 1142, "{s:?}"),
        e => panic!("not the server's refusal: {e}"),
    }
    // Its own reads work (and a refused read kept nothing for it).
    assert_eq!(
        value(&mut other, "SELECT v FROM cache_pub WHERE id = 1").await,
        1
    );
    assert!(other.query_first::<i64, _>(read).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hint_the_opt_out_and_a_client_s_settings_keep_it_fresh() {
    let (_f, port) = start();
    let (mut on, mut off) = (connect(port).await, connect(port).await);
    let read = "SELECT v FROM cache_t WHERE id = 5";
    assert_eq!(value(&mut on, read).await, 5, "filled");
    run(&mut off, "SET fulcrum.cache = off").await;
    let shown: Option<String> = off.query_first("SHOW fulcrum.cache").await.expect("SHOW");
    assert_eq!(shown.as_deref(), Some("off"));
    let mut zoned = connect(port).await;
    run(&mut zoned, "SET time_zone = '+05:00'").await;
    behind_its_back("UPDATE cache_t SET v = 555 WHERE id = 5");
    assert_eq!(value(&mut on, read).await, 5, "kept");
    assert_eq!(value(&mut off, read).await, 555, "SET fulcrum.cache = off");
    let hinted = "SELECT /* fulcrum:nocache */ v FROM cache_t WHERE id = 5";
    assert_eq!(value(&mut on, hinted).await, 555, "the hint");
    // Another setting of the client's own is another key.
    assert_eq!(value(&mut zoned, read).await, 555, "its own entry");
    // A bad value is the server's error for a bad value; back on, it
    // reads what is kept.
    let e = off
        .query_drop("SET fulcrum.cache = maybe")
        .await
        .expect_err("a bad value");
    assert!(
        e.to_string().contains("1231") || e.to_string().contains("fulcrum.cache"),
        "{e}"
    );
    run(&mut off, "SET fulcrum.cache = on").await;
    assert_eq!(value(&mut off, read).await, 5, "on again: the kept answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_a_write_overtook_is_not_kept() {
    let (f, port) = start();
    let (mut a, mut b) = (connect(port).await, connect(port).await);
    // A slow read of cache_t only (a cross join), kept by the rule; its
    // count changes when a row's v goes below zero.
    let slow = "SELECT COUNT(*) FROM cache_t x JOIN cache_t y JOIN cache_t z \
                WHERE z.id <= 16 AND x.v + y.v + z.v > 0";
    let reading = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let n = value(&mut a, slow).await;
        (n, started.elapsed(), a)
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    // A write through Fulcrum to a table the fill reads, while it runs.
    let wrote_at = std::time::Instant::now();
    run(&mut b, "UPDATE cache_t SET v = 88 WHERE id = 8").await;
    let (before, took, mut a) = reading.await.expect("the read");
    // The write's invalidation happens when Fulcrum forwards it (and again
    // at its answer): the read must still be running well after the write
    // was sent (on a loaded machine the write's answer may come after the
    // read's, which is still a race the fill must lose).
    eprintln!(
        "the slow read took {took:?}; the write was answered {:?} after it was sent",
        wrote_at.elapsed()
    );
    assert!(
        took > Duration::from_millis(400),
        "the read ({took:?}) must still run well after the write is sent: make it slower"
    );
    // Not kept: a change behind Fulcrum's back is seen by the same read.
    behind_its_back("UPDATE cache_t SET v = -10000000 WHERE id = 9");
    let after = value(&mut a, slow).await;
    assert!(
        after < before,
        "the overtaken fill was kept: {after} {}",
        f.log_contents()
    );
    // The read that filled now is kept.
    behind_its_back("UPDATE cache_t SET v = 9 WHERE id = 9");
    assert_eq!(
        value(&mut a, slow).await,
        after,
        "kept once nothing overtook it"
    );
}

/// sysbench's point selects through the cache, in the text protocol and
/// with prepared statements: no errors, and most reads are hits (1000 rows,
/// 4000 reads each run). The hit ratios are printed.
#[test]
fn sysbench_point_selects_are_mostly_hits() {
    let metrics = free_port();
    let (_f, port) = start_with("rule = [{ tables = [\"sbtest1\"] }]", Some(metrics));
    fulcrum_suite::sysbench(port, 1, 1000, &["oltp_point_select", "prepare"]);
    let counts = || {
        let text = fulcrum_suite::scrape(metrics);
        let hits = fulcrum_suite::family_sum(&text, "fulcrum_cache_hits_total", &[]);
        let misses = fulcrum_suite::family_sum(&text, "fulcrum_cache_misses_total", &[]);
        (hits, misses)
    };
    for ps_mode in ["disable", "auto"] {
        let (h0, m0) = counts();
        let out = fulcrum_suite::sysbench(
            port,
            1,
            1000,
            &[
                "oltp_point_select",
                "run",
                "--threads=4",
                "--events=4000",
                "--time=0",
                &format!("--db-ps-mode={ps_mode}"),
            ],
        );
        let (h1, m1) = counts();
        let (hits, misses) = (h1 - h0, m1 - m0);
        let ratio = hits / (hits + misses).max(1.0);
        eprintln!(
            "sysbench oltp_point_select ps-mode={ps_mode}: {hits} hits, {misses} misses, hit ratio {ratio:.2}"
        );
        assert!(
            out.contains("ignored errors:                      0"),
            "{out}"
        );
        assert!(
            ratio > 0.5,
            "ps-mode={ps_mode}: {hits} hits, {misses} misses"
        );
    }
    fulcrum_suite::sysbench(port, 1, 1000, &["oltp_point_select", "cleanup"]);
}
