//! End-to-end behaviour of the PostgreSQL data path: real clients (tokio-postgres,
//! psql) through a real Fulcrum daemon in front of a real primary with two
//! streaming replicas, started once for this test binary (shared with
//! `pg_drivers`).

use std::sync::Once;
use std::time::{Duration, Instant};

use fulcrum_suite::{pg_connect_as, pg_two_replicas, PgProxyConfig};
use fulcrum_testkit::{
    run_psql, FulcrumProcess, PgCluster, APP_DB, APP_MD5_USER, APP_PASSWORD, APP_PLAIN_USER,
    APP_USER,
};
use futures_util::{SinkExt, StreamExt, TryStreamExt};
use tokio_postgres::{AsyncMessage, Client, NoTls, SimpleQueryMessage};

/// The binary's shared primary with two replicas, with this module's table.
fn cluster() -> &'static PgCluster {
    static TABLE: Once = Once::new();
    let c = pg_two_replicas();
    TABLE.call_once(|| {
        c.primary()
            .sql("CREATE TABLE IF NOT EXISTS items (id serial PRIMARY KEY, tag text, n int); GRANT ALL ON items TO PUBLIC; GRANT ALL ON SEQUENCE items_id_seq TO PUBLIC")
            .expect("create table");
    });
    c
}

/// Fulcrum in front of the shared cluster (primary and both replicas configured).
fn proxy(config: PgProxyConfig) -> (FulcrumProcess, PgProxyConfig) {
    let p = FulcrumProcess::start(&config.to_toml()).expect("start fulcrum");
    (p, config)
}

/// Fulcrum with the primary only (tests that need every query on one server).
fn primary_only_config() -> PgProxyConfig {
    PgProxyConfig::new(&cluster().primary().addr())
}

fn default_config() -> PgProxyConfig {
    let c = cluster();
    let mut cfg = PgProxyConfig::new(&c.primary().addr());
    for r in c.replicas() {
        cfg = cfg.replica(&r.addr());
    }
    cfg
}

async fn one_string(client: &Client, sql: &str) -> String {
    let rows = client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("").to_owned()),
            _ => None,
        })
        .expect("one row")
}

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
async fn clients_beyond_the_pool_wait_then_get_a_clear_timeout() {
    let (_p, cfg) = proxy(
        primary_only_config()
            .pool_size(1)
            .extra("pool_timeout = \"700ms\""),
    );
    let a = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    a.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let b = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    let started = Instant::now();
    let err = b.simple_query("SELECT 1").await.unwrap_err();
    let waited = started.elapsed();
    let db = err.as_db_error().expect("a server-style error");
    assert_eq!(db.code().code(), "53300");
    assert!(db.message().contains("pool_timeout"), "{}", db.message());
    assert!(waited >= Duration::from_millis(600), "{waited:?}");
    a.batch_execute("COMMIT").await.unwrap();
    let c = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    assert_eq!(one_string(&c, "SELECT 'after'").await, "after");
}

#[tokio::test]
async fn vanished_client_mid_transaction_is_rolled_back_and_the_connection_reused() {
    let (p, cfg) = proxy(default_config().pool_size(1));
    let (a, conn) = tokio_postgres::connect(&cfg.conn_string(APP_USER, APP_DB), NoTls)
        .await
        .unwrap();
    let conn_task = tokio::spawn(conn);
    a.batch_execute("BEGIN; INSERT INTO items (tag, n) VALUES ('vanished', 1)")
        .await
        .unwrap();
    // Drop the socket without Terminate.
    conn_task.abort();
    drop(a);
    let b = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    assert_eq!(
        one_string(&b, "SELECT count(*) FROM items WHERE tag = 'vanished'").await,
        "0"
    );
    assert_eq!(
        one_string(
            &b,
            "SELECT coalesce(txid_current_if_assigned()::text, 'none')"
        )
        .await,
        "none"
    );
    assert!(p.try_wait().is_none());
}

#[tokio::test]
async fn broken_server_connections_are_replaced() {
    let (_p, cfg) = proxy(primary_only_config().pool_size(1));
    let a = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    let pid_before = one_string(&a, "SELECT pg_backend_pid() + 0").await;
    cluster()
        .primary()
        .sql(&format!("SELECT pg_terminate_backend({pid_before})"))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The idle pooled connection is dead; the next transaction gets a new one.
    let pid_after = one_string(&a, "SELECT pg_backend_pid() + 0").await;
    assert_ne!(pid_before, pid_after);
    let b = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    assert_eq!(one_string(&b, "SELECT 1").await, "1");
}

#[tokio::test]
async fn two_thousand_clients_share_twenty_server_connections() {
    fulcrum_testkit::raise_fd_limit();
    // md5 keeps 2,000 logins cheap for the client side; app_plain is used by
    // no other test, so its server connections are this test's alone.
    // app_plain's server login is `password`: cleartext, allowed on loopback.
    let (_p, cfg) = proxy(
        default_config()
            .pool_size(20)
            .client_auth("md5")
            .extra("server_cleartext = true"),
    );
    let n = 2000;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let cfg = cfg.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let client = pg_connect_as(&cfg, APP_PLAIN_USER, APP_DB).await;
            barrier.wait().await; // all 2,000 connected at once
            for _ in 0..2 {
                let r = client
                    .query_one("SELECT $1::int", &[&(i as i32)])
                    .await
                    .unwrap();
                assert_eq!(r.get::<_, i32>(0), i as i32);
            }
            client
                .simple_query("BEGIN; SELECT 1; COMMIT")
                .await
                .unwrap();
        }));
    }
    let all = tokio::time::timeout(
        Duration::from_secs(240),
        futures_util::future::join_all(tasks),
    )
    .await
    .expect("2,000 clients finished in time");
    let failed = all.iter().filter(|r| r.is_err()).count();
    assert_eq!(failed, 0, "clients failed");
    let server_conns: u32 = cluster()
        .primary()
        .sql("SELECT count(*) FROM pg_stat_activity WHERE usename = 'app_plain'")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        server_conns <= 20,
        "at most pool_size server connections: {server_conns}"
    );
    eprintln!("2,000 clients done in {:?}", started.elapsed());
}

#[tokio::test]
async fn backends_can_be_reached_over_a_unix_socket() {
    let primary = cluster().primary();
    let address = format!("{}:{}", primary.socket_dir().display(), primary.port());
    let (_p, cfg) = proxy(PgProxyConfig::new(&address));
    let client = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    // A Unix-socket session has no server address.
    assert_eq!(
        one_string(&client, "SELECT coalesce(inet_server_port()::text, 'unix')").await,
        "unix"
    );
    let row = client
        .query_one("SELECT $1::int + 1", &[&41i32])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 42);
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

/// `server_lifetime`: a server connection older than it is closed (when it
/// comes back to the pool, or when found idle), and the next unit gets a
/// fresh one, which is then reused while young.
#[tokio::test]
async fn server_connections_are_renewed_after_server_lifetime() {
    let (_p, cfg) = proxy(
        primary_only_config()
            .pool_size(1)
            .extra("server_lifetime = \"1s\""),
    );
    let a = pg_connect_as(&cfg, APP_USER, APP_DB).await;
    let pid = one_string(&a, "SELECT pg_backend_pid() + 0").await;
    assert_eq!(
        one_string(&a, "SELECT pg_backend_pid() + 0").await,
        pid,
        "young: reused"
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // Idle past its lifetime: not handed out again.
    let later = one_string(&a, "SELECT pg_backend_pid() + 0").await;
    assert_ne!(later, pid, "renewed after its lifetime");
    assert_eq!(one_string(&a, "SELECT pg_backend_pid() + 0").await, later);
}
