//! Clients and their connections: the mariadb client and refused logins,
//! KILL QUERY (and its refusal across users), mariadb-admin, idle and query
//! timeouts, statement digests, and `server_check_delay`.

use std::time::Duration;

use fulcrum_suite::{maria_connect, metric_sum, scrape, with_metrics};
use fulcrum_testkit::{free_port, run_mariadb, FulcrumProcess, APP_DB, APP_PASSWORD, APP_USER};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::helpers::{cluster, config, replica_ports, start, start_metered};

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

/// A client connected before a config reload is still found by KILL
/// QUERY from one connected after it (the new context knows the old
/// one's clients), and its query is stopped on the server it runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_query_reaches_a_client_connected_before_a_reload() {
    let (p, port) = start("");
    let mut victim = maria_connect(port).await;
    let victim_id = victim.id();
    victim.query_drop("SELECT 1").await.unwrap();
    let file = std::fs::read_to_string(p.config_path()).unwrap();
    let changed = file.replacen(
        "[[cluster]]\n",
        "[[cluster]]\nserver_check_delay = \"31s\"\n",
        1,
    );
    assert_ne!(file, changed);
    std::fs::write(p.config_path(), changed).unwrap();
    p.signal(fulcrum_testkit::Signal::Hup).unwrap();
    p.wait_for_log("config reloaded", Duration::from_secs(10))
        .unwrap();
    let sleeper = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let r = victim.query_drop("SELECT SLEEP(20)").await;
        (started.elapsed(), r)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut killer = maria_connect(port).await;
    killer
        .query_drop(format!("KILL QUERY {victim_id}"))
        .await
        .unwrap_or_else(|e| panic!("KILL QUERY of a client from before the reload: {e:?}"));
    let (took, _) = sleeper.await.unwrap();
    assert!(
        took < Duration::from_secs(10),
        "the query was stopped ({took:?})"
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

/// `client_idle_timeout` closes a quiet client (ERR 4031 naming the key),
/// not a busy one;
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
    // Busy past the first deadline (a command every 400 ms for 2.4 s): the
    // timer only moved later, so it goes off at 1.5 s and is set again;
    // the client stays.
    for _ in 0..6 {
        let one: i64 = idle.query_first("SELECT 1").await.unwrap().unwrap();
        assert_eq!(one, 1);
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let one: i64 = idle.query_first("SELECT 1").await.unwrap().unwrap();
    assert_eq!(one, 1, "busy: not closed");
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
