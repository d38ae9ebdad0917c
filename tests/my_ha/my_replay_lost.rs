//! MySQL's counterpart of tests/pg_ha/pg_replay/replay_lost.rs: a replay
//! whose own server is lost with a replayed statement that may commit in
//! flight (`may_commit`: its text says "commit"). The outcome is unknown,
//! so the client's command waiting on the replay gets one ERR 1927 with
//! SQLSTATE 08007, at once; nothing of the transaction is committed; and
//! its session is what docs/failover.md promises a MySQL client: a client
//! whose `COMMIT` was waiting keeps its session (the transaction is over
//! either way and it knows it), one that believes it is still in its
//! transaction is disconnected. The proxy serves other clients meanwhile.
//! One node, `failover = "none"`: the server is killed and restarted
//! (Fulcrum lets the idle client's connection go at once, and its next
//! command replays the transaction), then killed again while the replayed
//! statement runs.

use std::time::{Duration, Instant};

use fulcrum_suite::{maria_connect, maria_toml, replays, serial, with_metrics};
use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster, MariaNode, APP_DB};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;

/// The statement answered before the first loss and replayed after it:
/// its text has "commit" in it, so while it runs again in the replay it
/// may commit as far as Fulcrum knows.
const MAY_COMMIT: &str = "SELECT 'commit', SLEEP(3)";

/// Waits until `node` runs `MAY_COMMIT` for a client (the replay).
fn wait_running(node: &MariaNode, p: &FulcrumProcess) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let sql = format!(
        "SELECT count(*) FROM information_schema.processlist \
         WHERE info = '{}' AND id <> CONNECTION_ID()",
        MAY_COMMIT.replace('\'', "''")
    );
    loop {
        if node.sql(&sql).unwrap_or_default().trim() == "1" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the replay never ran {MAY_COMMIT}\n{}",
            p.log_contents()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Opens a transaction on `conn` (`BEGIN`, a row `id`, `MAY_COMMIT`),
/// kills and restarts the server under it while it is idle, sends `next`
/// (which starts the replay), and kills the server again once the replay
/// runs `MAY_COMMIT`. Returns the connection and what `next` got, within
/// 10 s of the second kill.
async fn lose_the_replay(
    mut conn: Conn,
    c: &MariaCluster,
    p: &FulcrumProcess,
    id: i32,
    next: &'static str,
) -> (Conn, mysql_async::Result<()>) {
    conn.query_drop("BEGIN").await.unwrap();
    conn.query_drop(format!("INSERT INTO items VALUES ({id})"))
        .await
        .unwrap();
    conn.query_drop(MAY_COMMIT).await.unwrap();
    tokio::task::block_in_place(|| {
        c.primary().stop_immediate()?;
        std::thread::sleep(Duration::from_millis(500));
        c.primary().start()
    })
    .unwrap();
    let pending = tokio::spawn(async move {
        let r = conn.query_drop(next).await;
        (conn, r)
    });
    tokio::task::block_in_place(|| {
        wait_running(c.primary(), p);
        c.primary().stop_immediate()
    })
    .unwrap();
    let stopped = Instant::now();
    let answered = tokio::time::timeout(Duration::from_secs(40), pending)
        .await
        .unwrap_or_else(|_| panic!("{next} was never answered\n{}", p.log_contents()))
        .unwrap();
    let waited = stopped.elapsed();
    assert!(
        waited < Duration::from_secs(10),
        "{next} answered {waited:?} after the replay's server was killed, not at once"
    );
    answered
}

/// One ERR 1927 with SQLSTATE 08007 (outcome unknown).
fn assert_unknown(r: mysql_async::Result<()>, p: &FulcrumProcess) {
    match r {
        Err(mysql_async::Error::Server(e)) => {
            assert_eq!(e.code, 1927, "{e:?}\n{}", p.log_contents());
            assert_eq!(e.state, "08007", "{e:?}\n{}", p.log_contents());
            assert!(e.message.contains("may or may not"), "{e:?}");
        }
        other => panic!(
            "expected ERR 1927 08007, got {other:?}\n{}",
            p.log_contents()
        ),
    }
}

/// The ids in `items` on the (running) primary.
fn rows(c: &MariaCluster) -> Vec<String> {
    let rows = c
        .primary()
        .sql_db(APP_DB, "SELECT id FROM items ORDER BY id")
        .unwrap();
    rows.split_whitespace().map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_lost_with_a_statement_that_may_commit_in_flight_is_answered_08007() {
    let _serial = serial().await;
    let c = super::my_replay::one_node_with_items();
    let (port, metrics_port) = (free_port(), free_port());
    let toml = maria_toml(
        &c,
        port,
        "pool_timeout = \"20s\"\nhealth_interval = \"300ms\"\nfailover = \"none\"\n\
         transaction_replay = true\ntransaction_replay_timeout = \"20s\"",
    );
    let p = FulcrumProcess::start(&with_metrics(&toml, metrics_port)).unwrap();
    // Another client, outside any transaction: served before and after.
    let mut other = maria_connect(port).await;
    other.query_drop("SELECT 1").await.unwrap();

    // The client's COMMIT waits on the replay: it gets 08007 and keeps its
    // session (its transaction is over either way, and it knows it).
    let a = maria_connect(port).await;
    let (mut a, r) = lose_the_replay(a, &c, &p, 1, "COMMIT").await;
    assert_unknown(r, &p);
    tokio::task::block_in_place(|| c.primary().start()).unwrap();
    a.query_drop("ROLLBACK")
        .await
        .unwrap_or_else(|e| panic!("the session goes on: {e:?}\n{}", p.log_contents()));
    a.query_drop("INSERT INTO items VALUES (2)")
        .await
        .unwrap_or_else(|e| panic!("the next statement runs: {e:?}\n{}", p.log_contents()));
    let in_txn: Option<i64> = a.query_first("SELECT @@in_transaction").await.unwrap();
    assert_eq!(in_txn, Some(0), "the session is outside any transaction");
    assert_eq!(rows(&c), ["2"], "nothing of the lost transaction committed");
    other
        .query_drop("SELECT 1")
        .await
        .expect("another client is served");

    // The client's next statement (not a COMMIT) waits on the replay: it
    // gets 08007, and the session ends, since the client believes it is
    // still in its transaction (what it sent next would run outside it).
    let (mut a, r) = lose_the_replay(a, &c, &p, 3, "INSERT INTO items VALUES (4)").await;
    assert_unknown(r, &p);
    tokio::task::block_in_place(|| c.primary().start()).unwrap();
    match a.query_drop("INSERT INTO items VALUES (5)").await {
        Err(mysql_async::Error::Server(e)) => {
            panic!(
                "the session should have ended, got {e:?}\n{}",
                p.log_contents()
            )
        }
        Err(_) => {}
        Ok(()) => panic!(
            "a statement ran outside the transaction the client believes it is in\n{}",
            p.log_contents()
        ),
    }
    assert_eq!(rows(&c), ["2"], "nothing of the lost transaction committed");
    let mut b = maria_connect(port).await;
    b.query_drop("INSERT INTO items VALUES (6)")
        .await
        .expect("a new session writes");
    other
        .query_drop("SELECT 1")
        .await
        .expect("another client is served");
    assert_eq!(rows(&c), ["2", "6"]);

    let log = p.log_contents();
    // Each run ended once, with this reason (logged, and told the client).
    let lost = "why=its server was lost too, with a statement that may commit in flight";
    assert_eq!(log.matches(lost).count(), 2, "{log}");
    assert_eq!(replays(metrics_port, "failed"), 2);
}
