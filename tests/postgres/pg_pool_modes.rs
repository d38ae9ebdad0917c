//! Statement pooling and per-user pool settings (PgBouncer's `[users]`)
//! through a real Fulcrum in front of the shared primary: statement mode
//! refuses a transaction block with PgBouncer's words and still shares one
//! server connection between clients; a session-mode user keeps its
//! temporary table in a transaction-pooled cluster; a user's `pool_size`
//! and `max_user_connections` cap its server connections (counted in
//! pg_stat_activity). Each test logs in as a role of its own, so the
//! counts see no other test's connections.

use std::sync::Once;
use std::time::{Duration, Instant};

use fulcrum_suite::{pg_connect_as, pg_two_replicas, try_pg_connect_as, PgProxyConfig};
use fulcrum_testkit::{FulcrumProcess, PgCluster, APP_DB, APP_PASSWORD};
use tokio_postgres::{Client, SimpleQueryMessage};

/// Roles of this module, one per test.
const STMT_USER: &str = "pm_statement";
const SESSION_USER: &str = "pm_session";
const TXN_USER: &str = "pm_transaction";
const SIZED_USER: &str = "pm_sized";
const CAPPED_USER: &str = "pm_capped";
const OTHER_USER: &str = "pm_other";
const WAITING_USER: &str = "pm_waiting";

fn cluster() -> &'static PgCluster {
    static ROLES: Once = Once::new();
    let c = pg_two_replicas();
    ROLES.call_once(|| {
        let mut script = String::new();
        for role in [
            STMT_USER,
            SESSION_USER,
            TXN_USER,
            SIZED_USER,
            CAPPED_USER,
            OTHER_USER,
            WAITING_USER,
        ] {
            script.push_str(&format!(
                "CREATE ROLE {role} LOGIN PASSWORD '{APP_PASSWORD}';\n"
            ));
        }
        c.primary()
            .sql_script("postgres", &script)
            .expect("create roles");
    });
    c
}

/// Fulcrum in front of the primary alone, as `cfg` says.
fn start(cfg: PgProxyConfig) -> (FulcrumProcess, PgProxyConfig) {
    let p = FulcrumProcess::start(&cfg.to_toml()).expect("start fulcrum");
    (p, cfg)
}

fn primary_config() -> PgProxyConfig {
    PgProxyConfig::new(&cluster().primary().addr())
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

/// Server connections of `role` on the primary now.
fn server_connections(role: &str) -> usize {
    cluster()
        .primary()
        .sql_db(
            "postgres",
            &format!("SELECT count(*) FROM pg_stat_activity WHERE usename = '{role}'"),
        )
        .expect("count")
        .trim()
        .parse()
        .expect("a count")
}

/// The most server connections of `role` seen while `clients` clients of
/// it each run `pg_sleep(0.4)` three times at once through `cfg`.
async fn most_connections_under_load(cfg: &PgProxyConfig, role: &str, clients: usize) -> usize {
    let mut conns = Vec::new();
    for _ in 0..clients {
        conns.push(pg_connect_as(cfg, role, APP_DB).await);
    }
    let load = tokio::spawn(async move {
        let runs = conns.iter().map(|c| async move {
            for _ in 0..3 {
                c.simple_query("SELECT pg_sleep(0.4)").await.expect("sleep");
            }
        });
        futures_util::future::join_all(runs).await;
    });
    let mut most = 0;
    while !load.is_finished() {
        let role = role.to_owned();
        most = most.max(
            tokio::task::spawn_blocking(move || server_connections(&role))
                .await
                .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    load.await.expect("load");
    most
}

#[tokio::test]
async fn statement_mode_refuses_begin_with_pgbouncers_words_and_shares_one_connection() {
    let (_p, cfg) = start(
        primary_config()
            .pool_mode("statement")
            .pool_size(1)
            .extra("pool_timeout = \"2s\"")
            .user_keys(STMT_USER, ""),
    );
    let a = pg_connect_as(&cfg, STMT_USER, APP_DB).await;
    let b = pg_connect_as(&cfg, STMT_USER, APP_DB).await;
    // Both stay connected and take turns on the one server connection: a
    // client holding it past its statement would starve the other into
    // the 2 s pool_timeout.
    for i in 0..5 {
        assert_eq!(one_string(&a, &format!("SELECT {i}")).await, i.to_string());
        assert_eq!(
            one_string(&b, &format!("SELECT {i} + 1")).await,
            (i + 1).to_string()
        );
    }
    let row = b.query_one("SELECT $1::int * 2", &[&21i32]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 42, "extended protocol");
    assert_eq!(
        one_string(&a, "SELECT 1; SELECT 2").await,
        "1",
        "a multi-statement query that ends idle is one statement"
    );
    assert_eq!(server_connections(STMT_USER), 1);

    let e = a.batch_execute("BEGIN").await.expect_err("BEGIN refused");
    let db = e
        .as_db_error()
        .unwrap_or_else(|| panic!("a server error: {e}"));
    assert_eq!(db.code().code(), "08P01");
    assert_eq!(db.severity(), "FATAL");
    assert_eq!(
        db.message(),
        "transaction blocks not allowed in statement pooling mode"
    );
    assert!(
        a.simple_query("SELECT 1").await.is_err(),
        "the client is closed after it, as PgBouncer does"
    );
    // The other client goes on, on a new server connection (the refused
    // one was closed with its transaction).
    assert_eq!(one_string(&b, "SELECT 'still here'").await, "still here");
    assert_eq!(
        one_string(&b, "SHOW transaction_isolation").await,
        "read committed"
    );

    // A transaction opened by a multi-statement query, or through the
    // extended protocol, ends the client the same way.
    let c = pg_connect_as(&cfg, STMT_USER, APP_DB).await;
    let e = c
        .batch_execute("SELECT 1; START TRANSACTION")
        .await
        .expect_err("refused");
    assert_eq!(
        e.as_db_error().map(|d| d.message()),
        Some("transaction blocks not allowed in statement pooling mode")
    );
    let mut d = pg_connect_as(&cfg, STMT_USER, APP_DB).await;
    let e = d.transaction().await.map(|_| ()).expect_err("refused");
    assert_eq!(e.code().map(|c| c.code()), Some("08P01"));
    assert_eq!(one_string(&b, "SELECT 3").await, "3");
}

#[tokio::test]
async fn a_session_mode_user_keeps_its_temp_table_in_a_transaction_mode_cluster() {
    let (_p, cfg) = start(
        primary_config()
            .pool_mode("transaction")
            .extra("pool_timeout = \"2s\"")
            .user_keys(SESSION_USER, "pool_mode = \"session\"\npool_size = 1")
            .user_keys(TXN_USER, ""),
    );
    let s = pg_connect_as(&cfg, SESSION_USER, APP_DB).await;
    s.batch_execute("CREATE TEMP TABLE pm_scratch (x int)")
        .await
        .unwrap();
    for i in 0..3 {
        s.execute("INSERT INTO pm_scratch VALUES ($1)", &[&i])
            .await
            .unwrap();
    }
    assert_eq!(one_string(&s, "SELECT count(*) FROM pm_scratch").await, "3");
    // Session pooling gives the client its server's pid; transaction
    // pooling gives it one of Fulcrum's.
    assert_eq!(
        one_string(&s, "SELECT pg_backend_pid()").await,
        one_string(&s, "SELECT pg_backend_pid() + 0").await,
        "the session user has a server connection of its own"
    );
    // Its one connection (its own pool_size = 1) stays its own while it
    // is idle: a second client of that user waits out pool_timeout.
    let waited = Instant::now();
    let e = match try_pg_connect_as(&cfg, SESSION_USER, APP_DB).await {
        Err(e) => e,
        Ok(second) => second
            .simple_query("SELECT 1")
            .await
            .expect_err("no server connection for a second session"),
    };
    assert!(waited.elapsed() >= Duration::from_millis(1500), "{e}");
    assert_eq!(e.code().map(|c| c.code()), Some("53300"), "{e}");
    assert_eq!(one_string(&s, "SELECT count(*) FROM pm_scratch").await, "3");

    // The cluster's other users are still transaction-pooled.
    let t = pg_connect_as(&cfg, TXN_USER, APP_DB).await;
    assert_ne!(
        one_string(&t, "SELECT pg_backend_pid()").await,
        one_string(&t, "SELECT pg_backend_pid() + 0").await,
        "a transaction-mode client gets a pid of Fulcrum's"
    );
}

#[tokio::test]
async fn a_users_pool_size_and_max_user_connections_cap_its_server_connections() {
    let (_p, cfg) = start(
        primary_config()
            .pool_size(10)
            .extra("pool_timeout = \"20s\"")
            .user_keys(SIZED_USER, "pool_size = 2")
            .user_keys(CAPPED_USER, "max_user_connections = 3")
            .user_keys(OTHER_USER, ""),
    );
    let sized = most_connections_under_load(&cfg, SIZED_USER, 6).await;
    assert_eq!(sized, 2, "pool_size = 2 for {SIZED_USER}");
    let capped = most_connections_under_load(&cfg, CAPPED_USER, 6).await;
    assert_eq!(capped, 3, "max_user_connections = 3 for {CAPPED_USER}");
    // The cluster's pool_size for the others: all six at once.
    let others = most_connections_under_load(&cfg, OTHER_USER, 6).await;
    assert!(others > 3, "{OTHER_USER} had {others}");
}

#[tokio::test]
async fn a_users_max_user_connections_ends_a_wait_with_the_pool_timeout_error() {
    let (_p, cfg) = start(
        primary_config()
            .pool_mode("session")
            .extra("pool_timeout = \"1s\"")
            .user_keys(WAITING_USER, "max_user_connections = 1"),
    );
    let first = pg_connect_as(&cfg, WAITING_USER, APP_DB).await;
    assert_eq!(one_string(&first, "SELECT 1").await, "1");
    let e = match try_pg_connect_as(&cfg, WAITING_USER, APP_DB).await {
        Err(e) => e,
        Ok(second) => second
            .simple_query("SELECT 1")
            .await
            .expect_err("the second session waits past pool_timeout"),
    };
    let message = e
        .as_db_error()
        .map(|d| d.message().to_owned())
        .unwrap_or_default();
    assert!(
        message.contains("max_user_connections (1) for user \"pm_waiting\""),
        "{e}: {message}"
    );
}
