//! Pool sizes and server checks: `min_pool_size` and its reserve,
//! `max_db_connections` across users, `server_check_delay`, and warming at
//! start.

use std::time::{Duration, Instant};

use fulcrum_suite::{metric_sum, pg_connect, pg_connect_as, start_with_metrics, PgProxyConfig};
use fulcrum_testkit::{FulcrumProcess, APP_USER};

use super::helpers::{cluster, exec, one, start, CALL_TIMEOUT};

/// A database of the test's own on the shared cluster (other tests' server
/// connections would count otherwise).
fn own_database(name: &str) -> &str {
    let exists = cluster()
        .primary()
        .sql(&format!(
            "SELECT count(*) FROM pg_database WHERE datname = '{name}'"
        ))
        .expect("look");
    if exists.trim() == "0" {
        cluster()
            .primary()
            .sql(&format!("CREATE DATABASE {name}"))
            .expect("create database");
    }
    name
}

/// Server connections to `db`, counted on the primary.
fn server_connections(db: &str) -> usize {
    let n = cluster()
        .primary()
        .sql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = '{db}' AND pid <> pg_backend_pid()"
        ))
        .expect("count");
    n.trim().parse().unwrap_or_else(|_| panic!("{n:?}"))
}

/// `min_pool_size` opens the pool's connections before clients need them;
/// `reserve_pool_size` serves a client that waited `reserve_pool_timeout`
/// when the pool is busy; past both, the client gets 53300 after
/// `pool_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_pool_size_keeps_connections_open_and_the_reserve_serves_waiters() {
    let user = fulcrum_testkit::APP_TRUST_USER;
    let db = own_database("budget_min");
    let cfg = PgProxyConfig::new(&cluster().primary().addr())
        .pool_size(2)
        .extra("min_pool_size = 2")
        .extra("reserve_pool_size = 1")
        .extra("reserve_pool_timeout = \"300ms\"")
        .extra("pool_timeout = \"2s\"");
    let (_p, cfg) = start(cfg);
    let first = pg_connect_as(&cfg, user, db).await;
    one(&first, "SELECT 1").await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while server_connections(db) < 2 {
        assert!(Instant::now() < deadline, "min_pool_size = 2 never reached");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Two transactions hold the pool's two connections.
    let (a, b) = (
        pg_connect_as(&cfg, user, db).await,
        pg_connect_as(&cfg, user, db).await,
    );
    for c in [&a, &b] {
        exec(c, "BEGIN; SELECT txid_current()").await.unwrap();
    }
    // A connection the server is still tearing down may show for a moment.
    let settle = Instant::now() + Duration::from_secs(2);
    while server_connections(db) != 2 {
        assert!(
            Instant::now() < settle,
            "the warm ones were used, no more: {}",
            cluster()
                .primary()
                .sql(&format!("SELECT string_agg(pid || ' ' || state || ' ' || query || ' ' || backend_start, E'\\n') FROM pg_stat_activity WHERE datname = '{db}'"))
                .unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started = Instant::now();
    one(&first, "SELECT 2").await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_millis(1800),
        "served from the reserve after reserve_pool_timeout: {waited:?}"
    );
    assert_eq!(server_connections(db), 3, "one reserve connection");
    // The reserve held too: the next client waits pool_timeout and is told.
    exec(&first, "BEGIN; SELECT txid_current()").await.unwrap();
    let late = pg_connect_as(&cfg, user, db).await;
    let err = tokio::time::timeout(CALL_TIMEOUT, late.simple_query("SELECT 3"))
        .await
        .expect("answered")
        .unwrap_err();
    let e = err.as_db_error().expect("an ErrorResponse");
    assert_eq!(e.code().code(), "53300", "{e:?}");
    assert!(e.message().contains("pool of 2 is busy"), "{e:?}");
    for c in [&a, &b, &first] {
        exec(c, "COMMIT").await.unwrap();
    }
    assert!(server_connections(db) <= 3);
}

/// `max_db_connections` caps the server connections to one database across
/// users: at the cap a client of another user gets 53300 after
/// `pool_timeout`, naming the cap; once a connection is idle, the next
/// client closes it to make room instead of waiting for
/// `server_idle_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_db_connections_caps_connections_across_users() {
    use fulcrum_testkit::{APP_MD5_USER, APP_TRUST_USER};
    let db = own_database("budget_cap");
    let cfg = PgProxyConfig::new(&cluster().primary().addr())
        .pool_size(5)
        .extra("max_db_connections = 2")
        .extra("pool_timeout = \"1s\"");
    let (_p, cfg) = start(cfg);
    let a = pg_connect_as(&cfg, APP_TRUST_USER, db).await;
    let b = pg_connect_as(&cfg, APP_MD5_USER, db).await;
    for c in [&a, &b] {
        exec(c, "BEGIN; SELECT txid_current()").await.unwrap();
    }
    let c = pg_connect_as(&cfg, APP_TRUST_USER, db).await;
    let err = tokio::time::timeout(CALL_TIMEOUT, c.simple_query("SELECT 1"))
        .await
        .expect("answered")
        .unwrap_err();
    let e = err.as_db_error().expect("an ErrorResponse");
    assert_eq!(e.code().code(), "53300", "{e:?}");
    assert!(
        e.message()
            .contains(&format!("max_db_connections (2) for database \"{db}\"")),
        "{e:?}"
    );
    exec(&a, "COMMIT").await.unwrap();
    // The trust user's connection is idle now; the md5 user's next client
    // takes its place at once.
    let d = pg_connect_as(&cfg, APP_MD5_USER, db).await;
    let started = Instant::now();
    one(&d, "SELECT 4").await;
    assert!(
        started.elapsed() < Duration::from_millis(800),
        "no wait for room"
    );
    // The connection closed to make room leaves pg_stat_activity when its
    // backend has exited, which a busy server may take a moment to do.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut total = server_connections(db);
    while total > 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        total = server_connections(db);
    }
    assert!(total <= 2, "{total} server connections to {db}");
    exec(&b, "COMMIT").await.unwrap();
}

/// `server_check_delay = "0s"` checks every idle connection with a round
/// trip before reuse: a live connection passes, so the client keeps being
/// served by the same server process, and the answers are unchanged. Each
/// check is counted in `fulcrum_server_checks_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_check_delay_checks_reused_connections_and_keeps_live_ones() {
    let cfg = PgProxyConfig::new(&cluster().primary().addr())
        .pool_size(1)
        .extra("server_check_delay = \"0s\"");
    let (_p, metrics_port) = start_with_metrics(&cfg.to_toml());
    let client = pg_connect(&cfg).await;
    let first = one(&client, "SELECT pg_backend_pid() + 0").await;
    for i in 0..20 {
        assert_eq!(one(&client, &format!("SELECT {i}")).await, i.to_string());
        assert_eq!(one(&client, "SELECT pg_backend_pid() + 0").await, first);
    }
    // 41 units on one pooled connection: every one after the first reused
    // it, checked. The counter is updated before the connection is handed
    // out, so all 40 are in.
    let passed = metric_sum(
        metrics_port,
        "fulcrum_server_checks_total",
        "outcome=\"passed\"",
    );
    assert!(passed >= 40, "40 checks passed, counted {passed}");
    assert_eq!(
        metric_sum(
            metrics_port,
            "fulcrum_server_checks_total",
            "outcome=\"failed\""
        ),
        0
    );
}

/// `min_pool_size` with `[[cluster.database]]` listed: the pools of every
/// configured user and listed database are opened at start, before any
/// client connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_pool_size_warms_configured_users_and_databases_at_start() {
    let db = own_database("budget_warm");
    let cfg = PgProxyConfig::new(&cluster().primary().addr())
        .pool_size(3)
        .extra("min_pool_size = 2")
        // app_plain's server login is `password` (cleartext, on loopback).
        .extra("server_cleartext = true")
        .extra(&format!("[[cluster.database]]\nname = \"{db}\""));
    // `extra` lines go before the backends: the database table must not
    // swallow them, so it is moved to the end.
    let toml = cfg.to_toml();
    let (head, rest) = toml
        .split_once(&format!("[[cluster.database]]\nname = \"{db}\"\n"))
        .unwrap();
    let toml = format!("{head}{rest}\n[[cluster.database]]\nname = \"{db}\"\n");
    let _p = FulcrumProcess::start(&toml).expect("start fulcrum");
    let users = [
        APP_USER,
        fulcrum_testkit::APP_MD5_USER,
        fulcrum_testkit::APP_PLAIN_USER,
        fulcrum_testkit::APP_TRUST_USER,
    ];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let per_user = cluster()
            .primary()
            .sql(&format!(
                "SELECT string_agg(usename || '=' || n, ',' ORDER BY usename) FROM \
                 (SELECT usename, count(*) AS n FROM pg_stat_activity WHERE datname = '{db}' GROUP BY usename) s"
            ))
            .unwrap();
        let warm = users
            .iter()
            .all(|u| per_user.split(',').any(|e| e == format!("{u}=2")));
        if warm {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "every configured user's pool warmed to 2 without a client: {per_user:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
