//! Session state through a pool: settings that do not leak between clients,
//! temporary tables pinning a client, session mode, cancel reaching only its
//! client, and COMMIT AND CHAIN after a lone BEGIN.

use std::time::{Duration, Instant};

use fulcrum_suite::pg_connect_as;
use fulcrum_testkit::{APP_DB, APP_PASSWORD, APP_USER};
use tokio_postgres::NoTls;

use super::helpers::{default_config, one_string, primary_only_config, proxy};

#[tokio::test]
async fn session_settings_do_not_leak_between_clients() {
    // One server connection: both clients are served by the same server session.
    let (_p, cfg) = proxy(default_config().pool_size(1));
    let a = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    let b = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    let default_path = one_string(&b, "SHOW search_path").await;
    let default_work_mem = one_string(&b, "SHOW work_mem").await;
    a.batch_execute("SET search_path TO pg_catalog, public")
        .await
        .unwrap();
    a.batch_execute("SET statement_timeout = '12345ms'")
        .await
        .unwrap();
    assert_eq!(one_string(&b, "SHOW search_path").await, default_path);
    assert_eq!(one_string(&b, "SHOW statement_timeout").await, "0");
    assert_eq!(
        one_string(&a, "SHOW search_path").await,
        "pg_catalog, public"
    );
    assert_eq!(one_string(&a, "SHOW statement_timeout").await, "12345ms");
    // A SET inside a rolled-back transaction is undone, in a committed one kept.
    a.batch_execute("BEGIN; SET work_mem = '7MB'; ROLLBACK")
        .await
        .unwrap();
    assert_ne!(one_string(&a, "SHOW work_mem").await, "7MB");
    a.batch_execute("BEGIN").await.unwrap();
    a.batch_execute("SET work_mem = '9MB'").await.unwrap();
    a.batch_execute("COMMIT").await.unwrap();
    assert_eq!(one_string(&b, "SHOW work_mem").await, default_work_mem);
    assert_eq!(one_string(&a, "SHOW work_mem").await, "9MB");
    // SET LOCAL stays in its transaction.
    a.batch_execute("BEGIN; SET LOCAL statement_timeout = '1s'; COMMIT")
        .await
        .unwrap();
    assert_eq!(one_string(&a, "SHOW statement_timeout").await, "12345ms");
    // RESET goes back to the default.
    a.batch_execute("RESET statement_timeout").await.unwrap();
    assert_eq!(one_string(&a, "SHOW statement_timeout").await, "0");
    // Startup parameters are per client too.
    assert_eq!(one_string(&b, "SHOW application_name").await, "");
    let (c, conn) = tokio_postgres::Config::new()
        .host("127.0.0.1")
        .port(cfg.listen.rsplit_once(':').unwrap().1.parse().unwrap())
        .user(APP_USER)
        .password(APP_PASSWORD)
        .dbname(APP_DB)
        .application_name("client-c")
        .connect(NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    assert_eq!(one_string(&c, "SHOW application_name").await, "client-c");
    assert_eq!(one_string(&b, "SHOW application_name").await, "");
}

#[tokio::test]
async fn temporary_tables_pin_the_client_to_its_server_connection() {
    let (_p, cfg) = proxy(default_config().pool_size(2));
    let a = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    a.batch_execute("CREATE TEMP TABLE scratch (x int)")
        .await
        .unwrap();
    for i in 0..20 {
        a.execute("INSERT INTO scratch VALUES ($1)", &[&i])
            .await
            .unwrap();
        // Another client keeps the other connection busy in between.
        let b = pg_connect_as(&cfg, APP_USER, APP_DB).await;
        b.simple_query("SELECT 1").await.unwrap();
    }
    assert_eq!(one_string(&a, "SELECT count(*) FROM scratch").await, "20");
}

#[tokio::test]
async fn session_mode_keeps_state_and_resets_it_for_the_next_client() {
    let (_p, cfg) = proxy(default_config().pool_mode("session").pool_size(1));
    {
        let a = pg_connect_as(&cfg, APP_USER, APP_DB).await;
        a.batch_execute("SET search_path TO pg_catalog; CREATE TEMP TABLE t_session (x int)")
            .await
            .unwrap();
        a.batch_execute("INSERT INTO t_session VALUES (1)")
            .await
            .unwrap();
        assert_eq!(one_string(&a, "SELECT count(*) FROM t_session").await, "1");
        assert_eq!(one_string(&a, "SHOW search_path").await, "pg_catalog");
    }
    // The same (only) server connection serves the next client, reset.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let b = pg_connect_as(&cfg, APP_USER, APP_DB).await;
        match b.simple_query("SELECT count(*) FROM t_session").await {
            Err(e) => {
                assert_eq!(e.code().unwrap().code(), "42P01");
                assert_ne!(one_string(&b, "SHOW search_path").await, "pg_catalog");
                break;
            }
            Ok(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Ok(_) => panic!("temp table of the previous client is visible"),
        }
    }
}

#[tokio::test]
async fn cancel_reaches_only_the_cancelled_clients_query() {
    let (_p, cfg) = proxy(default_config());
    let a = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    let b = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    let token = a.cancel_token();
    let slow_b = tokio::spawn(async move {
        b.simple_query("SELECT pg_sleep(1.5), 'b'")
            .await
            .map(|_| ())
    });
    let started = Instant::now();
    let slow_a =
        tokio::spawn(async move { a.simple_query("SELECT pg_sleep(30)").await.map(|_| ()) });
    // A cancel that arrives before the query reached a server has nothing
    // to cancel (as with PostgreSQL itself): on a loaded machine, send it
    // again until the query ends.
    tokio::time::sleep(Duration::from_millis(300)).await;
    while !slow_a.is_finished() && started.elapsed() < Duration::from_secs(8) {
        token.cancel_query(NoTls).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let err = slow_a.await.unwrap().unwrap_err();
    assert_eq!(err.code().unwrap().code(), "57014", "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    slow_b
        .await
        .unwrap()
        .expect("the other client's query is not cancelled");
}

#[tokio::test]
async fn commit_and_chain_after_a_lone_begin_opens_a_new_transaction() {
    let (_p, cfg) = proxy(primary_only_config());
    let client = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS chained (n int)")
        .await
        .unwrap();
    client.batch_execute("BEGIN").await.unwrap();
    client.batch_execute("COMMIT AND CHAIN").await.unwrap();
    // Still in a transaction: this insert goes away with the ROLLBACK.
    client
        .batch_execute("INSERT INTO chained VALUES (1)")
        .await
        .unwrap();
    client.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        one_string(&client, "SELECT count(*)::text FROM chained").await,
        "0",
        "the chained transaction was rolled back"
    );
}
