//! The MySQL front end on a real MariaDB primary with two GTID replicas (the
//! testkit's; the `app` user has no SUPER, so a write misrouted to a
//! read-only replica fails with 1290): the `mariadb` command-line client and
//! mysql_async through Fulcrum, reads spread over the replicas, writes and
//! transactions on the primary, session state kept, bad logins refused.

use std::collections::HashSet;
use std::sync::OnceLock;
use std::time::Duration;

use fulcrum_suite::{
    maria_connect, maria_toml, metric_sum, scrape, start_with_metrics, with_metrics,
};
use fulcrum_testkit::{
    free_port, run_mariadb, FulcrumProcess, MariaCluster, APP_DB, APP_PASSWORD, APP_USER,
};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;

/// This module's own cluster (64 MiB packets for the 16 MiB payload test).
fn cluster() -> &'static MariaCluster {
    static CLUSTER: OnceLock<MariaCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let c = MariaCluster::builder()
            .replicas(2)
            .setting("max-allowed-packet", "64M")
            .start()
            .expect("MariaDB cluster");
        for table in [
            "CREATE TABLE items (id INT AUTO_INCREMENT PRIMARY KEY, v INT)",
            "CREATE TABLE blobs (id INT PRIMARY KEY, b LONGBLOB)",
            "CREATE TABLE found_rows_t (id INT PRIMARY KEY)",
            "INSERT INTO found_rows_t VALUES (1), (2), (3), (4), (5), (6), (7)",
        ] {
            c.primary().sql(table).expect("table");
        }
        c.wait_replicas_caught_up(Duration::from_secs(30))
            .expect("catch up");
        c
    })
}

/// Fulcrum's config for the cluster, listening on `port`.
fn config(port: u16, extra: &str) -> String {
    maria_toml(
        cluster(),
        port,
        &format!("client_auth = \"mysql_native_password\"\nhealth_interval = \"500ms\"\n{extra}"),
    )
}

fn start(extra: &str) -> (FulcrumProcess, u16) {
    let port = free_port();
    let p = FulcrumProcess::start(&config(port, extra)).expect("fulcrum starts");
    (p, port)
}

/// `start` with a metrics listener; returns its port too.
fn start_metered(extra: &str) -> (FulcrumProcess, u16, u16) {
    let port = free_port();
    let (p, metrics_port) = start_with_metrics(&config(port, extra));
    (p, port, metrics_port)
}

async fn port_of(conn: &mut Conn, sql: &str) -> u16 {
    conn.query_first::<u16, _>(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .expect("a row")
}

fn replica_ports() -> HashSet<u16> {
    cluster().replicas().iter().map(|r| r.port()).collect()
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
async fn the_mariadb_client_works_and_bad_logins_are_refused() {
    let (_p, port) = start("");
    let addr = format!("127.0.0.1:{port}");
    let out = run_mariadb(
        &addr,
        APP_USER,
        APP_PASSWORD,
        APP_DB,
        "SELECT @@port; SELECT 1+1",
    )
    .unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        replica_ports().contains(&lines[0].trim().parse().unwrap()),
        "{out}"
    );
    assert_eq!(lines[1].trim(), "2");
    run_mariadb(
        &addr,
        APP_USER,
        APP_PASSWORD,
        APP_DB,
        "INSERT INTO items (v) VALUES (3)",
    )
    .unwrap();

    let wrong = run_mariadb(&addr, APP_USER, "nope", APP_DB, "SELECT 1").unwrap_err();
    assert!(format!("{wrong}").contains("1045"), "{wrong}");
    let unknown_db =
        run_mariadb(&addr, APP_USER, APP_PASSWORD, "no_such_db", "SELECT 1").unwrap_err();
    // The server's own answer is passed on: 1044 for a user with no rights
    // on it (as here), 1049 for one who has.
    let text = format!("{unknown_db}");
    assert!(
        text.contains("1044") && text.contains("no_such_db"),
        "{text}"
    );
    // Other clients are unharmed.
    let mut conn = maria_connect(port).await;
    conn.query_drop("SELECT 1").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_query_stops_only_the_named_clients_query() {
    let (_p, port) = start("");
    let mut victim = maria_connect(port).await;
    let mut bystander = maria_connect(port).await;
    let victim_id = victim.id();
    let sleeper = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let r = victim.query_drop("SELECT SLEEP(20)").await;
        (started.elapsed(), r, victim)
    });
    let bystander_sleep = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let v: i64 = bystander
            .query_first("SELECT SLEEP(2)")
            .await
            .unwrap()
            .unwrap();
        (started.elapsed(), v)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut killer = maria_connect(port).await;
    killer
        .query_drop(format!("KILL QUERY {victim_id}"))
        .await
        .unwrap();
    let (took, _result, mut victim) = sleeper.await.unwrap();
    assert!(
        took < Duration::from_secs(10),
        "the named query was stopped ({took:?})"
    );
    let (other_took, v) = bystander_sleep.await.unwrap();
    assert_eq!(v, 0, "the other client's SLEEP was not interrupted");
    assert!(other_took >= Duration::from_secs(2));
    // The killed client's connection still works.
    let one: i64 = victim.query_first("SELECT 1").await.unwrap().unwrap();
    assert_eq!(one, 1);
    let e = killer.query_drop("KILL QUERY 999999").await.unwrap_err();
    assert!(
        matches!(&e, mysql_async::Error::Server(s) if s.code == 1094),
        "{e:?}"
    );
}

/// KILL QUERY names a client by Fulcrum's id: only a client of the same
/// user may stop it; another user gets the server's own answer to a user
/// without the PROCESS privilege (ERR 1095), and the query runs on, even
/// when that user could kill any thread on the server itself (SUPER here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_query_of_another_users_client_is_refused_with_1095() {
    cluster()
        .primary()
        .sql(&format!(
            "CREATE USER IF NOT EXISTS 'other'@'%' IDENTIFIED BY '{APP_PASSWORD}'; \
             GRANT ALL ON app.* TO 'other'@'%'; GRANT SUPER ON *.* TO 'other'@'%'"
        ))
        .expect("second user");
    cluster()
        .wait_replicas_caught_up(Duration::from_secs(30))
        .expect("catch up");
    let port = free_port();
    let toml = format!(
        "{}[[cluster.user]]\nname = \"other\"\npassword = \"{APP_PASSWORD}\"\n",
        config(port, "")
    );
    let _p = FulcrumProcess::start(&toml).expect("fulcrum starts");
    let mut victim = maria_connect(port).await;
    let victim_id = victim.id();
    let sleeper = tokio::spawn(async move {
        let v: Option<i64> = victim.query_first("SELECT SLEEP(2)").await.unwrap();
        v
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut other = Conn::new(
        fulcrum_suite::maria_opts(port)
            .user(Some("other"))
            .pass(Some(APP_PASSWORD)),
    )
    .await
    .expect("the other user logs in");
    let e = other
        .query_drop(format!("KILL QUERY {victim_id}"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, mysql_async::Error::Server(s) if s.code == 1095),
        "{e:?}"
    );
    assert_eq!(
        sleeper.await.unwrap(),
        Some(0),
        "the other user's KILL stopped nothing"
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_admin_ping_and_status_work() {
    let (_p, port) = start("");
    for command in ["ping", "status"] {
        let out = std::process::Command::new("mariadb-admin")
            .args([
                "--no-defaults",
                "--protocol=TCP",
                "-h",
                "127.0.0.1",
                "-P",
                &port.to_string(),
            ])
            .args(["-u", APP_USER, &format!("-p{APP_PASSWORD}"), command])
            .output()
            .expect("mariadb-admin");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let want = if command == "ping" {
            "mysqld is alive"
        } else {
            "Uptime"
        };
        assert!(
            stdout.contains(want),
            "{command} (COM_PING / COM_STATISTICS): {stdout}"
        );
    }
}

/// `client_idle_timeout` closes a quiet client (ERR 4031 naming the key);
/// `idle_transaction_timeout` closes one quiet inside a transaction, whose
/// work is rolled back and whose server connection goes back to the pool
/// (a pool of one serves the next client at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_clients_and_idle_transactions_are_closed() {
    let (_p, port) = start(
        "pool_size = 1\nclient_idle_timeout = \"1500ms\"\nidle_transaction_timeout = \"1s\"\npool_timeout = \"3s\"",
    );
    let mut setup = maria_connect(port).await;
    setup
        .query_drop("CREATE TABLE IF NOT EXISTS idle_rows (id INT)")
        .await
        .unwrap();
    drop(setup);

    let mut idle = maria_connect(port).await;
    let one: i64 = idle.query_first("SELECT 1").await.unwrap().unwrap();
    assert_eq!(one, 1);
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let e = idle.query_drop("SELECT 1").await.expect_err("closed");
    let text = e.to_string();
    assert!(
        text.contains("4031") || text.contains("client_idle_timeout") || text.contains("closed"),
        "{text}"
    );

    let mut txn = maria_connect(port).await;
    txn.query_drop("BEGIN").await.unwrap();
    txn.query_drop("INSERT INTO idle_rows VALUES (4031)")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert!(
        txn.query_drop("COMMIT").await.is_err(),
        "closed before COMMIT"
    );
    let mut other = maria_connect(port).await;
    let started = std::time::Instant::now();
    let n: i64 = other
        .query_first("SELECT COUNT(*) FROM idle_rows WHERE id = 4031")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 0, "rolled back");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
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

/// `query_timeout`: a query the server has been silent on this long is
/// killed there (KILL QUERY): it ends early (MariaDB's ERR 1317 where the
/// statement reports it) and the connection goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_timeout_kills_a_silent_query_and_the_connection_goes_on() {
    let (_p, port) = start("query_timeout = \"500ms\"");
    let mut conn = maria_connect(port).await;
    let started = std::time::Instant::now();
    // Minutes of work on this machine; MariaDB ends an interrupted
    // BENCHMARK early (with ERR 1317, or a plain result).
    let r = conn
        .query_drop("SELECT BENCHMARK(2000000000, MD5('fulcrum'))")
        .await;
    if let Err(e) = &r {
        assert!(e.to_string().contains("1317"), "{e}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "killed early: {:?}",
        started.elapsed()
    );
    let n: i64 = conn.query_first("SELECT 6 * 7").await.unwrap().unwrap();
    assert_eq!(n, 42);
}

/// Digest statistics on MariaDB: text and prepared executions of one
/// statement with different literals are one digest, counted with their rows
/// and errors and where they ran; `digest_metrics_top` exports the top ones
/// to Prometheus, and one that leaves the table leaves the scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_digests_are_counted_and_exported() {
    let metrics_port = free_port();
    let port = free_port();
    let toml = with_metrics(&config(port, "digest_metrics_top = 50"), metrics_port);
    let _p = FulcrumProcess::start(&toml).expect("fulcrum starts");
    let mut conn = maria_connect(port).await;
    for i in 0..6 {
        let n: Option<i64> = conn
            .query_first(format!("SELECT COUNT(*) FROM items WHERE v >= {i}"))
            .await
            .unwrap();
        assert!(n.is_some());
    }
    let stmt = conn
        .prep("SELECT COUNT(*) FROM items WHERE v >= ?")
        .await
        .unwrap();
    for i in 0..4i64 {
        let _: Option<i64> = conn.exec_first(&stmt, (i,)).await.unwrap();
    }
    conn.query_drop("INSERT INTO items (v) VALUES (1), (2), (3)")
        .await
        .unwrap();
    assert!(conn.query_drop("SELECT nope FROM items").await.is_err());
    // Double-quoted strings are literals in MySQL: no secret reaches the
    // exported digests, in or out of an executable comment.
    conn.query_drop("SELECT COUNT(*) FROM items WHERE \"S3cret-pw\" = \"alice@x\"")
        .await
        .unwrap();
    conn.query_drop("SELECT /*!50000 \"S3cret-in-comment\", */ COUNT(*) FROM items")
        .await
        .unwrap();
    let body = scrape(metrics_port);
    for secret in ["S3cret-pw", "alice@x", "S3cret-in-comment"] {
        assert!(!body.contains(secret), "{secret} exported:\n{body}");
    }
    let value = |metric: &str, query: &str| -> f64 {
        let label = format!("query=\"{query}\"");
        body.lines()
            .find(|l| l.starts_with(&format!("{metric}{{")) && l.contains(&label))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{metric} {label} not in:\n{body}"))
    };
    let select = "select count(*) from items where v >= ?";
    assert_eq!(
        value("fulcrum_query_digest_calls", select),
        10.0,
        "6 text + 4 prepared"
    );
    assert_eq!(
        value("fulcrum_query_digest_rows", select),
        10.0,
        "one row each"
    );
    assert!(value("fulcrum_query_digest_seconds", select) > 0.0);
    assert!(value("fulcrum_query_digest_p99_seconds", select) > 0.0);
    let insert = "insert into items (v) values (?), (?), (?)";
    assert_eq!(
        value("fulcrum_query_digest_rows", insert),
        3.0,
        "affected rows"
    );
    assert_eq!(
        value("fulcrum_query_digest_errors", "select nope from items"),
        1.0
    );
}

/// `server_check_delay = "0s"`: every reuse is checked with COM_PING; a live
/// connection passes, so the client stays on the same server thread. Each
/// check is counted in `fulcrum_server_checks_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_check_delay_pings_reused_connections_and_keeps_live_ones() {
    let (_p, port, metrics_port) =
        start_metered("server_check_delay = \"0s\"\nreads_on_primary = true\npool_size = 1");
    let mut conn = maria_connect(port).await;
    conn.query_drop("BEGIN").await.unwrap();
    let first: Option<u64> = conn.query_first("SELECT CONNECTION_ID()").await.unwrap();
    conn.query_drop("COMMIT").await.unwrap();
    for _ in 0..10 {
        conn.query_drop("BEGIN").await.unwrap();
        let id: Option<u64> = conn.query_first("SELECT CONNECTION_ID()").await.unwrap();
        conn.query_drop("COMMIT").await.unwrap();
        assert_eq!(id, first, "the same server connection, checked and kept");
    }
    // 11 transactions on one pooled connection: the 10 after the first
    // reused it, checked (counted before it is handed out).
    let passed = metric_sum(
        metrics_port,
        "fulcrum_server_checks_total",
        "outcome=\"passed\"",
    );
    assert!(passed >= 10, "10 checks passed, counted {passed}");
    // Fulcrum's own time before the server sees a command is measured for
    // each unit that took a connection (11 transactions at least).
    let measured = metric_sum(metrics_port, "fulcrum_proxy_seconds_count", "cluster=");
    assert!(
        measured >= 11,
        "fulcrum_proxy_seconds observed {measured} times"
    );
    assert_eq!(
        metric_sum(
            metrics_port,
            "fulcrum_server_checks_total",
            "outcome=\"failed\""
        ),
        0
    );
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
