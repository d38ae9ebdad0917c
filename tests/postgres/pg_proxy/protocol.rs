//! The PostgreSQL protocol through Fulcrum: simple, extended and pipelined
//! queries, prepared statements across server connections and their cap,
//! statement errors, DEALLOCATE, SET through the extended protocol, COPY,
//! notices and parameter status, and psql.

use std::time::Duration;

use fulcrum_suite::pg_connect_as;
use fulcrum_testkit::{run_psql, APP_DB, APP_MD5_USER, APP_PASSWORD, APP_USER};
use futures_util::{SinkExt, StreamExt, TryStreamExt};
use tokio_postgres::{AsyncMessage, NoTls, SimpleQueryMessage};

use super::helpers::{default_config, one_string, primary_only_config, proxy};

#[tokio::test]
async fn simple_extended_and_pipelined_queries_return_server_results() {
    let (_p, cfg) = proxy(default_config());
    let client = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    assert_eq!(one_string(&client, "SELECT 40 + 2").await, "42");
    let row = client
        .query_one("SELECT $1::int * 2, $2::text", &[&21i32, &"x"])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 42);
    assert_eq!(row.get::<_, &str>(1), "x");
    // tokio-postgres pipelines concurrent queries on one connection.
    let stmt = client.prepare("SELECT $1::int + 1").await.unwrap();
    let futures = (0..50).map(|i| {
        let client = &client;
        let stmt = &stmt;
        async move {
            client
                .query_one(stmt, &[&i])
                .await
                .map(|r| r.get::<_, i32>(0))
        }
    });
    let results = futures_util::future::join_all(futures).await;
    for (i, r) in results.into_iter().enumerate() {
        assert_eq!(r.unwrap(), i as i32 + 1);
    }
    // Several statements in one simple query.
    let msgs = client
        .simple_query("SELECT 1; SELECT 2; SELECT 3")
        .await
        .unwrap();
    let rows = msgs
        .iter()
        .filter(|m| matches!(m, SimpleQueryMessage::Row(_)))
        .count();
    assert_eq!(rows, 3);
    // A server error passes through unchanged and the session goes on.
    let err = client
        .simple_query("SELECT * FROM no_such_table")
        .await
        .unwrap_err();
    assert_eq!(err.code().unwrap().code(), "42P01");
    assert_eq!(
        one_string(&client, "SELECT 'still here'").await,
        "still here"
    );
}

#[tokio::test]
async fn prepared_statements_work_across_server_connections() {
    // Two server connections and six clients: every client's statements must
    // keep working whichever server connection its next transaction lands on.
    let (_p, cfg) = proxy(default_config().pool_size(2));
    let mut tasks = Vec::new();
    for c in 0..6i32 {
        let cfg = cfg.clone();
        tasks.push(tokio::spawn(async move {
            let client = pg_connect_as(&cfg, APP_USER, APP_DB).await;
            let add = client.prepare("SELECT $1::int + $2::int").await.unwrap();
            let tag = client
                .prepare(&format!("SELECT 'client{c}'::text, $1::int"))
                .await
                .unwrap();
            for i in 0..40i32 {
                let r = client.query_one(&add, &[&i, &c]).await.unwrap();
                assert_eq!(r.get::<_, i32>(0), i + c);
                let r = client.query_one(&tag, &[&i]).await.unwrap();
                assert_eq!(r.get::<_, &str>(0), format!("client{c}"));
                if i % 10 == 0 {
                    // A transaction spanning several statements stays on one connection.
                    let tx = client.simple_query("BEGIN").await;
                    tx.unwrap();
                    client.query_one(&add, &[&1i32, &1i32]).await.unwrap();
                    client.simple_query("COMMIT").await.unwrap();
                }
            }
            drop(add); // Close of a statement, answered by Fulcrum.
            let again = client.prepare("SELECT $1::int + $2::int").await.unwrap();
            assert_eq!(
                client
                    .query_one(&again, &[&2i32, &3i32])
                    .await
                    .unwrap()
                    .get::<_, i32>(0),
                5
            );
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn protocol_statement_errors_keep_the_session_usable() {
    let (_p, cfg) = proxy(default_config().pool_size(1));
    let client = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    let err = client
        .prepare("SELECT * FROM missing_table_x")
        .await
        .unwrap_err();
    assert_eq!(err.code().unwrap().code(), "42P01");
    let stmt = client.prepare("SELECT 1/$1::int").await.unwrap();
    let err = client.query_one(&stmt, &[&0i32]).await.unwrap_err();
    assert_eq!(err.code().unwrap().code(), "22012");
    assert_eq!(
        client
            .query_one(&stmt, &[&1i32])
            .await
            .unwrap()
            .get::<_, i32>(0),
        1
    );
}

#[tokio::test]
async fn sql_deallocate_of_a_protocol_statement_is_answered() {
    let (_p, cfg) = proxy(default_config().pool_size(1));
    let client = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    let stmt = client.prepare("SELECT 7").await.unwrap();
    assert_eq!(
        client.query_one(&stmt, &[]).await.unwrap().get::<_, i32>(0),
        7
    );
    // tokio-postgres names statements s0, s1, ...
    client.batch_execute("DEALLOCATE ALL").await.unwrap();
    let stmt = client.prepare("SELECT 8").await.unwrap();
    assert_eq!(
        client.query_one(&stmt, &[]).await.unwrap().get::<_, i32>(0),
        8
    );
}

#[tokio::test]
async fn copy_in_and_copy_out_stream_through() {
    let (_p, cfg) = proxy(default_config());
    let client = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS copy_t (a int, b text); TRUNCATE copy_t")
        .await
        .unwrap();
    let sink = client.copy_in("COPY copy_t FROM STDIN").await.unwrap();
    futures_util::pin_mut!(sink);
    let mut data = String::new();
    for i in 0..5000 {
        data.push_str(&format!("{i}\trow {i}\n"));
    }
    sink.send(bytes::Bytes::from(data.clone())).await.unwrap();
    let n = sink.finish().await.unwrap();
    assert_eq!(n, 5000);
    let out = client
        .copy_out("COPY (SELECT * FROM copy_t ORDER BY a) TO STDOUT /* fulcrum:primary */")
        .await
        .unwrap();
    let chunks: Vec<bytes::Bytes> = out.try_collect().await.unwrap();
    let text: Vec<u8> = chunks.concat();
    assert_eq!(String::from_utf8(text).unwrap(), data);
}

#[tokio::test]
async fn notices_and_parameter_status_reach_the_client() {
    let cfg = default_config();
    let (_p, cfg) = proxy(cfg);
    let (client, mut conn) = tokio_postgres::connect(&cfg.conn_string(APP_USER, APP_DB), NoTls)
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut stream = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
    tokio::spawn(async move {
        while let Some(Ok(m)) = stream.next().await {
            if let AsyncMessage::Notice(n) = m {
                let _ = tx.send(n.message().to_owned());
            }
        }
    });
    client
        .batch_execute("DO $$ BEGIN RAISE NOTICE 'hello from the server'; END $$")
        .await
        .unwrap();
    let notice = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(notice, "hello from the server");
    // ParameterStatus: psql shows the server's reported standard_conforming_strings etc.
    let out = run_psql(
        &cfg.listen,
        APP_USER,
        APP_PASSWORD,
        APP_DB,
        "SHOW server_version_num",
    )
    .unwrap();
    assert!(out.starts_with("15"), "{out}");
}

#[tokio::test]
async fn psql_runs_queries_and_scripts() {
    let (_p, cfg) = proxy(default_config());
    let out = run_psql(
        &cfg.listen,
        APP_USER,
        APP_PASSWORD,
        APP_DB,
        "SELECT 1; SELECT 'two'",
    )
    .unwrap();
    assert_eq!(out, "1\ntwo");
    let out = run_psql(
        &cfg.listen,
        APP_MD5_USER,
        APP_PASSWORD,
        APP_DB,
        "SELECT current_user",
    )
    .unwrap();
    assert_eq!(
        out, APP_MD5_USER,
        "server-side md5 auth with the configured password"
    );
}

#[tokio::test]
async fn set_sent_through_the_extended_protocol_is_replayed_too() {
    let (_p, cfg) = proxy(default_config().pool_size(1));
    let a = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    let b = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    // tokio-postgres' execute() uses Parse/Bind/Execute.
    a.execute("SET statement_timeout = '4321ms'", &[])
        .await
        .unwrap();
    for _ in 0..4 {
        // Reads rotate over both replicas; each server connection gets the setting.
        let row = a
            .query_one("SELECT current_setting('statement_timeout')", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, &str>(0), "4321ms");
        let row = b
            .query_one("SELECT current_setting('statement_timeout')", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, &str>(0), "0");
    }
}

/// A connection never holds more than `max_prepared_statements` shared
/// statements between units: the least recently used are closed on the
/// server (PgBouncer's rule) instead of the connection being dropped.
#[tokio::test]
async fn a_connection_keeps_at_most_max_prepared_statements() {
    let (_p, cfg) = proxy(
        primary_only_config()
            .pool_size(1)
            .extra("max_prepared_statements = 3"),
    );
    let a = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    let pid = one_string(&a, "SELECT pg_backend_pid() + 0").await;
    for i in 0..5 {
        let s = a.prepare(&format!("SELECT {i}::int")).await.unwrap();
        a.query_one(&s, &[]).await.unwrap();
    }
    assert_eq!(
        one_string(&a, "SELECT count(*) FROM pg_prepared_statements").await,
        "3",
        "the least recently used were closed"
    );
    assert_eq!(
        one_string(&a, "SELECT pg_backend_pid() + 0").await,
        pid,
        "the connection is kept"
    );
}
