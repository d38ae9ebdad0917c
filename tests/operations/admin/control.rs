//! Admin console commands that act on backends and clients: DISABLE and
//! ENABLE (of a backend and of a database), PAUSE and RESUME, a switchover
//! under writes, RECONNECT, WAIT_CLOSE and KILL.

use std::time::Duration;

use fulcrum_suite::{pg_connect, try_console_connect, PgProxyConfig, CONSOLE_PASSWORD};
use fulcrum_testkit::{free_port, FulcrumProcess, APP_DB, APP_USER};
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

use super::helpers::{console_toml, setup, show};

async fn port_of(c: &Client) -> u16 {
    let msgs = c.simple_query("SELECT inet_server_port()").await.unwrap();
    msgs.iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(|p| p.parse().unwrap()),
            _ => None,
        })
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_drains_a_backend_and_enable_brings_it_back() {
    let s = tokio::task::block_in_place(setup);
    let a = try_console_connect(s.admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    let c = pg_connect(&s.cfg).await;
    assert_eq!(port_of(&c).await, s.replica);
    a.simple_query(&format!("DISABLE {}", s.replica_addr))
        .await
        .unwrap();
    for _ in 0..5 {
        assert_eq!(
            port_of(&c).await,
            s.primary,
            "reads leave the disabled replica"
        );
    }
    let (_, clusters) = show(&a, "SHOW CLUSTERS").await;
    assert!(clusters
        .iter()
        .any(|r| r[2] == s.replica_addr && r[8] == "true"));
    let reason_of = |rows: &Vec<Vec<String>>| {
        rows.iter()
            .find(|r| r[1] == s.replica_addr)
            .map(|r| r[8].clone())
            .unwrap()
    };
    let (_, backends) = show(&a, "SHOW BACKENDS").await;
    assert!(
        reason_of(&backends).starts_with("disabled by an operator"),
        "SHOW BACKENDS says why: {backends:?}"
    );
    a.simple_query(&format!("ENABLE {}", s.replica_addr))
        .await
        .unwrap();
    assert_eq!(port_of(&c).await, s.replica);
    let (_, backends) = show(&a, "SHOW BACKENDS").await;
    assert_eq!(reason_of(&backends), "", "in service again");
    // The primary cannot be drained.
    let primary_addr = format!("127.0.0.1:{}", s.primary);
    let e = a
        .simple_query(&format!("DISABLE {primary_addr}"))
        .await
        .unwrap_err();
    assert!(format!("{e:?}").contains("primary"), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_new_queries_until_resume() {
    let s = tokio::task::block_in_place(setup);
    let a = try_console_connect(s.admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    let c = pg_connect(&s.cfg).await;
    c.simple_query("SELECT 1").await.unwrap();
    a.simple_query("PAUSE").await.unwrap();
    let held = tokio::spawn(async move {
        let started = std::time::Instant::now();
        c.simple_query("SELECT 1").await.unwrap();
        started.elapsed()
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!held.is_finished(), "the query waits while paused");
    a.simple_query("RESUME").await.unwrap();
    let waited = tokio::time::timeout(Duration::from_secs(5), held)
        .await
        .unwrap()
        .unwrap();
    assert!(waited >= Duration::from_millis(400), "{waited:?}");
}

/// PgBouncer's `PAUSE db`: the database's new queries wait until `RESUME
/// db`, while another database of the same cluster goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_a_database_holds_its_queries_until_resume() {
    const OTHER_DB: &str = "pause_other";
    let c = fulcrum_suite::pg_primary();
    let _ = c
        .primary()
        .sql(&format!("CREATE DATABASE {OTHER_DB} OWNER {APP_USER}"));
    let admin_port = free_port();
    let cfg = PgProxyConfig::new(&c.primary().addr()).client_auth("md5");
    let _p = FulcrumProcess::start(&console_toml(&cfg, admin_port, "")).unwrap();
    let a = try_console_connect(admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    let client = pg_connect(&cfg).await;
    client.simple_query("SELECT 1").await.unwrap();
    let (other, conn) = tokio_postgres::connect(&cfg.conn_string(APP_USER, OTHER_DB), NoTls)
        .await
        .expect("login to the other database");
    tokio::spawn(conn);
    other.simple_query("SELECT 1").await.unwrap();
    let e = a.simple_query("PAUSE no_such_db").await.unwrap_err();
    assert!(format!("{e:?}").contains("no_such_db"), "{e:?}");
    a.simple_query(&format!("PAUSE {APP_DB}")).await.unwrap();
    let held = tokio::spawn(async move {
        let started = std::time::Instant::now();
        client.simple_query("SELECT 1").await.unwrap();
        started.elapsed()
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        !held.is_finished(),
        "the database's query waits while paused"
    );
    tokio::time::timeout(Duration::from_secs(2), other.simple_query("SELECT 1"))
        .await
        .expect("another database of the cluster is not paused")
        .unwrap();
    a.simple_query(&format!("RESUME {APP_DB}")).await.unwrap();
    let waited = tokio::time::timeout(Duration::from_secs(5), held)
        .await
        .unwrap()
        .unwrap();
    assert!(waited >= Duration::from_millis(400), "{waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switchover_under_writes_loses_no_transaction() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    let s = tokio::task::block_in_place(setup);
    s.cluster
        .primary()
        .sql_db(APP_DB, "CREATE TABLE switched (id bigint PRIMARY KEY)")
        .unwrap();
    s.cluster
        .wait_replicas_caught_up(Duration::from_secs(30))
        .unwrap();
    let a = try_console_connect(s.admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(Mutex::new(Vec::<i64>::new()));
    let writers: Vec<_> = (0..4i64)
        .map(|w| {
            let (cfg, stop, failed, acked) =
                (s.cfg.clone(), stop.clone(), failed.clone(), acked.clone());
            tokio::spawn(async move {
                let c = pg_connect(&cfg).await;
                let mut id = w * 1_000_000;
                while !stop.load(Ordering::Relaxed) {
                    id += 1;
                    let r = c
                        .batch_execute(&format!(
                            "BEGIN; INSERT INTO switched VALUES ({id}); COMMIT"
                        ))
                        .await;
                    match r {
                        Ok(()) => acked.lock().unwrap().push(id),
                        Err(e) => {
                            eprintln!("failed: {e:?}");
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (columns, rows) = show(&a, &format!("SWITCHOVER main TO {}", s.replica_addr)).await;
    assert_eq!(columns, ["cluster", "new_primary", "held_ms"]);
    let held: u64 = rows[0][2].parse().unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    eprintln!(
        "switchover held new work for {held} ms; {} transactions committed, {} failed",
        acked.len(),
        failed.load(Ordering::Relaxed)
    );
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no transaction failed");
    assert!(held < 2000, "writes held {held} ms");
    let c = pg_connect(&s.cfg).await;
    let msgs = c
        .simple_query("/* fulcrum:primary */ SELECT inet_server_port()")
        .await
        .unwrap();
    let port: u16 = msgs
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(|p| p.parse().unwrap()),
            _ => None,
        })
        .unwrap();
    assert_eq!(port, s.replica, "writes go to the new primary");
    let new_primary = &s.cluster.replicas()[0];
    let present = new_primary
        .sql_db(APP_DB, "SELECT count(*) FROM switched")
        .unwrap();
    if present.trim() != acked.len().to_string() {
        let on_new = new_primary
            .sql_db(APP_DB, "SELECT string_agg(id::text, ',') FROM switched")
            .unwrap();
        let on_new: std::collections::HashSet<i64> = on_new
            .trim()
            .split(',')
            .map(|x| x.parse().unwrap())
            .collect();
        let missing: Vec<i64> = acked
            .iter()
            .copied()
            .filter(|i| !on_new.contains(i))
            .collect();
        let on_old = s
            .cluster
            .primary()
            .sql_db(
                APP_DB,
                &format!(
                    "SELECT string_agg(id::text, ',') FROM switched WHERE id IN ({})",
                    missing
                        .iter()
                        .map(|i| i.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            )
            .unwrap();
        eprintln!("missing on the new primary: {missing:?}; on the old one: {on_old}");
        eprintln!(
            "{}",
            std::fs::read_to_string(s._fulcrum.log_path()).unwrap()
        );
    }
    assert_eq!(
        present.trim(),
        acked.len().to_string(),
        "every committed row is on the new primary"
    );
    let (_, clusters) = show(&a, "SHOW CLUSTERS").await;
    let old = clusters
        .iter()
        .find(|r| r[2] == format!("127.0.0.1:{}", s.primary))
        .unwrap();
    assert_eq!(old[4], "stale", "the old primary is fenced: {clusters:?}");
}

/// RECONNECT closes server connections once they are idle (a transaction in
/// progress keeps its own until it ends), WAIT_CLOSE waits for that, and
/// KILL ends the database's clients with 57P01 while new ones get in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_wait_close_and_kill() {
    let s = tokio::task::block_in_place(setup);
    let a = try_console_connect(s.admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    let idle = pg_connect(&s.cfg).await;
    let busy = pg_connect(&s.cfg).await;
    let pid_in_txn = |c: Client| async move {
        c.batch_execute("BEGIN").await.unwrap();
        let rows = c.simple_query("SELECT pg_backend_pid() + 0").await.unwrap();
        let pid: i32 = rows
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(r) => r.get(0).map(|v| v.parse().unwrap()),
                _ => None,
            })
            .unwrap();
        (c, pid)
    };
    let (busy, before) = pid_in_txn(busy).await;
    show(&a, "RECONNECT app").await;
    let a2 = try_console_connect(s.admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    let waiting = tokio::spawn(async move { a2.simple_query("WAIT_CLOSE app").await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        !waiting.is_finished(),
        "WAIT_CLOSE waits for the transaction"
    );
    busy.batch_execute("COMMIT").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("WAIT_CLOSE returns once the connection closed")
        .unwrap()
        .unwrap();
    let (busy, after) = pid_in_txn(busy).await;
    assert_ne!(before, after, "a fresh server connection after RECONNECT");
    busy.batch_execute("COMMIT").await.unwrap();
    let gone = s
        .cluster
        .primary()
        .sql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = {before}"
        ))
        .unwrap();
    assert_eq!(gone.trim(), "0", "the old server connection is closed");

    show(&a, "KILL app").await;
    let err = tokio::time::timeout(Duration::from_secs(5), idle.simple_query("SELECT 1"))
        .await
        .expect("answered")
        .unwrap_err();
    assert!(
        err.as_db_error()
            .is_some_and(|d| d.code().code() == "57P01")
            || idle.is_closed(),
        "{err:?}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, clients) = show(&a, "SHOW CLIENTS").await;
        if clients.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{clients:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fresh = pg_connect(&s.cfg).await;
    fresh
        .simple_query("SELECT 1")
        .await
        .expect("new clients get in");
    let (_, mem) = show(&a, "SHOW MEM").await;
    let rss: u64 = mem.iter().find(|r| r[0] == "process_rss").unwrap()[3]
        .parse()
        .unwrap();
    assert!(rss > 1024 * 1024, "{mem:?}");
    assert!(
        mem.iter().any(|r| r[0] == "digests" && r[1] == "main"),
        "{mem:?}"
    );
    let err = a.simple_query("KILL").await.unwrap_err();
    assert!(
        err.as_db_error()
            .is_some_and(|d| d.message().contains("usage: KILL")),
        "{err:?}"
    );
}

/// PgBouncer's `DISABLE db` / `ENABLE db`: new logins to the database are
/// refused (55000, as PostgreSQL says for a database that takes no
/// connections) while connected clients go on; `DISABLE BACKEND` keeps
/// the backend verb.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_and_enable_a_database_as_pgbouncer_does() {
    let c = fulcrum_suite::pg_primary();
    let admin_port = free_port();
    let cfg = PgProxyConfig::new(&c.primary().addr()).client_auth("md5");
    let _p = FulcrumProcess::start(&console_toml(&cfg, admin_port, "")).unwrap();
    let connected = pg_connect(&cfg).await;
    let console = try_console_connect(admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    console
        .simple_query(&format!("DISABLE {APP_DB}"))
        .await
        .unwrap();
    let e = tokio_postgres::connect(&cfg.conn_string(APP_USER, APP_DB), NoTls)
        .await
        .err()
        .expect("a new login to a disabled database is refused");
    assert_eq!(e.code().map(|c| c.code()), Some("55000"), "{e:?}");
    assert!(
        e.as_db_error()
            .is_some_and(|d| d.message().contains("not currently accepting connections")),
        "{e:?}"
    );
    connected
        .simple_query("SELECT 1")
        .await
        .expect("a connected client goes on");
    console
        .simple_query(&format!("ENABLE {APP_DB}"))
        .await
        .unwrap();
    pg_connect(&cfg)
        .await
        .simple_query("SELECT 1")
        .await
        .unwrap();
    // The backend verb under its own name.
    let e = console
        .simple_query("DISABLE BACKEND 127.0.0.1:1")
        .await
        .unwrap_err();
    assert!(format!("{e:?}").contains("no backend"), "{e:?}");
}
