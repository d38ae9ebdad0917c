//! Session state across servers: settings follow the client, binary
//! prepared statements and their bound, COM_CHANGE_USER, payloads over
//! 16 MiB, LOAD DATA LOCAL INFILE, and nothing left for the next client
//! (a next-transaction `SET TRANSACTION` included).

use std::time::Duration;

use fulcrum_suite::maria_connect;
use fulcrum_testkit::{APP_DB, APP_PASSWORD, APP_USER};
use mysql_async::prelude::Queryable;

use super::helpers::{cluster, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_settings_follow_the_client_across_servers() {
    let (_p, port) = start("");
    let mut a = maria_connect(port).await;
    let mut b = maria_connect(port).await;
    a.query_drop("SET SESSION sql_mode = 'ANSI_QUOTES'")
        .await
        .unwrap();
    for _ in 0..6 {
        let mode: String = a.query_first("SELECT @@sql_mode").await.unwrap().unwrap();
        assert_eq!(mode, "ANSI_QUOTES", "kept on every server the client uses");
        let other: String = b.query_first("SELECT @@sql_mode").await.unwrap().unwrap();
        assert_ne!(other, "ANSI_QUOTES", "never leaks to another client");
    }
    // A user variable pins the client to its connection.
    a.query_drop("SET @mine = 41").await.unwrap();
    for _ in 0..4 {
        let v: i64 = a.query_first("SELECT @mine + 1").await.unwrap().unwrap();
        assert_eq!(v, 42);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_protocol_prepared_statements_work() {
    let (_p, port) = start("");
    let mut conn = maria_connect(port).await;
    let stmt = conn.prep("SELECT ? + 1").await.unwrap();
    for i in 0..5i64 {
        let v: i64 = conn.exec_first(&stmt, (i,)).await.unwrap().unwrap();
        assert_eq!(v, i + 1);
    }
    conn.exec_drop("INSERT INTO items (v) VALUES (?)", (7,))
        .await
        .unwrap();
    conn.close(stmt).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_user_starts_a_fresh_session_and_checks_the_password() {
    let (_p, port) = start("");
    let mut conn = maria_connect(port).await;
    conn.query_drop("SET SESSION sql_mode = 'ANSI_QUOTES'")
        .await
        .unwrap();
    conn.query_drop("SET @mine = 1").await.unwrap();
    conn.change_user(
        mysql_async::ChangeUserOpts::default()
            .with_user(Some(APP_USER.to_owned()))
            .with_pass(Some(APP_PASSWORD.to_owned()))
            .with_db_name(Some(APP_DB.to_owned())),
    )
    .await
    .unwrap();
    let mode: String = conn
        .query_first("SELECT @@sql_mode")
        .await
        .unwrap()
        .unwrap();
    assert_ne!(mode, "ANSI_QUOTES", "settings of the old session are gone");
    let v: Option<i64> = conn.query_first("SELECT @mine").await.unwrap().unwrap();
    assert_eq!(v, None, "user variables of the old session are gone");
    let wrong = conn
        .change_user(
            mysql_async::ChangeUserOpts::default()
                .with_user(Some(APP_USER.to_owned()))
                .with_pass(Some("wrong".to_owned())),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&wrong, mysql_async::Error::Server(s) if s.code == 1045),
        "{wrong:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_over_16_mib_cross_in_several_packets() {
    let (_p, port) = start("");
    let mut conn = maria_connect(port).await;
    let big = vec![b'x'; 17 * 1024 * 1024 + 3];
    conn.exec_drop("INSERT INTO blobs VALUES (?, ?)", (1, big.clone()))
        .await
        .unwrap();
    let back: Vec<u8> = conn
        .query_first("/* fulcrum:primary */ SELECT b FROM blobs WHERE id = 1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back.len(), big.len());
    assert!(back == big, "the 17 MiB value came back intact");
    conn.query_drop("DELETE FROM blobs").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_data_local_infile_works_when_allowed() {
    let (_p, port) = start("allow_local_infile = true");
    let file = std::env::temp_dir().join(format!("fulcrum-infile-{}.txt", std::process::id()));
    std::fs::write(
        &file,
        (1..=500).map(|i| format!("{i}\n")).collect::<String>(),
    )
    .unwrap();
    let mut conn = maria_connect(port).await;
    let before: i64 = conn
        .query_first("/* fulcrum:primary */ SELECT COUNT(*) FROM items")
        .await
        .unwrap()
        .unwrap();
    let out = std::process::Command::new("mariadb")
        .args([
            "--no-defaults",
            "--protocol=TCP",
            "-h",
            "127.0.0.1",
            "-P",
            &port.to_string(),
        ])
        .args([
            "-u",
            APP_USER,
            &format!("-p{APP_PASSWORD}"),
            "--local-infile=1",
            APP_DB,
            "-e",
        ])
        .arg(format!(
            "LOAD DATA LOCAL INFILE '{}' INTO TABLE items (v)",
            file.display()
        ))
        .output()
        .expect("mariadb client");
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after: i64 = conn
        .query_first("/* fulcrum:primary */ SELECT COUNT(*) FROM items")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after - before, 500, "every line of the file was loaded");
}

/// `max_prepared_statements` bounds the statements on a server connection
/// by closing the least recently used (COM_STMT_CLOSE) and preparing them
/// again when used: 30 statements under a bound of 10 all run, twice, on
/// the same server connection (before, it was closed each time it went
/// over the bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_over_the_bound_are_closed_and_prepared_again() {
    let (_p, port) = start("pool_size = 1\nmax_prepared_statements = 10");
    let mut conn = maria_connect(port).await;
    let first: u64 = conn
        .query_first("SELECT CONNECTION_ID() /* fulcrum:primary */")
        .await
        .unwrap()
        .unwrap();
    for round in 0..2 {
        for i in 0..30u64 {
            // All on the primary, so one server connection sees them all.
            let sql = format!("SELECT {i} + ? /* fulcrum:primary */");
            let v: u64 = conn
                .exec_first(sql.as_str(), (1u64,))
                .await
                .unwrap_or_else(|e| panic!("round {round}, statement {i}: {e}"))
                .unwrap();
            assert_eq!(v, i + 1);
        }
    }
    let last: u64 = conn
        .query_first("SELECT CONNECTION_ID() /* fulcrum:primary */")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(last, first, "the same server connection");
}

/// A pinned client that leaves (user variables, a temporary table, a named
/// lock, a prepared statement) leaves nothing on the server connection the
/// next client is given (a pool of one to the primary: the next client
/// would get the same connection if it went back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_client_leaves_nothing_for_the_next_client() {
    let (_p, port) = start("pool_size = 1\npool_timeout = \"5s\"");
    let mut pinned = maria_connect(port).await;
    pinned.query_drop("SET @leak = 42").await.unwrap();
    pinned
        .query_drop("CREATE TEMPORARY TABLE leak_tmp (id INT)")
        .await
        .unwrap();
    let got: i64 = pinned
        .query_first("SELECT GET_LOCK('fulcrum_leak_lock', 0)")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, 1);
    let stmt = pinned.prep("SELECT ? + 1").await.unwrap();
    let two: i64 = pinned.exec_first(&stmt, (1,)).await.unwrap().unwrap();
    assert_eq!(two, 2);
    pinned.disconnect().await.unwrap();

    let mut next = maria_connect(port).await;
    let v: Option<i64> = next
        .query_first("/* fulcrum:primary */ SELECT @leak")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v, None, "the user variable is gone");
    let free: i64 = next
        .query_first("/* fulcrum:primary */ SELECT IS_FREE_LOCK('fulcrum_leak_lock')")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(free, 1, "the named lock was released");
    let missing = next
        .query_drop("/* fulcrum:primary */ SELECT * FROM leak_tmp")
        .await
        .expect_err("the temporary table is gone");
    assert!(
        matches!(&missing, mysql_async::Error::Server(s) if s.code == 1146),
        "{missing:?}"
    );
}

/// Default-deny on MySQL: a stored procedure that sets a user variable, and
/// a statement sqlparser cannot read (`HANDLER ... OPEN`), pin their client,
/// so what they leave never reaches the next client of the one server
/// connection (before, both went back to the pool as plain writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_fulcrum_cannot_prove_harmless_leaves_nothing_for_the_next_client() {
    cluster()
        .primary()
        .sql_script(
            APP_DB,
            "DROP PROCEDURE IF EXISTS leak_var;
             DELIMITER //
             CREATE PROCEDURE leak_var() BEGIN SET @proc_leak = 7; END//
             DELIMITER ;",
        )
        .expect("procedure");
    cluster()
        .wait_replicas_caught_up(Duration::from_secs(30))
        .expect("replicated");
    let (_p, port) = start("pool_size = 1\npool_timeout = \"5s\"");
    {
        let mut a = maria_connect(port).await;
        a.query_drop("CALL leak_var()").await.unwrap();
        a.query_drop("HANDLER items OPEN AS leak_h").await.unwrap();
        a.disconnect().await.unwrap();
    }
    let mut next = maria_connect(port).await;
    let v: Option<i64> = next
        .query_first("/* fulcrum:primary */ SELECT @proc_leak")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v, None, "the procedure's user variable is gone");
    let closed = next
        .query_drop("HANDLER leak_h READ FIRST")
        .await
        .expect_err("the handler is gone");
    assert!(
        matches!(&closed, mysql_async::Error::Server(s) if s.code == 1109),
        "{closed:?}"
    );
}

/// Default-deny on MySQL: `SET TRANSACTION ...` without SESSION sets the
/// next transaction's characteristics, which the server connection keeps
/// until that transaction starts. It pins its client, so when the client
/// leaves, its connection is reset before the next client of the pool of
/// one gets it: that client's transaction runs at the default REPEATABLE
/// READ and never reads another transaction's uncommitted write (before,
/// the statement went back to the pool with the connection, and the next
/// client's transaction ran READ UNCOMMITTED).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_next_transaction_level_never_reaches_the_next_client() {
    cluster()
        .primary()
        .sql_script(
            APP_DB,
            "DROP TABLE IF EXISTS next_level_t;
             CREATE TABLE next_level_t (id INT PRIMARY KEY, v INT) ENGINE=InnoDB;
             INSERT INTO next_level_t VALUES (1, 1);",
        )
        .expect("table");
    cluster()
        .wait_replicas_caught_up(Duration::from_secs(30))
        .expect("replicated");
    let (_p, port) = start("pool_size = 1\npool_timeout = \"5s\"");
    // An uncommitted write, directly on the primary, open to the end.
    let mut dirty = maria_connect(cluster().primary().port()).await;
    dirty.query_drop("START TRANSACTION").await.unwrap();
    dirty
        .query_drop("UPDATE next_level_t SET v = 999 WHERE id = 1")
        .await
        .unwrap();
    let read = "/* fulcrum:primary */ SELECT v FROM next_level_t WHERE id = 1";
    // The client's own next transaction reads uncommitted, as directly.
    let mut a = maria_connect(port).await;
    a.query_drop("SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")
        .await
        .unwrap();
    a.query_drop("START TRANSACTION").await.unwrap();
    let own: i64 = a.query_first(read).await.unwrap().unwrap();
    assert_eq!(own, 999, "the level reached the client's own transaction");
    a.query_drop("COMMIT").await.unwrap();
    // Again, and the client leaves with the level pending.
    a.query_drop("SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")
        .await
        .unwrap();
    a.disconnect().await.unwrap();
    let mut next = maria_connect(port).await;
    next.query_drop("START TRANSACTION").await.unwrap();
    let seen: i64 = next.query_first(read).await.unwrap().unwrap();
    next.query_drop("COMMIT").await.unwrap();
    assert_eq!(seen, 1, "another client's level reached this transaction");
    dirty.query_drop("ROLLBACK").await.unwrap();
}
