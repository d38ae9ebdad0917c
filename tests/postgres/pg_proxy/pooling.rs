//! Server connections shared by clients: waiting past the pool then a clear
//! timeout, vanished clients rolled back, broken connections replaced, two
//! thousand clients on twenty connections, backends over a unix socket, and
//! `server_lifetime`.

use std::time::{Duration, Instant};

use fulcrum_suite::{pg_connect_as, PgProxyConfig};
use fulcrum_testkit::{APP_DB, APP_PLAIN_USER, APP_USER};
use tokio_postgres::NoTls;

use super::helpers::{cluster, default_config, one_string, primary_only_config, proxy};

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
