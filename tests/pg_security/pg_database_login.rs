//! A `[[cluster.database]]` forcing a server login (`server_user`,
//! `server_password`: PgBouncer's `user=`/`password=` in `[databases]`) and
//! `connect_query` on a real PostgreSQL: clients of that database run as
//! the forced role whoever they logged in as, from one shared pool; a
//! database's `connect_query` wins over the cluster's; it runs once per
//! new server connection (warm-up included, health probes not); one that
//! fails gives the client an error at once; a reload changes it for new
//! connections.

use std::time::{Duration, Instant};

use fulcrum_suite::{first_value, pg_connect_str, pg_primary};
use fulcrum_testkit::{
    free_port, FulcrumProcess, PgCluster, Signal, APP_DB, APP_MD5_USER, APP_PASSWORD, APP_USER,
};
use tokio_postgres::Client;

fn cluster() -> &'static PgCluster {
    pg_primary()
}

/// The config of a Fulcrum in front of the shared primary: transaction
/// pooling, `cluster` lines in `[[cluster]]`, then `tables` (users and
/// databases). Probes log in as the superuser.
fn config(port: u16, cluster_keys: &str, tables: &str) -> String {
    format!(
        "[fulcrum]\nlog = \"info\"\n[[cluster]]\nname = \"forced\"\nprotocol = \"postgres\"\n\
         listen = \"127.0.0.1:{port}\"\npool_mode = \"transaction\"\nhealth_interval = \"100ms\"\n\
         health_user = \"postgres\"\n{cluster_keys}\n\
         [[cluster.backend]]\naddress = \"{backend}\"\nrole = \"primary\"\n{tables}",
        backend = cluster().primary().addr(),
    )
}

async fn login(port: u16, user: &str, password: &str, db: &str) -> Client {
    pg_connect_str(&format!(
        "host=127.0.0.1 port={port} user={user} password={password} dbname={db} connect_timeout=10"
    ))
    .await
    .unwrap_or_else(|e| panic!("{user} to {db}: {e}: {:?}", e.as_db_error()))
}

/// Rows of `table` in the app database, asked directly as the superuser.
fn count(table: &str) -> i64 {
    let sql = format!("SELECT count(*) FROM {table}");
    let out = tokio::task::block_in_place(|| cluster().primary().sql(&sql)).expect("count");
    out.trim().parse().unwrap_or(-1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_forcing_a_login_serves_every_client_as_it_from_one_pool() {
    let port = free_port();
    let f = tokio::task::block_in_place(|| {
        FulcrumProcess::start(&config(
            port,
            "pool_size = 1\nconnect_query = \"SELECT set_config('app.cq', 'cluster', false)\"",
            &format!(
                "[[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\"\n\
                 [[cluster.user]]\nname = \"web\"\npassword = \"web-pw\"\nserver_user = \"{APP_USER}\"\nserver_password = \"{APP_PASSWORD}\"\n\
                 [[cluster.database]]\nname = \"shop\"\nserver_database = \"{APP_DB}\"\n\
                 server_user = \"{APP_MD5_USER}\"\nserver_password = \"{APP_PASSWORD}\"\n\
                 connect_query = \"SELECT set_config('app.cq', 'database', false)\"\n\
                 [[cluster.database]]\nname = \"{APP_DB}\"\n"
            ),
        ))
    })
    .expect("start fulcrum");
    let app = login(port, APP_USER, APP_PASSWORD, "shop").await;
    let web = login(port, "web", "web-pw", "shop").await;
    for (who, client) in [("app", &app), ("web", &web)] {
        assert_eq!(
            first_value(client, "SELECT current_user").await,
            APP_MD5_USER,
            "{who} on shop runs as the forced login\n{}",
            f.log_contents()
        );
        assert_eq!(
            first_value(client, "SELECT session_user").await,
            APP_MD5_USER
        );
        assert_eq!(
            first_value(client, "SELECT current_setting('app.cq')").await,
            "database",
            "the database's connect_query, not the cluster's"
        );
    }
    // One pool for both (pool_size = 1 per pool): the same server
    // connection (known by its port; Fulcrum answers pg_backend_pid() with
    // the client's own pid).
    let port_of = "SELECT inet_client_port()";
    let conn = first_value(&app, port_of).await;
    assert_eq!(first_value(&web, port_of).await, conn);

    // LISTEN (answered by Fulcrum in transaction pooling) listens on a
    // connection of the forced login too.
    app.batch_execute("LISTEN cq_forced_channel")
        .await
        .expect("LISTEN");
    let listeners = tokio::task::block_in_place(|| {
        cluster().primary().sql(
            "SELECT string_agg(DISTINCT usename, ',') FROM pg_stat_activity \
             WHERE query LIKE 'LISTEN%cq_forced_channel%'",
        )
    })
    .expect("listeners");
    assert_eq!(listeners, APP_MD5_USER, "{}", f.log_contents());

    // The other database: each user's own login, and the cluster's query.
    let app_plain = login(port, APP_USER, APP_PASSWORD, APP_DB).await;
    let web_plain = login(port, "web", "web-pw", APP_DB).await;
    for client in [&app_plain, &web_plain] {
        assert_eq!(first_value(client, "SELECT current_user").await, APP_USER);
        assert_eq!(
            first_value(client, "SELECT current_setting('app.cq')").await,
            "cluster"
        );
        assert_ne!(first_value(client, port_of).await, conn);
    }
    // The client still proves its own password to Fulcrum.
    let wrong = pg_connect_str(&format!(
        "host=127.0.0.1 port={port} user=web password={APP_PASSWORD} dbname=shop connect_timeout=10"
    ))
    .await;
    let e = wrong.expect_err("the server's password is not web's");
    assert_eq!(
        e.as_db_error().map(|d| d.code().code()),
        Some("28P01"),
        "{e:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_query_runs_once_per_new_server_connection_warm_up_included() {
    // A role of its own: its server connections are this test's alone.
    tokio::task::block_in_place(|| {
        cluster().primary().sql(&format!(
            "CREATE ROLE cq_owner LOGIN PASSWORD 'cq-pw'; GRANT {APP_USER} TO cq_owner; \
             CREATE TABLE cq_opened (port int, who text)"
        ))
    })
    .expect("role and table");
    let port = free_port();
    let f = tokio::task::block_in_place(|| {
        FulcrumProcess::start(&config(
            port,
            "min_pool_size = 2",
            &format!(
                "[[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\"\n\
                 [[cluster.database]]\nname = \"logged\"\nserver_database = \"{APP_DB}\"\n\
                 server_user = \"cq_owner\"\nserver_password = \"cq-pw\"\n\
                 connect_query = \"INSERT INTO cq_opened VALUES (inet_client_port(), current_user)\"\n"
            ),
        ))
    })
    .expect("start fulcrum");
    // min_pool_size opens the forced login's pool before any client comes.
    let start = Instant::now();
    while count("cq_opened") < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "warm-up never ran connect_query: {} rows\n{}",
            count("cq_opened"),
            f.log_contents()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let client = login(port, APP_USER, APP_PASSWORD, "logged").await;
    // Its server connection, by the port Fulcrum connects from.
    let port_used = first_value(&client, "SELECT inet_client_port()").await;
    let opened = count("cq_opened");
    // Checkouts of open connections run nothing; probes (every 100 ms, as
    // postgres) neither.
    for _ in 0..10 {
        client.simple_query("SELECT 1").await.expect("query");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count("cq_opened"), opened);
    // One row per server connection of the forced role, each run as it:
    // the live connections are exactly those logged.
    let list =
        |sql: &str| tokio::task::block_in_place(|| cluster().primary().sql(sql)).expect("list");
    let live = list(
        "SELECT string_agg(client_port::text, ',' ORDER BY client_port) FROM pg_stat_activity WHERE usename = 'cq_owner'",
    );
    let logged = list(
        "SELECT string_agg(port::text, ',' ORDER BY port) FROM cq_opened WHERE who = 'cq_owner'",
    );
    assert_eq!(live, logged, "{}", f.log_contents());
    assert!(
        logged.split(',').any(|p| p == port_used),
        "the client's connection ({port_used}) is one of them: {logged}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_connect_query_fails_the_login_at_once_and_a_reload_fixes_it() {
    let port = free_port();
    let users = format!("[[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\"\n");
    let bad = config(
        port,
        "pool_timeout = \"20s\"\nconnect_query = \"SELECT * FROM no_table_for_connect_query\"",
        &users,
    );
    let f = tokio::task::block_in_place(|| FulcrumProcess::start(&bad)).expect("start fulcrum");
    let started = Instant::now();
    let e = pg_connect_str(&format!(
        "host=127.0.0.1 port={port} user={APP_USER} password={APP_PASSWORD} dbname={APP_DB} connect_timeout=30"
    ))
    .await
    .expect_err("the login fails");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered at once, not after pool_timeout: {:?}",
        started.elapsed()
    );
    let db = e
        .as_db_error()
        .unwrap_or_else(|| panic!("an ErrorResponse: {e:?}"));
    assert_eq!(db.code().code(), "08006", "{db:?}");
    assert!(
        db.message().contains("connect_query failed")
            && db.message().contains("no_table_for_connect_query"),
        "{}",
        db.message()
    );
    f.wait_for_log("connect_query failed", Duration::from_secs(5))
        .expect("logged with the server's error");

    // A reload with a working query: new connections run it.
    let good = bad.replace(
        "SELECT * FROM no_table_for_connect_query",
        "SELECT set_config('app.cq', 'reloaded', false)",
    );
    std::fs::write(f.config_path(), good).expect("write config");
    f.signal(Signal::Hup).expect("SIGHUP");
    f.wait_for_log("config reloaded", Duration::from_secs(10))
        .expect("reloaded");
    let client = login(port, APP_USER, APP_PASSWORD, APP_DB).await;
    assert_eq!(
        first_value(&client, "SELECT current_setting('app.cq')").await,
        "reloaded"
    );
}
