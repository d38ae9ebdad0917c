//! Server deaths and timeouts: a commit in flight when its server dies,
//! `client_idle_timeout`, idle in transaction, and `query_timeout`.

use std::time::{Duration, Instant};

use fulcrum_suite::{pg_connect, PgProxyConfig};
use fulcrum_testkit::{APP_DB, APP_PASSWORD, APP_USER};
use tokio_postgres::NoTls;

use super::helpers::{cluster, exec, one, start, with_replicas, CALL_TIMEOUT};

/// Terminates, on the primary, the backend running a statement that starts
/// with `prefix`, once it is seen running (within `CALL_TIMEOUT`).
async fn terminate_running(prefix: &str) {
    let started = Instant::now();
    let sql = format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE state = 'active' AND query LIKE '{prefix}%' AND pid <> pg_backend_pid()"
    );
    loop {
        let out = cluster().primary().sql(&sql).expect("terminate");
        if out.contains('t') {
            return;
        }
        assert!(
            started.elapsed() < CALL_TIMEOUT,
            "no running statement like {prefix}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_commit_in_flight_when_its_server_dies_may_have_committed() {
    let (_p, cfg) = start(with_replicas(4));
    let client = pg_connect(&cfg).await;
    exec(&client, "BEGIN").await.unwrap();
    exec(&client, "INSERT INTO slow_commit VALUES (1)")
        .await
        .unwrap();
    let commit = tokio::spawn(async move {
        let r = exec(&client, "COMMIT").await;
        (client, r)
    });
    terminate_running("COMMIT").await;
    let (client, r) = commit.await.unwrap();
    let err = r.expect_err("the COMMIT's server died");
    assert_eq!(
        err.code().map(|c| c.code()),
        Some("08007"),
        "transaction_resolution_unknown: {err}"
    );
    // The client is told it is in a failed transaction until it ends it,
    // then goes on on a new server connection.
    exec(&client, "ROLLBACK").await.unwrap();
    assert_eq!(one(&client, "SELECT 'next'").await, "next");

    // An autocommit write in flight: the same.
    let writer = pg_connect(&cfg).await;
    let write = tokio::spawn(async move {
        let r = exec(&writer, "INSERT INTO slow_commit VALUES (2)").await;
        (writer, r)
    });
    terminate_running("INSERT INTO slow_commit").await;
    let (writer, r) = write.await.unwrap();
    assert_eq!(
        r.expect_err("the write's server died")
            .code()
            .map(|c| c.code()),
        Some("08007")
    );
    assert_eq!(one(&writer, "SELECT 'next'").await, "next");

    // A transaction that dies before its COMMIT was sent was not committed.
    let txn = pg_connect(&cfg).await;
    exec(&txn, "BEGIN").await.unwrap();
    let pid = one(&txn, "SELECT pg_backend_pid() + 0").await;
    let sleeper = tokio::spawn(async move {
        let r = exec(&txn, "SELECT pg_sleep(60)").await;
        (txn, r)
    });
    terminate_running("SELECT pg_sleep(60)").await;
    let (txn, r) = sleeper.await.unwrap();
    assert_eq!(
        r.expect_err("the server died").code().map(|c| c.code()),
        Some("08006"),
        "pid {pid}"
    );
    exec(&txn, "ROLLBACK").await.unwrap();
}

/// A client quiet for longer than `client_idle_timeout` outside a
/// transaction is closed, told why (57P05, naming the key); one busy for
/// longer than it, in statements closer together, is not.
#[tokio::test]
async fn an_idle_client_is_closed_at_client_idle_timeout() {
    let cfg = PgProxyConfig::new(&cluster().primary().addr()).extra("client_idle_timeout = \"1s\"");
    let (_p, cfg) = start(cfg);
    let port: u16 = cfg.listen.rsplit_once(':').unwrap().1.parse().unwrap();
    let mut c = tokio_postgres::Config::new();
    c.host("127.0.0.1")
        .port(port)
        .user(APP_USER)
        .password(APP_PASSWORD)
        .dbname(APP_DB);
    let (client, conn) = c.connect(NoTls).await.expect("connect");
    let closed = tokio::spawn(conn);
    // Busy past the first deadline: a statement every 300 ms for 1.8 s.
    // The timer, armed at the first turn and only moved later since, goes
    // off at 1 s and is set again to the deadline now wanted; the client
    // stays.
    for _ in 0..6 {
        assert_eq!(one(&client, "SELECT 1").await, "1");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(one(&client, "SELECT 1").await, "1", "busy: not closed");
    let started = Instant::now();
    let ended = tokio::time::timeout(CALL_TIMEOUT, closed)
        .await
        .expect("closed within the timeout")
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
    let e = ended.expect_err("closed with an error");
    let db = e.as_db_error().unwrap_or_else(|| panic!("{e:?}"));
    assert_eq!(db.code().code(), "57P05");
    assert!(
        db.message().contains("client_idle_timeout"),
        "{}",
        db.message()
    );
}

/// A client quiet inside a transaction for longer than
/// `idle_transaction_timeout` is told (25P03), its transaction rolled back,
/// and its server connection returned: with a pool of one, the next client
/// gets it at once and the row is not there.
#[tokio::test]
async fn idle_in_transaction_is_rolled_back_and_the_server_returned() {
    let cfg = PgProxyConfig::new(&cluster().primary().addr())
        .pool_size(1)
        .extra("idle_transaction_timeout = \"1s\"")
        .extra("pool_timeout = \"3s\"");
    let (_p, cfg) = start(cfg);
    let port: u16 = cfg.listen.rsplit_once(':').unwrap().1.parse().unwrap();
    let mut c = tokio_postgres::Config::new();
    c.host("127.0.0.1")
        .port(port)
        .user(APP_USER)
        .password(APP_PASSWORD)
        .dbname(APP_DB);
    let (client, conn) = c.connect(NoTls).await.expect("connect");
    let closed = tokio::spawn(conn);
    exec(&client, "BEGIN; INSERT INTO ses_rows VALUES (-25003)")
        .await
        .unwrap();
    let ended = tokio::time::timeout(CALL_TIMEOUT, closed)
        .await
        .expect("closed within the timeout")
        .unwrap();
    let e = ended.expect_err("closed with an error");
    let db = e.as_db_error().unwrap_or_else(|| panic!("{e:?}"));
    assert_eq!(db.code().code(), "25P03");
    assert!(db.message().contains("rolled back"), "{}", db.message());
    let other = pg_connect(&cfg).await;
    let started = Instant::now();
    assert_eq!(
        one(&other, "SELECT count(*) FROM ses_rows WHERE id = -25003").await,
        "0"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the server connection came back: {:?}",
        started.elapsed()
    );
}

/// `query_timeout`: a statement the server has been silent on this long is
/// cancelled there (a CancelRequest); the client gets PostgreSQL's 57014 and
/// its session goes on. A pipeline of quick statements is never cut.
#[tokio::test]
async fn query_timeout_cancels_a_silent_statement_and_the_session_goes_on() {
    let cfg = PgProxyConfig::new(&cluster().primary().addr()).extra("query_timeout = \"500ms\"");
    let (_p, cfg) = start(cfg);
    let client = pg_connect(&cfg).await;
    let started = Instant::now();
    let e = client
        .simple_query("SELECT pg_sleep(10)")
        .await
        .expect_err("cancelled");
    let db = e.as_db_error().unwrap_or_else(|| panic!("{e:?}"));
    assert_eq!(db.code().code(), "57014", "{}", db.message());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(one(&client, "SELECT 6 * 7").await, "42");
    // Quick statements, one after another for longer than the limit.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1200) {
        assert_eq!(
            one(&client, "SELECT pg_sleep(0.05)::text || 'x'").await,
            "x"
        );
    }
}
