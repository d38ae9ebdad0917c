//! Where the result cache serves a MySQL client besides an idle one of
//! transaction pooling (issue 46), through a real Fulcrum in front of
//! `my_cache`'s MariaDB primary: reads inside a transaction when their
//! rule says `in_transactions = true` and the transaction is proven READ
//! COMMITTED (never at the default REPEATABLE READ, never without the rule,
//! never after the transaction's own write), with mysql_async's transaction
//! API working over the served answers; and session-pooled clients, until
//! they leave state on their connection (a user variable). A hit is told
//! from a fresh read by a write made behind Fulcrum's back, which a kept
//! answer does not see (`invalidation = "proxy"`).

use std::sync::OnceLock;

use fulcrum_suite::maria_toml;
use fulcrum_testkit::{free_port, FulcrumProcess, APP_DB};
use mysql_async::prelude::Queryable;
use mysql_async::TxOpts;

use crate::my_cache::{behind_its_back, cluster, connect, run, value};

/// Fulcrum keeping reads of `scope_t` (its rule with `rule_keys`) and of
/// `scope_u` (a rule without `in_transactions`), its clients pooled by
/// `pool_mode`. The login waits for the relation catalog (until it is
/// read no answer is kept; the default wait is short for a loaded machine).
fn start(rule_keys: &str, pool_mode: &str) -> (FulcrumProcess, u16) {
    let c = cluster();
    static TABLES: OnceLock<()> = OnceLock::new();
    TABLES.get_or_init(|| {
        c.primary()
            .sql_script(
                APP_DB,
                "CREATE TABLE scope_t (id int PRIMARY KEY, v int);
                 INSERT INTO scope_t SELECT seq, seq FROM seq_1_to_100;
                 CREATE TABLE scope_u (id int PRIMARY KEY, v int);
                 INSERT INTO scope_u SELECT seq, seq FROM seq_1_to_100;",
            )
            .expect("set up");
    });
    let port = free_port();
    let toml = maria_toml(
        c,
        port,
        &format!(
            "pool_mode = \"{pool_mode}\"\nfunction_catalog_wait = \"10s\"\n\
             cache = {{ mode = \"rules\", invalidation = \"proxy\", rule = [\
             {{ tables = [\"scope_t\"]{rule_keys} }}, {{ tables = [\"scope_u\"] }}] }}"
        ),
    );
    let f = tokio::task::block_in_place(|| FulcrumProcess::start(&toml)).expect("start fulcrum");
    (f, port)
}

const RC: &str = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_in_a_read_committed_transaction_are_served_until_it_writes() {
    let (f, port) = start(", in_transactions = true", "transaction");
    let mut a = connect(port).await;
    run(&mut a, RC).await;
    // Writes through Fulcrum drop every entry of their table: first.
    run(&mut a, "UPDATE scope_t SET v = 1 WHERE id = 1").await;
    run(&mut a, "UPDATE scope_t SET v = 2 WHERE id = 2").await;
    let read = "SELECT v FROM scope_t WHERE id = 1";
    assert_eq!(value(&mut a, read).await, 1, "kept outside a transaction");
    behind_its_back("UPDATE scope_t SET v = 100 WHERE id = 1");

    run(&mut a, "BEGIN").await;
    assert_eq!(value(&mut a, read).await, 1, "{}", f.log_contents());
    assert_eq!(value(&mut a, read).await, 1, "served again");
    // A miss inside the transaction fills the cache (on the primary)...
    let second = "SELECT v FROM scope_t WHERE id = 2";
    assert_eq!(value(&mut a, second).await, 2, "a fill in the transaction");
    run(&mut a, "COMMIT").await;
    behind_its_back("UPDATE scope_t SET v = 200 WHERE id = 2");
    // ...kept as an idle client's answer.
    assert_eq!(value(&mut a, second).await, 2, "the fill serves idle reads");

    // mysql_async's own transaction API over served answers.
    let mut tx = a
        .start_transaction(TxOpts::default())
        .await
        .expect("start transaction");
    let got: Option<i64> = tx.query_first(read).await.expect("read in tx");
    assert_eq!(got, Some(1), "served inside mysql_async's transaction");
    tx.query_drop("UPDATE scope_u SET v = 7 WHERE id = 1")
        .await
        .expect("write in tx");
    // After the transaction's own write (to another table: the entry of
    // scope_t stays), its reads go to the server.
    let got: Option<i64> = tx.query_first(read).await.expect("read after write");
    assert_eq!(got, Some(100), "never served after its own write");
    tx.rollback().await.expect("rollback");
    assert_eq!(
        value(&mut a, "SELECT v FROM scope_u WHERE id = 1").await,
        1,
        "the transaction was open on the server: rolled back"
    );
    assert_eq!(
        value(&mut a, read).await,
        1,
        "the entry was there all along"
    );

    // Its own write to the cached row is seen too.
    run(&mut a, "BEGIN").await;
    run(&mut a, "UPDATE scope_t SET v = 3 WHERE id = 1").await;
    assert_eq!(value(&mut a, read).await, 3, "its own write");
    run(&mut a, "COMMIT").await;
    assert_eq!(value(&mut a, read).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_read_the_server_without_the_rule_or_read_committed() {
    let (f, port) = start(", in_transactions = true", "transaction");
    let mut a = connect(port).await;
    // The default, REPEATABLE READ: never served, its kept entry stays.
    run(&mut a, "UPDATE scope_t SET v = 10 WHERE id = 10").await;
    let read = "SELECT v FROM scope_t WHERE id = 10";
    assert_eq!(value(&mut a, read).await, 10, "kept");
    behind_its_back("UPDATE scope_t SET v = 1000 WHERE id = 10");
    run(&mut a, "BEGIN").await;
    assert_eq!(
        value(&mut a, read).await,
        1000,
        "REPEATABLE READ: {}",
        f.log_contents()
    );
    run(&mut a, "COMMIT").await;
    assert_eq!(value(&mut a, read).await, 10, "idle: served");
    // A next-transaction level pins its client (state its connection keeps
    // until that transaction): not served any more.
    run(&mut a, "SET TRANSACTION ISOLATION LEVEL READ COMMITTED").await;
    run(&mut a, "BEGIN").await;
    assert_eq!(value(&mut a, read).await, 1000, "next-transaction level");
    run(&mut a, "COMMIT").await;

    // Read committed, but the rule of scope_u does not say in_transactions.
    let mut b = connect(port).await;
    run(&mut b, RC).await;
    run(&mut b, "UPDATE scope_u SET v = 11 WHERE id = 11").await;
    let other = "SELECT v FROM scope_u WHERE id = 11";
    run(&mut b, "UPDATE scope_t SET v = 12 WHERE id = 12").await;
    let kept = "SELECT v FROM scope_t WHERE id = 12";
    assert_eq!(value(&mut b, other).await, 11, "kept");
    assert_eq!(value(&mut b, kept).await, 12, "kept");
    behind_its_back(
        "UPDATE scope_u SET v = 1100 WHERE id = 11; UPDATE scope_t SET v = 1200 WHERE id = 12",
    );
    run(&mut b, "BEGIN").await;
    assert_eq!(value(&mut b, other).await, 1100, "no in_transactions");
    assert_eq!(value(&mut b, kept).await, 12, "in_transactions: served");
    run(&mut b, "COMMIT").await;
    // A consistent snapshot, or a read-only transaction: never served.
    run(&mut b, "START TRANSACTION WITH CONSISTENT SNAPSHOT").await;
    assert_eq!(value(&mut b, kept).await, 1200, "a consistent snapshot");
    run(&mut b, "COMMIT").await;
    run(&mut b, "START TRANSACTION READ ONLY").await;
    assert_eq!(value(&mut b, kept).await, 1200, "read only");
    run(&mut b, "COMMIT").await;
    // Back to REPEATABLE READ for the session.
    run(
        &mut b,
        "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
    )
    .await;
    run(&mut b, "BEGIN").await;
    assert_eq!(value(&mut b, kept).await, 1200, "REPEATABLE READ again");
    run(&mut b, "COMMIT").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_pooled_client_is_served_until_it_leaves_state() {
    let (f, port) = start(", in_transactions = true", "session");
    let (mut a, mut b) = (connect(port).await, connect(port).await);
    run(&mut a, "UPDATE scope_t SET v = 20 WHERE id = 20").await;
    let read = "SELECT v FROM scope_t WHERE id = 20";
    assert_eq!(value(&mut a, read).await, 20, "filled on the primary");
    behind_its_back("UPDATE scope_t SET v = 2000 WHERE id = 20");
    assert_eq!(value(&mut a, read).await, 20, "{}", f.log_contents());
    assert_eq!(
        value(&mut b, read).await,
        20,
        "another session-pooled client"
    );

    // A user variable is state on its connection: no more cache for it.
    run(&mut a, "SET @x = 1").await;
    assert_eq!(value(&mut a, read).await, 2000, "state left: the server");
    assert_eq!(value(&mut b, read).await, 20, "the other still served");

    // A next-transaction level is state its connection keeps until that
    // transaction starts: it pins, and what pins is state left.
    let mut c = connect(port).await;
    run(&mut c, "SET TRANSACTION ISOLATION LEVEL READ COMMITTED").await;
    run(&mut c, "BEGIN").await;
    assert_eq!(value(&mut c, read).await, 2000, "state left: the server");
    run(&mut c, "COMMIT").await;
    assert_eq!(value(&mut c, read).await, 2000, "still state left");
}
