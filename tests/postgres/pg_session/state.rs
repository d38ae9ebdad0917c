//! Session state between clients: startup roles, SET TRANSACTION READ WRITE,
//! functions routed by the servers' catalog, pinned clients, set_config,
//! oversized units, cleartext passwords and `server_reset_query`.

use std::time::{Duration, Instant};

use fulcrum_suite::{
    metric_sum, pg_connect, pg_connect_with_options, start_with_metrics, PgProxyConfig,
};
use fulcrum_testkit::{APP_DB, APP_USER};

use super::helpers::{cluster, exec, one, start, with_replicas, STARTUP_ROLE};

#[tokio::test]
async fn a_startup_role_does_not_leak_to_the_next_client() {
    // One server connection: every client below is served by the same
    // server session, one after the other.
    let (_p, cfg) = start(PgProxyConfig::new(&cluster().primary().addr()).pool_size(1));
    let plain = pg_connect(&cfg).await;
    assert_eq!(one(&plain, "SELECT current_user").await, APP_USER);
    let with_role = pg_connect_with_options(&cfg, &format!("-c role={STARTUP_ROLE}")).await;
    assert_eq!(one(&with_role, "SELECT current_user").await, STARTUP_ROLE);
    drop(with_role);
    for _ in 0..3 {
        assert_eq!(one(&plain, "SELECT current_user").await, APP_USER);
        let later = pg_connect(&cfg).await;
        assert_eq!(one(&later, "SELECT current_user").await, APP_USER);
    }
}

#[tokio::test]
async fn set_transaction_read_write_sends_the_transaction_to_the_primary() {
    let (_p, cfg) = start(with_replicas(4));
    let client = pg_connect(&cfg).await;
    // Each statement on its own: Fulcrum answers BEGIN and SET TRANSACTION
    // itself and lets the transaction's first statement pick the server.
    exec(&client, "BEGIN READ ONLY").await.unwrap();
    exec(&client, "SET TRANSACTION READ WRITE").await.unwrap();
    exec(&client, "INSERT INTO ses_rows VALUES (1)")
        .await
        .expect("READ WRITE undid READ ONLY: the insert runs on the primary");
    assert_eq!(one(&client, "SELECT pg_is_in_recovery()").await, "f");
    exec(&client, "COMMIT").await.unwrap();
    // A read-only transaction still goes to a replica (from a client that
    // has not written: this one's reads wait for its insert to replicate).
    let reader = pg_connect(&cfg).await;
    exec(&reader, "BEGIN READ ONLY").await.unwrap();
    assert_eq!(one(&reader, "SELECT pg_is_in_recovery()").await, "t");
    exec(&reader, "COMMIT").await.unwrap();
    // And a write in a read-only transaction fails as it does directly.
    exec(&client, "BEGIN READ ONLY").await.unwrap();
    let err = exec(&client, "INSERT INTO ses_rows VALUES (2)")
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("25006"));
    exec(&client, "ROLLBACK").await.unwrap();
}

/// `function_catalog` (default on): a read calling a user function that no
/// list names is routed by the server's `pg_proc.provolatile`: a volatile
/// one that writes runs on the primary (on a replica it would fail with
/// 25006), a stable one goes to the replicas once looked up. With the
/// catalog off, the writing one reaches a replica and fails: the catalog is
/// what routes it. (Both are listed in `session_free_functions`; unlisted,
/// a call pins its client to the primary: pg_isolation.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_are_routed_by_the_servers_catalog() {
    let c = cluster();
    c.primary()
        .sql_script(
            APP_DB,
            "CREATE TABLE IF NOT EXISTS bumps (n int);
             GRANT ALL ON bumps TO PUBLIC;
             CREATE OR REPLACE FUNCTION bump() RETURNS int LANGUAGE sql VOLATILE
               AS $$ INSERT INTO bumps VALUES (1) RETURNING n $$;
             CREATE OR REPLACE FUNCTION price(x int) RETURNS int LANGUAGE sql STABLE
               AS $$ SELECT x * 2 $$;",
        )
        .expect("functions");
    c.wait_replicas_caught_up(Duration::from_secs(30))
        .expect("replicated");
    let primary = c.primary().port().to_string();
    // Declared free of session state: only then may a call go unpinned
    // (default-deny), and the catalog route it.
    let free = r#"session_free_functions = ["bump", "price"]"#;
    let cfg = with_replicas(5).extra(free);
    let (_p, metrics_port) = start_with_metrics(&cfg.to_toml());
    let client = pg_connect(&cfg).await;
    for _ in 0..6 {
        assert_eq!(
            one(&client, "SELECT bump()").await,
            "1",
            "a writing function runs on the primary"
        );
    }
    // Unknown at first (the primary), a read once the catalog answered.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let port = one(&client, "SELECT inet_server_port() + price(0)").await;
        if port != primary {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a stable function never reached a replica"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let loaded = metric_sum(
        metrics_port,
        "fulcrum_function_catalog_lookups_total",
        "outcome=\"loaded\"",
    );
    assert!(loaded >= 1, "the lookup that routed price() is counted");
    let (_off, cfg) = start(
        with_replicas(5)
            .extra("function_catalog = false")
            .extra(free),
    );
    let client = pg_connect(&cfg).await;
    let err = exec(&client, "SELECT bump()").await.unwrap_err();
    assert_eq!(
        err.as_db_error().map(|d| d.code().code()),
        Some("25006"),
        "without the catalog it reaches a read-only replica: {err:?}"
    );
}

/// A pinned client that leaves in transaction pooling (a temporary table,
/// an advisory lock, an SQL PREPARE, a LISTEN) leaves nothing on the one
/// server connection the next client is given.
#[tokio::test]
async fn a_pinned_client_leaves_nothing_for_the_next_client() {
    let (_p, cfg) = start(PgProxyConfig::new(&cluster().primary().addr()).pool_size(1));
    {
        let pinned = pg_connect(&cfg).await;
        exec(
            &pinned,
            "CREATE TEMP TABLE leak_tmp (x int); SELECT pg_advisory_lock(4242); \
             PREPARE leak_stmt AS SELECT 1; LISTEN leak_channel",
        )
        .await
        .unwrap();
        let pid = one(&pinned, "SELECT pg_backend_pid() + 0").await;
        assert_eq!(
            one(&pinned, "SELECT pg_backend_pid() + 0").await,
            pid,
            "pinned"
        );
    }
    // The client is gone once its socket is closed; the next one may be
    // served before Fulcrum has noticed, so it asks until the connection
    // it gets is the clean one.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let next = pg_connect(&cfg).await;
        let locks = one(
            &next,
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242",
        )
        .await;
        let tmp = one(&next, "SELECT count(*) FROM pg_class WHERE relname = 'leak_tmp' AND relpersistence = 't' AND pg_table_is_visible(oid)").await;
        let prepared = one(&next, "SELECT count(*) FROM pg_prepared_statements").await;
        let listening = one(&next, "SELECT count(*) FROM pg_listening_channels()").await;
        if (
            locks.as_str(),
            tmp.as_str(),
            prepared.as_str(),
            listening.as_str(),
        ) == ("0", "0", "0", "0")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left for the next client: advisory locks {locks}, temporary table {tmp}, prepared {prepared}, listening {listening}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `set_config(name, value, false)` is a SET by another name (how
/// row-level-security apps set their tenant): it follows its client to
/// every connection it uses and never reaches the next client of the
/// pooled connection; `set_config(..., true)` lasts only its transaction.
#[tokio::test]
async fn set_config_follows_its_client_and_never_the_next_one() {
    let (_p, cfg) = start(PgProxyConfig::new(&cluster().primary().addr()).pool_size(2));
    let tenant = "SELECT coalesce(current_setting('app.tenant', true), '')";
    {
        let a = pg_connect(&cfg).await;
        assert_eq!(
            one(&a, "SELECT set_config('app.tenant', '42', false)").await,
            "42"
        );
        for _ in 0..4 {
            assert_eq!(one(&a, tenant).await, "42", "the client keeps its setting");
        }
        exec(
            &a,
            "BEGIN; SELECT set_config('app.local', '7', true); COMMIT",
        )
        .await
        .unwrap();
    }
    // 20 later clients of the same user, on the same two connections.
    for i in 0..20 {
        let next = pg_connect(&cfg).await;
        assert_eq!(one(&next, tenant).await, "", "client {i} saw the tenant");
        assert_eq!(
            one(
                &next,
                "SELECT coalesce(current_setting('app.local', true), '')"
            )
            .await,
            "",
            "client {i} saw a transaction-local setting"
        );
    }
}

/// A unit over `max_classify_bytes` is not parsed: unless it is plainly one
/// read or write it pins its client, so what it does to the session (here a
/// `SET` behind a padded `SELECT`) is reset when the client leaves and never
/// reaches the next client of the connection.
#[tokio::test]
async fn an_oversized_unit_that_changes_the_session_pins_and_leaves_nothing() {
    let (_p, cfg) = start(
        PgProxyConfig::new(&cluster().primary().addr())
            .pool_size(1)
            .extra("max_classify_bytes = \"1kB\""),
    );
    let pad = "x".repeat(2000);
    {
        let a = pg_connect(&cfg).await;
        exec(
            &a,
            &format!("SELECT '{pad}'; SET search_path = leak_schema, public"),
        )
        .await
        .unwrap();
        assert_eq!(one(&a, "SHOW search_path").await, "leak_schema, public");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let next = pg_connect(&cfg).await;
        let path = one(&next, "SHOW search_path").await;
        if path == "\"$user\", public" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left for the next client: search_path {path}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A server that asks for the password in clear text (`password` in its
/// pg_hba.conf) gets it only when `server_cleartext = true` (off by
/// default) and the link cannot be intercepted (here loopback; else a Unix
/// socket or TLS with a verified certificate). By default the login fails
/// with an error that names the key.
#[tokio::test]
async fn a_cleartext_password_is_sent_only_when_allowed() {
    let plain = fulcrum_testkit::APP_PLAIN_USER;
    let (_p, cfg) = start(PgProxyConfig::new(&cluster().primary().addr()));
    let err = match fulcrum_suite::try_pg_connect_as(&cfg, plain, APP_DB).await {
        Ok(client) => match client.simple_query("SELECT 1").await {
            Ok(_) => panic!("the password went out in clear text by default"),
            Err(e) => e,
        },
        Err(e) => e,
    };
    let message = err
        .as_db_error()
        .map(|e| e.message().to_owned())
        .unwrap_or_else(|| err.to_string());
    assert!(message.contains("server_cleartext"), "{message}");
    let (_q, cfg) =
        start(PgProxyConfig::new(&cluster().primary().addr()).extra("server_cleartext = true"));
    let client = fulcrum_suite::pg_connect_as(&cfg, plain, APP_DB).await;
    assert_eq!(one(&client, "SELECT current_user").await, plain);
}

/// `server_reset_query` (PgBouncer's key): what runs on a session-pooled
/// connection going back. The default, `DISCARD ALL`, drops a client's SQL
/// prepared statements; `RESET ALL` (configured here) keeps them, which the
/// next client of the connection sees. `server_reset_query_always` runs it
/// on every return in transaction pooling too: the statements Fulcrum
/// prepared on the connection are gone before the next unit.
#[tokio::test]
async fn server_reset_query_is_what_runs_when_a_connection_goes_back() {
    let count = "SELECT count(*) FROM pg_prepared_statements";
    for (reset, left) in [(None, "0"), (Some("RESET ALL"), "1")] {
        let mut cfg = PgProxyConfig::new(&cluster().primary().addr())
            .pool_mode("session")
            .pool_size(1);
        if let Some(q) = reset {
            cfg = cfg.extra(&format!("server_reset_query = \"{q}\""));
        }
        let (_p, cfg) = start(cfg);
        {
            let a = pg_connect(&cfg).await;
            exec(&a, "PREPARE kept AS SELECT 1").await.unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let next = pg_connect(&cfg).await;
            let n = one(&next, count).await;
            if n == left {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "server_reset_query {reset:?}: {n} prepared statements left, expected {left}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for (always, at_least_one) in [(false, true), (true, false)] {
        let (_p, cfg) = start(
            PgProxyConfig::new(&cluster().primary().addr())
                .pool_size(1)
                .extra(&format!("server_reset_query_always = {always}")),
        );
        let a = pg_connect(&cfg).await;
        let stmt = a.prepare("SELECT 41 + 1").await.unwrap();
        let row = a.query_one(&stmt, &[]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), 42);
        let n: i64 = one(&a, count).await.parse().unwrap();
        assert_eq!(
            n >= 1,
            at_least_one,
            "server_reset_query_always = {always}: {n}"
        );
    }
}
