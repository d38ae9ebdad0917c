//! Where the result cache serves besides an idle client of transaction
//! pooling (issue 46), through a real Fulcrum in front of `pg_cache`'s
//! primary: reads inside a transaction when their rule says
//! `in_transactions = true` and the transaction is READ COMMITTED (never at
//! REPEATABLE READ, never without the rule, and a transaction's own write
//! is always seen), and session-pooled clients, until they leave state on
//! their connection (a temporary table hiding the cached one). A hit is
//! told from a fresh read by a write made behind Fulcrum's back, which a
//! kept answer does not see (`invalidation = "proxy"`).

use std::sync::OnceLock;

use fulcrum_suite::{pg_connect, PgProxyConfig};
use fulcrum_testkit::{FulcrumProcess, APP_DB};

use crate::pg_cache::{behind_its_back, cluster, run, value};

/// Fulcrum keeping reads of `cache_scope_t` (its rule with `rule_keys`),
/// its clients pooled by `pool_mode`.
fn start(rule_keys: &str, pool_mode: &'static str) -> (FulcrumProcess, PgProxyConfig) {
    let c = cluster();
    static TABLES: OnceLock<()> = OnceLock::new();
    TABLES.get_or_init(|| {
        c.primary()
        .sql_script(
            APP_DB,
            "CREATE TABLE IF NOT EXISTS cache_scope_t (id int PRIMARY KEY, v int);
             CREATE TABLE IF NOT EXISTS cache_scope_u (id int PRIMARY KEY, v int);
             INSERT INTO cache_scope_t SELECT i, i FROM generate_series(1, 100) i ON CONFLICT DO NOTHING;
             INSERT INTO cache_scope_u VALUES (1, 1) ON CONFLICT DO NOTHING;",
        )
        .expect("set up");
    });
    let cfg = PgProxyConfig::new(&c.primary().addr())
        .extra("function_catalog_wait = \"10s\"")
        .extra(&format!(
            "cache = {{ mode = \"rules\", invalidation = \"proxy\", rule = [\
             {{ tables = [\"cache_scope_t\"]{rule_keys} }}, {{ tables = [\"cache_scope_u\"] }}] }}"
        ))
        .pool_mode(pool_mode);
    let p = FulcrumProcess::start(&cfg.to_toml()).expect("start fulcrum");
    (p, cfg)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_in_read_committed_transactions_are_served_when_the_rule_says_so() {
    let (_p, cfg) = start(", in_transactions = true", "transaction");
    let a = pg_connect(&cfg).await;
    run(&a, "UPDATE cache_scope_t SET v = 1 WHERE id = 1").await;
    let read = "SELECT v FROM cache_scope_t WHERE id = 1";
    assert_eq!(value(&a, read).await, "1", "kept outside a transaction");
    behind_its_back("UPDATE cache_scope_t SET v = 100 WHERE id = 1");
    run(&a, "BEGIN").await;
    assert_eq!(value(&a, read).await, "1", "served inside the transaction");
    assert_eq!(value(&a, read).await, "1");
    run(&a, "COMMIT").await;
    run(&a, "BEGIN ISOLATION LEVEL READ COMMITTED").await;
    assert_eq!(value(&a, read).await, "1", "named READ COMMITTED");
    run(&a, "COMMIT").await;
    // REPEATABLE READ sees one snapshot: never a kept answer.
    run(&a, "BEGIN ISOLATION LEVEL REPEATABLE READ").await;
    assert_eq!(
        value(&a, read).await,
        "100",
        "not served at REPEATABLE READ"
    );
    run(&a, "COMMIT").await;
    run(&a, "BEGIN; SET TRANSACTION ISOLATION LEVEL SERIALIZABLE").await;
    assert_eq!(value(&a, read).await, "100", "not served at SERIALIZABLE");
    run(&a, "ROLLBACK").await;
    run(&a, "SET default_transaction_isolation = 'repeatable read'").await;
    run(&a, "BEGIN").await;
    assert_eq!(value(&a, read).await, "100", "the session's default");
    run(&a, "COMMIT").await;
    run(&a, "RESET default_transaction_isolation").await;

    // A fill inside a transaction answers idle clients after it.
    let other = "SELECT v FROM cache_scope_t WHERE id = 2";
    run(&a, "UPDATE cache_scope_t SET v = 2 WHERE id = 2").await;
    run(&a, "BEGIN").await;
    assert_eq!(value(&a, other).await, "2");
    run(&a, "COMMIT").await;
    behind_its_back("UPDATE cache_scope_t SET v = 200 WHERE id = 2");
    assert_eq!(value(&a, other).await, "2", "filled inside the transaction");
    let b = pg_connect(&cfg).await;
    assert_eq!(value(&b, other).await, "2", "another client too");

    // A transaction's own write is seen by its next read.
    run(&a, "BEGIN").await;
    run(&a, "UPDATE cache_scope_t SET v = 3 WHERE id = 1").await;
    assert_eq!(value(&a, read).await, "3", "its own write");
    run(&a, "ROLLBACK").await;
    assert_eq!(
        value(&a, read).await,
        "100",
        "the rollback left the server's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_in_transactions_a_transaction_always_reads_the_server() {
    let (_p, cfg) = start("", "transaction");
    let a = pg_connect(&cfg).await;
    run(&a, "UPDATE cache_scope_u SET v = 1 WHERE id = 1").await;
    let read = "SELECT v FROM cache_scope_u WHERE id = 1";
    assert_eq!(value(&a, read).await, "1");
    behind_its_back("UPDATE cache_scope_u SET v = 10 WHERE id = 1");
    assert_eq!(value(&a, read).await, "1", "kept outside a transaction");
    run(&a, "BEGIN").await;
    assert_eq!(value(&a, read).await, "10", "not inside one");
    run(&a, "COMMIT").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_pooled_client_is_served_until_it_leaves_state() {
    let (_p, cfg) = start("", "session");
    let a = pg_connect(&cfg).await;
    run(&a, "UPDATE cache_scope_t SET v = 5 WHERE id = 5").await;
    let read = "SELECT v FROM cache_scope_t WHERE id = 5";
    assert_eq!(value(&a, read).await, "5");
    behind_its_back("UPDATE cache_scope_t SET v = 500 WHERE id = 5");
    assert_eq!(value(&a, read).await, "5", "a session-pooled client's hit");
    let b = pg_connect(&cfg).await;
    assert_eq!(value(&b, read).await, "5", "and another's");
    // Its own write through Fulcrum is seen at once.
    run(&b, "UPDATE cache_scope_t SET v = 6 WHERE id = 5").await;
    assert_eq!(value(&a, read).await, "6");
    assert_eq!(value(&b, read).await, "6");
    // A temporary table of the same name hides the table: never the cache.
    run(
        &a,
        "CREATE TEMP TABLE cache_scope_t (id int, v int); INSERT INTO cache_scope_t VALUES (5, -1)",
    )
    .await;
    assert_eq!(value(&a, read).await, "-1", "its temporary table");
    assert_eq!(value(&b, read).await, "6", "the other client still hits");
}
