//! Routing through Fulcrum to MariaDB: reads to both replicas and writes to
//! the primary, FOUND_ROWS, transactions on the primary, session mode,
//! functions routed by the servers' catalog and that catalog read at login.

use std::collections::HashSet;
use std::time::Duration;

use fulcrum_suite::{maria_connect, metric_sum};
use fulcrum_testkit::APP_DB;
use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::helpers::{cluster, replica_ports, start, start_metered};

async fn port_of(conn: &mut Conn, sql: &str) -> u16 {
    conn.query_first::<u16, _>(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .expect("a row")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_go_to_both_replicas_and_writes_to_the_primary() {
    let (_p, port) = start("");
    let mut conn = maria_connect(port).await;
    let mut seen = HashSet::new();
    for _ in 0..10 {
        let p = port_of(&mut conn, "SELECT @@port").await;
        assert!(replica_ports().contains(&p), "read served by {p}");
        seen.insert(p);
    }
    assert_eq!(seen, replica_ports(), "both replicas serve reads");
    // A write succeeds (on a replica it would fail with 1290).
    conn.query_drop("INSERT INTO items (v) VALUES (1)")
        .await
        .unwrap();
    let id: u64 = conn
        .query_first("SELECT LAST_INSERT_ID()")
        .await
        .unwrap()
        .unwrap();
    assert!(
        id > 0,
        "LAST_INSERT_ID() answered on the connection that inserted"
    );
    assert_eq!(
        port_of(&mut conn, "SELECT @@port FOR UPDATE").await,
        cluster().primary().port()
    );
}

/// `FOUND_ROWS()` answers for the `SQL_CALC_FOUND_ROWS` before it, as
/// directly: both run on one server connection, and Fulcrum asks that
/// connection nothing in between (mysql_async asks for no session
/// tracking, so a write's GTID would otherwise be asked with
/// `SELECT @@last_gtid`, which resets `FOUND_ROWS()`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn found_rows_runs_where_calc_found_rows_did() {
    let (_p, port) = start("");
    let mut conn = maria_connect(port).await;
    for sql in [
        "SELECT SQL_CALC_FOUND_ROWS id FROM found_rows_t LIMIT 1",
        "select /*! sql_calc_found_rows */ id from found_rows_t where id > 0 limit 2",
    ] {
        for _ in 0..3 {
            conn.query_drop(sql).await.unwrap();
            let n: u64 = conn
                .query_first("SELECT FOUND_ROWS()")
                .await
                .unwrap()
                .unwrap();
            assert_eq!(n, 7, "FOUND_ROWS() after {sql}");
        }
    }
    // A plain read (on the primary now: after a SQL_CALC_FOUND_ROWS unit
    // the client's position counts as unknown) is asked nothing after it
    // either: FOUND_ROWS() counts its rows, as directly. (One client: the
    // primary's idle connection it used is the one it gets again.)
    conn.query_drop("SELECT 'sql_calc_found_rows' FROM found_rows_t LIMIT 3")
        .await
        .unwrap();
    let n: u64 = conn
        .query_first("SELECT FOUND_ROWS()")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_stays_on_the_primary_until_it_ends() {
    let (_p, port) = start("");
    let mut conn = maria_connect(port).await;
    let primary = cluster().primary().port();
    conn.query_drop("BEGIN").await.unwrap();
    for _ in 0..4 {
        assert_eq!(port_of(&mut conn, "SELECT @@port").await, primary);
    }
    conn.query_drop("INSERT INTO items (v) VALUES (2)")
        .await
        .unwrap();
    conn.query_drop("COMMIT").await.unwrap();
    // The transaction is over: reads may leave the primary again. Under the
    // default `consistency = "session"` this client's write would send a
    // read to the primary while the replicas have not applied it yet, so
    // the read asks for eventual consistency to see the routing alone.
    assert!(replica_ports().contains(
        &port_of(
            &mut conn,
            "/* fulcrum:consistency=eventual */ SELECT @@port"
        )
        .await
    ));
    // A read-only transaction may use a replica.
    conn.query_drop("START TRANSACTION READ ONLY")
        .await
        .unwrap();
    let p = port_of(&mut conn, "SELECT @@port").await;
    assert_eq!(
        port_of(&mut conn, "SELECT @@port").await,
        p,
        "one server for the transaction"
    );
    conn.query_drop("COMMIT").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_keeps_every_statement_on_the_primary() {
    let (_p, port) = start("pool_mode = \"session\"");
    let mut conn = maria_connect(port).await;
    for _ in 0..5 {
        assert_eq!(
            port_of(&mut conn, "SELECT @@port").await,
            cluster().primary().port()
        );
    }
}

/// `function_catalog` on MariaDB: a function declared MODIFIES SQL DATA runs
/// on the primary (on a replica the app user gets 1290), a deterministic
/// NO SQL one goes to the replicas once looked up; with the catalog off the
/// writing one reaches a replica and fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_are_routed_by_the_servers_catalog() {
    let c = cluster();
    // Functions without DETERMINISTIC / NO SQL / READS SQL DATA are refused
    // with binary logging on (1418), on the replicas' appliers too.
    for r in c.replicas() {
        r.sql("SET GLOBAL log_bin_trust_function_creators = 1")
            .expect("replica setting");
    }
    c.primary()
        .sql_script(
            APP_DB,
            "SET GLOBAL log_bin_trust_function_creators = 1;
             DROP FUNCTION IF EXISTS bump_items;
             DROP FUNCTION IF EXISTS twice;
             DELIMITER //
             CREATE FUNCTION bump_items() RETURNS INT MODIFIES SQL DATA
               BEGIN INSERT INTO items (v) VALUES (99); RETURN 1; END//
             CREATE FUNCTION twice(x INT) RETURNS INT DETERMINISTIC NO SQL RETURN x * 2//
             DELIMITER ;",
        )
        .expect("functions");
    c.wait_replicas_caught_up(Duration::from_secs(30))
        .expect("replicated");
    // Declared free of session state: only then may a call go unpinned
    // (default-deny), and the catalog route it.
    let free = "session_free_functions = [\"bump_items\", \"twice\"]";
    let (_p, port, metrics_port) = start_metered(free);
    let mut conn = maria_connect(port).await;
    for _ in 0..4 {
        let v: Option<i64> = conn.query_first("SELECT bump_items()").await.unwrap();
        assert_eq!(v, Some(1), "a writing function runs on the primary");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let p = port_of(&mut conn, "SELECT @@port + twice(0)").await;
        if replica_ports().contains(&p) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a NO SQL function never reached a replica"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let loaded = metric_sum(
        metrics_port,
        "fulcrum_function_catalog_lookups_total",
        "outcome=\"loaded\"",
    );
    assert!(loaded >= 1, "the lookup that routed twice() is counted");
    let (_off, port) = start(&format!("function_catalog = false\n{free}"));
    let mut conn = maria_connect(port).await;
    let err = conn.query_drop("SELECT bump_items()").await.unwrap_err();
    assert!(
        err.to_string().contains("1290"),
        "without the catalog it reaches a replica: {err}"
    );
    // Not declared: a call of a stored function pins its client, on the
    // primary, where it runs whatever it does to the session.
    let (_pin, port) = start("");
    let mut conn = maria_connect(port).await;
    let first = port_of(&mut conn, "SELECT @@port + twice(0)").await;
    assert!(!replica_ports().contains(&first), "pinned to the primary");
    let id: u64 = conn
        .query_first("SELECT CONNECTION_ID() + 0")
        .await
        .unwrap()
        .unwrap();
    let again: u64 = conn
        .query_first("SELECT CONNECTION_ID() + 0")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(id, again, "the pinned client keeps its server connection");
}

/// Right from the first query, and the same catalog for every user: on a
/// fresh Fulcrum the very first statement of the first client reads
/// through a NO SQL function and goes to a replica (the login waited for
/// the schema's catalog, `function_catalog_wait`). The catalog is read as
/// the health user: a first client who may see no routine
/// (information_schema.ROUTINES lists only a user's own) does not make
/// another user's writing function look like a built-in read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_is_read_at_login_as_the_health_user() {
    let c = cluster();
    for r in c.replicas() {
        r.sql("SET GLOBAL log_bin_trust_function_creators = 1")
            .expect("replica setting");
    }
    c.primary()
        .sql_script(
            APP_DB,
            &format!(
                "SET GLOBAL log_bin_trust_function_creators = 1;
                 CREATE USER IF NOT EXISTS 'narrow'@'%' IDENTIFIED BY 'narrow-pw';
                 GRANT SELECT ON {APP_DB}.items TO 'narrow'@'%';
                 DROP FUNCTION IF EXISTS bump_first;
                 DROP FUNCTION IF EXISTS thrice;
                 DELIMITER //
                 CREATE FUNCTION bump_first() RETURNS INT MODIFIES SQL DATA
                   BEGIN INSERT INTO items (v) VALUES (98); RETURN 1; END//
                 CREATE FUNCTION thrice(x INT) RETURNS INT DETERMINISTIC NO SQL RETURN x * 3//
                 DELIMITER ;"
            ),
        )
        .expect("functions and user");
    c.wait_replicas_caught_up(Duration::from_secs(30))
        .expect("replicated");
    // The first statement of a fresh Fulcrum (a wait longer than the
    // default 100 ms: a busy machine's lookup may take longer).
    // (Both declared free of session state: unlisted, a call pins.)
    let free = "session_free_functions = [\"thrice\", \"bump_first\"]";
    let (_p, port) = start(&format!("function_catalog_wait = \"5s\"\n{free}"));
    let mut first = maria_connect(port).await;
    let p = port_of(&mut first, "SELECT @@port + thrice(0)").await;
    assert!(replica_ports().contains(&p), "the first read went to {p}");
    // A user who sees no routine logs in first to another Fulcrum.
    let (_q, port) = start(&format!(
        "{free}\n[[cluster.user]]\nname = \"narrow\"\npassword = \"narrow-pw\""
    ));
    let narrow = fulcrum_suite::maria_opts(port)
        .user(Some("narrow"))
        .pass(Some("narrow-pw"));
    let mut narrow = Conn::new(narrow).await.expect("narrow logs in");
    // (It may not run thrice(); the read only makes the catalog wanted.)
    let _ = narrow
        .query_drop("SELECT thrice(1) FROM items LIMIT 1")
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut app = maria_connect(port).await;
    for _ in 0..3 {
        let v: Option<i64> = app
            .query_first("SELECT bump_first()")
            .await
            .unwrap_or_else(|e| panic!("a writing function reached a replica: {e}"));
        assert_eq!(v, Some(1));
    }
}
