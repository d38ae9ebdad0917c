//! Transaction replay (`transaction_replay = true`) on real MariaDB GTID
//! clusters (semi-synchronous, so acknowledged commits are on a replica)
//! whose primary is killed: open transactions (idle, with a statement in
//! flight, with prepared statements) go on on the promoted replica with no
//! error and every row; one whose rows another client changed meanwhile is
//! caught by the checksum and fails as without replay; sysbench
//! oltp_read_write through the kill sees errors only where a COMMIT was in
//! flight, and its tables keep their row counts.

use std::process::Command;
use std::time::{Duration, Instant};

use fulcrum_suite::{
    console_connect, maria_connect, maria_toml, replays, serial, with_console, with_metrics,
};
use fulcrum_testkit::{
    free_port, FulcrumProcess, MariaCluster, MariaNode, APP_DB, APP_PASSWORD, APP_USER,
};
use mysql_async::prelude::Queryable;
use mysql_async::TxOpts;

fn cluster() -> MariaCluster {
    MariaCluster::builder()
        .replicas(2)
        .setting("rpl-semi-sync-master-enabled", "1")
        .setting("rpl-semi-sync-slave-enabled", "1")
        .setting("rpl-semi-sync-master-wait-point", "AFTER_SYNC")
        .start()
        .expect("cluster")
}

/// One MariaDB node (no replica to fail over to) with an empty `items`.
pub(super) fn one_node_with_items() -> MariaCluster {
    let c = tokio::task::block_in_place(|| MariaCluster::builder().replicas(0).start())
        .expect("cluster");
    c.primary()
        .sql_db(APP_DB, "CREATE TABLE items (id INT PRIMARY KEY)")
        .unwrap();
    c
}

fn config(c: &MariaCluster, port: u16, metrics_port: u16) -> String {
    let toml = maria_toml(
        c,
        port,
        "pool_timeout = \"20s\"\nhealth_interval = \"300ms\"\nfailover = \"promote\"\n\
         failover_timeout = \"1s\"\ntransaction_replay = true\n\
         transaction_replay_timeout = \"20s\"\ntransaction_replay_debug = true",
    );
    with_metrics(&toml, metrics_port)
}

/// The replica promoted after the kill (waits for it).
fn promoted(c: &MariaCluster) -> &MariaNode {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let up: Vec<&MariaNode> = c
            .replicas()
            .iter()
            .filter(|r| r.read_only().is_ok_and(|ro| !ro))
            .collect();
        if up.len() == 1 {
            return up[0];
        }
        assert!(Instant::now() < deadline, "no replica was promoted");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_transactions_go_on_on_the_new_primary_and_a_changed_one_fails() {
    let _serial = serial().await;
    let c = tokio::task::block_in_place(cluster);
    c.primary()
        .sql_db(
            APP_DB,
            "CREATE TABLE items (id INT PRIMARY KEY, note VARCHAR(20)); \
             INSERT INTO items VALUES (1, 'one'), (2, 'two')",
        )
        .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    let (port, metrics_port) = (free_port(), free_port());
    let p = FulcrumProcess::start(&config(&c, port, metrics_port)).unwrap();

    // A: idle in its transaction when the primary dies.
    let mut a = maria_connect(port).await;
    a.query_drop("BEGIN").await.unwrap();
    a.query_drop("INSERT INTO items VALUES (10, 'ten')")
        .await
        .unwrap();
    let note: Option<String> = a
        .query_first("SELECT note FROM items WHERE id = 1")
        .await
        .unwrap();
    assert_eq!(note.as_deref(), Some("one"));
    // B: a statement in flight when the primary dies.
    let mut b = maria_connect(port).await;
    b.query_drop("START TRANSACTION").await.unwrap();
    b.query_drop("INSERT INTO items VALUES (20, 'twenty')")
        .await
        .unwrap();
    // C: server-side prepared statements, prepared before its transaction.
    let mut c_conn = maria_connect(port).await;
    let insert = c_conn
        .prep("INSERT INTO items VALUES (?, ?)")
        .await
        .unwrap();
    let read = c_conn
        .prep("SELECT note FROM items WHERE id = ?")
        .await
        .unwrap();
    let mut c_txn = c_conn.start_transaction(TxOpts::default()).await.unwrap();
    c_txn.exec_drop(&insert, (30, "thirty")).await.unwrap();
    let note: Option<String> = c_txn.exec_first(&read, (1,)).await.unwrap();
    assert_eq!(note.as_deref(), Some("one"));
    // D: read row 2, which another client then changes (acknowledged, so on
    // a semi-synchronous replica, before the kill): its replay must differ.
    let mut d = maria_connect(port).await;
    d.query_drop("BEGIN").await.unwrap();
    d.query_drop("INSERT INTO items VALUES (40, 'forty')")
        .await
        .unwrap();
    let note: Option<String> = d
        .query_first("SELECT note FROM items WHERE id = 2")
        .await
        .unwrap();
    assert_eq!(note.as_deref(), Some("two"));
    let mut e = maria_connect(port).await;
    e.query_drop("UPDATE items SET note = 'dos' WHERE id = 2")
        .await
        .unwrap();

    let b_sleep = tokio::spawn(async move {
        let r: mysql_async::Result<Option<i64>> = b.query_first("SELECT SLEEP(1.5)").await;
        (b, r)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    let killed = Instant::now();

    let (mut b, slept) = b_sleep.await.unwrap();
    assert_eq!(
        slept.expect("B's statement in flight at the kill was replayed"),
        Some(0)
    );
    eprintln!("B answered {:?} after the kill", killed.elapsed());
    b.query_drop("INSERT INTO items VALUES (21, 'twenty-one')")
        .await
        .unwrap();
    b.query_drop("COMMIT").await.expect("B commits");
    a.query_drop("INSERT INTO items VALUES (11, 'eleven')")
        .await
        .expect("A goes on");
    let note: Option<String> = a
        .query_first("SELECT note FROM items WHERE id = 10")
        .await
        .unwrap();
    assert_eq!(note.as_deref(), Some("ten"), "A's row from before the kill");
    a.query_drop("COMMIT").await.expect("A commits");
    c_txn.exec_drop(&insert, (31, "thirty-one")).await.unwrap();
    c_txn.commit().await.expect("C commits");

    // D's replay saw 'dos' where D had seen 'two': D gets the error it
    // gets without replay (ER_CONNECTION_KILLED; the session ends).
    let err = d
        .query_drop("INSERT INTO items VALUES (41, 'forty-one')")
        .await
        .unwrap_err();
    match err {
        mysql_async::Error::Server(e) => {
            assert_eq!(e.code, 1927, "{e:?}");
            assert!(e.message.contains("transaction replay failed"), "{e:?}");
        }
        other => panic!("expected ERR 1927, got {other:?}"),
    }
    let mut d = maria_connect(port).await;
    d.query_drop("INSERT INTO items VALUES (42, 'forty-two')")
        .await
        .expect("a new session writes to the new primary");

    let new_primary = tokio::task::block_in_place(|| promoted(&c));
    let rows = new_primary
        .sql_db(APP_DB, "SELECT id FROM items ORDER BY id")
        .unwrap();
    let ids: Vec<i32> = rows.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert_eq!(
        ids,
        vec![1, 2, 10, 11, 20, 21, 30, 31, 42],
        "rows on the new primary"
    );
    assert!(replays(metrics_port, "replayed") >= 3);
    assert!(replays(metrics_port, "failed") >= 1);
    assert!(p.log_contents().contains("transaction replay failed"));
}

/// sysbench oltp_read_write (4 threads, prepared statements: sysbench's
/// default `--db-ps-mode=auto`) through a primary kill. sysbench stops on
/// an error it is not told to ignore: its own deadlocks, and 1927 (a COMMIT
/// in flight at the kill: outcome unknown, 08007; the session stays) are
/// ignored here, and Fulcrum's log shows that every 1927 was a COMMIT in
/// flight. (sysbench 1.0.20 crashes when it reconnects with prepared
/// statements: the test also shows that no session ended.) Rows are drawn
/// uniformly: with sysbench's default skewed draw (`--rand-type=special`,
/// most accesses on a few hot rows) the transactions in flight at the kill
/// often read rows another of them wrote, and the replays, committed in
/// another order, read them changed: a true difference, which fails the
/// replay (captured with transaction_replay_debug: a point select's `c`
/// came back with another client's new random string; docs/failover.md).
/// Each transaction deletes a row and inserts it again, so every table
/// still has all its rows: nothing half-replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sysbench_oltp_read_write_through_a_primary_kill() {
    let _serial = serial().await;
    let c = tokio::task::block_in_place(cluster);
    let (port, metrics_port) = (free_port(), free_port());
    let p = FulcrumProcess::start(&config(&c, port, metrics_port)).unwrap();
    let base = [
        "--db-driver=mysql".to_string(),
        "--mysql-host=127.0.0.1".into(),
        format!("--mysql-port={port}"),
        format!("--mysql-user={APP_USER}"),
        format!("--mysql-password={APP_PASSWORD}"),
        format!("--mysql-db={APP_DB}"),
        "--tables=2".into(),
        "--table-size=100000".into(),
    ];
    let prepare = tokio::task::block_in_place(|| {
        Command::new(fulcrum_testkit::tool("/usr/bin/sysbench", "sysbench"))
            .args(&base)
            .args(["oltp_read_write", "prepare"])
            .output()
            .expect("sysbench runs (installed by .ci/run)")
    });
    assert!(prepare.status.success(), "{prepare:?}");
    c.wait_replicas_caught_up(Duration::from_secs(60)).unwrap();
    let run = std::thread::spawn(move || {
        Command::new(fulcrum_testkit::tool("/usr/bin/sysbench", "sysbench"))
            .args(&base)
            .args([
                "oltp_read_write",
                "run",
                "--threads=4",
                "--time=10",
                // FULCRUM_SYSBENCH_PS_MODE: the loop tool (tools/replay-loop)
                // may run it with `disable` (the text protocol) as well.
                &format!(
                    "--db-ps-mode={}",
                    std::env::var("FULCRUM_SYSBENCH_PS_MODE").unwrap_or_else(|_| "auto".into())
                ),
                "--rand-type=uniform",
                // Range reads of 100 rows would often meet a row another
                // thread changed before the kill: a true mismatch, which
                // fails the transaction (the other test shows it).
                "--range_selects=off",
                "--mysql-ignore-errors=1213,1020,1205,1927,2013,2006",
            ])
            .output()
            .unwrap()
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    let out = tokio::task::block_in_place(|| run.join()).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let log = p.log_contents();
    // sysbench 1.0.20 has been seen to crash (SIGSEGV) here once in a full
    // suite run, not alone: what Fulcrum told the clients is printed with
    // the failure so the cause can be found (issue 30).
    let told: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("lost") || l.contains("replay") || l.contains("sqlstate"))
        .collect();
    assert!(
        out.status.success(),
        "sysbench failed: {:?}; Fulcrum's log on losses and replays:\n{}",
        out.status,
        told.join("\n")
    );
    assert!(
        !log.contains("sqlstate=70100"),
        "a transaction that had not sent COMMIT failed:\n{log}"
    );
    assert!(
        replays(metrics_port, "replayed") >= 1,
        "nothing was replayed"
    );
    let new_primary = tokio::task::block_in_place(|| promoted(&c));
    for table in ["sbtest1", "sbtest2"] {
        let n = new_primary
            .sql_db(APP_DB, &format!("SELECT count(*) FROM {table}"))
            .unwrap();
        assert_eq!(n.trim(), "100000", "{table} on the new primary");
    }
    let transactions = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("transactions:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse::<u64>().ok())
        .expect("sysbench's summary");
    assert!(transactions > 0);
}

/// Without a failover (`failover = "none"`), a replay waits for the same
/// primary: restarted within `transaction_replay_timeout`, the transaction
/// goes on there; not back in time, the client gets the error it gets
/// without replay (ERR 1927, the session ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_waits_for_the_primary_to_come_back_then_gives_up() {
    let _serial = serial().await;
    let c = one_node_with_items();
    let port = free_port();
    let toml = maria_toml(
        &c,
        port,
        "pool_timeout = \"20s\"\nhealth_interval = \"300ms\"\nfailover = \"none\"\n\
         transaction_replay = true\ntransaction_replay_timeout = \"6s\"",
    );
    let _p = FulcrumProcess::start(&toml).unwrap();

    let mut a = maria_connect(port).await;
    a.query_drop("BEGIN").await.unwrap();
    a.query_drop("INSERT INTO items VALUES (1)").await.unwrap();
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    tokio::task::block_in_place(|| c.primary().start()).unwrap();
    a.query_drop("INSERT INTO items VALUES (2)")
        .await
        .expect("the transaction goes on on the restarted primary");
    a.query_drop("COMMIT").await.unwrap();

    let mut b = maria_connect(port).await;
    b.query_drop("BEGIN").await.unwrap();
    b.query_drop("INSERT INTO items VALUES (3)").await.unwrap();
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    let stopped = Instant::now();
    let err = b
        .query_drop("INSERT INTO items VALUES (4)")
        .await
        .unwrap_err();
    let waited = stopped.elapsed();
    match err {
        mysql_async::Error::Server(e) => {
            assert_eq!(e.code, 1927, "{e:?}");
            assert!(e.message.contains("transaction replay failed"), "{e:?}");
        }
        other => panic!("expected ERR 1927, got {other:?}"),
    }
    assert!(
        waited >= Duration::from_secs(5) && waited < Duration::from_secs(20),
        "gave up after {waited:?}"
    );
    tokio::task::block_in_place(|| c.primary().start()).unwrap();
    let rows = c
        .primary()
        .sql_db(APP_DB, "SELECT id FROM items ORDER BY id")
        .unwrap();
    assert_eq!(rows.split_whitespace().collect::<Vec<_>>(), ["1", "2"]);
}

/// SWITCHOVER with a client idle in its transaction on the primary: the
/// session is killed on the old primary after a second (its InnoDB
/// transaction is open, its thread sleeping), the switchover goes on, and
/// the client's next statement replays its transaction on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_moves_a_transaction_left_open() {
    let _serial = serial().await;
    let c = tokio::task::block_in_place(|| MariaCluster::builder().replicas(1).start())
        .expect("cluster");
    c.primary()
        .sql_db(APP_DB, "CREATE TABLE items (id INT PRIMARY KEY)")
        .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    let (port, admin_port) = (free_port(), free_port());
    let toml = with_console(
        &maria_toml(
            &c,
            port,
            "pool_timeout = \"20s\"\nhealth_interval = \"300ms\"\ntransaction_replay = true",
        ),
        admin_port,
    );
    let p = FulcrumProcess::start(&toml).unwrap();

    let mut a = maria_connect(port).await;
    a.query_drop("BEGIN").await.unwrap();
    a.query_drop("INSERT INTO items VALUES (1)").await.unwrap();
    let admin = console_connect(admin_port).await;
    let target = &c.replicas()[0];
    let started = Instant::now();
    admin
        .simple_query(&format!("SWITCHOVER shop TO {}", target.addr()))
        .await
        .unwrap_or_else(|e| panic!("switchover: {e:?}\n{}", p.log_contents()));
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "the switchover took {took:?}"
    );
    a.query_drop("INSERT INTO items VALUES (2)")
        .await
        .expect("the transaction goes on on the new primary");
    a.query_drop("COMMIT").await.unwrap();
    let rows = target
        .sql_db(APP_DB, "SELECT id FROM items ORDER BY id")
        .unwrap();
    assert_eq!(rows.split_whitespace().collect::<Vec<_>>(), ["1", "2"]);
    assert!(p
        .log_contents()
        .contains("ended sessions idle in a transaction on the old primary"));
}
