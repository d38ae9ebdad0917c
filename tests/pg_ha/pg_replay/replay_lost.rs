//! A replay whose own server is lost with a statement that may commit in
//! flight (`may_commit`: its text says "commit"): the outcome is unknown,
//! so the client is told 08007 (transaction_resolution_unknown), at once
//! and once (on its next statement when it was idle in its transaction at
//! the first loss; on its statement in flight then, which the replay sent
//! again, otherwise), and its session goes on as a lost transaction's
//! (25P02 until ROLLBACK ends it; the next transaction runs when the
//! server is back). One node, `failover = "none"`: the server is stopped
//! and restarted, then stopped again while the replayed statement runs.

use std::time::{Duration, Instant};

use fulcrum_suite::{pg_connect, replays, serial};
use fulcrum_testkit::{FulcrumProcess, PgCluster, PgNode, APP_DB};

use super::helpers::config_with;

/// Waits until `node` runs a statement whose text is `like` (a LIKE
/// pattern; a backend other than the asking one, active on it).
fn wait_active(node: &PgNode, like: &str, p: &FulcrumProcess) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let sql = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
         AND query LIKE '{}' AND pid <> pg_backend_pid()",
        like.replace('\'', "''")
    );
    loop {
        if node.sql(&sql).unwrap_or_default().trim() == "1" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{like} never ran\n{}",
            p.log_contents()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_lost_with_a_statement_that_may_commit_in_flight_is_answered_08007() {
    let _serial = serial().await;
    let c =
        tokio::task::block_in_place(|| PgCluster::builder().replicas(0).start()).expect("cluster");
    c.primary()
        .sql_db(APP_DB, "CREATE TABLE items (id int PRIMARY KEY)")
        .unwrap();
    let metrics_port = fulcrum_testkit::free_port();
    let (cfg, toml) = config_with(
        &c,
        metrics_port,
        &[
            "failover = \"none\"",
            "transaction_replay_timeout = \"20s\"",
        ],
    );
    let p = FulcrumProcess::start(&toml).unwrap();

    let a = pg_connect(&cfg).await;
    a.batch_execute("BEGIN; INSERT INTO items VALUES (1)")
        .await
        .unwrap();
    // Answered before the loss; its text has "commit" in it, so when it
    // runs again in the replay it may commit as far as Fulcrum knows.
    a.batch_execute("SELECT 'commit' FROM pg_sleep(3)")
        .await
        .unwrap();
    tokio::task::block_in_place(|| {
        c.primary().stop_immediate()?;
        std::thread::sleep(Duration::from_millis(500));
        c.primary().start()
    })
    .unwrap();
    // The next statement: it waits for (or starts) the replay.
    let next = tokio::spawn(async move {
        let r = a.batch_execute("INSERT INTO items VALUES (2)").await;
        (a, r)
    });
    tokio::task::block_in_place(|| {
        wait_active(c.primary(), "SELECT 'commit'%", &p);
        c.primary().stop_immediate()
    })
    .unwrap();
    let a = told_unknown_then_goes_on(next, Instant::now(), &c, &p, 3, &["3"]).await;

    // Again, with the client's next statement in flight at the first loss
    // (so it is replayed too): it is the one answered 08007, once.
    a.batch_execute("BEGIN; INSERT INTO items VALUES (4)")
        .await
        .unwrap();
    a.batch_execute("SELECT 'commit' FROM pg_sleep(3)")
        .await
        .unwrap();
    let in_flight = tokio::spawn(async move {
        let r = a.batch_execute("SELECT pg_sleep(2)").await;
        (a, r)
    });
    tokio::task::block_in_place(|| {
        wait_active(c.primary(), "SELECT pg_sleep(2)", &p);
        c.primary().stop_immediate()?;
        std::thread::sleep(Duration::from_millis(500));
        c.primary().start()?;
        wait_active(c.primary(), "SELECT 'commit'%", &p);
        c.primary().stop_immediate()
    })
    .unwrap();
    told_unknown_then_goes_on(in_flight, Instant::now(), &c, &p, 5, &["3", "5"]).await;

    let log = p.log_contents();
    let lost = "its server was lost too, with a statement that may commit in flight";
    assert_eq!(log.matches(lost).count(), 2, "{log}");
    assert!(replays(metrics_port, "failed") >= 2);
}

/// The statement `pending` sent is answered ERROR 08007 within 10 s of
/// `stopped` (the replay's server stopped); then the session is a lost
/// transaction's (25P02 until ROLLBACK ends it), and once the server is
/// back the next transaction (`INSERT ... VALUES (next)`) runs and the
/// table holds `rows`: nothing of the lost transaction committed. The
/// client is given back, its session going on.
async fn told_unknown_then_goes_on(
    pending: tokio::task::JoinHandle<(tokio_postgres::Client, Result<(), tokio_postgres::Error>)>,
    stopped: Instant,
    c: &PgCluster,
    p: &FulcrumProcess,
    next: i32,
    rows: &[&str],
) -> tokio_postgres::Client {
    let (a, r) = tokio::time::timeout(Duration::from_secs(40), pending)
        .await
        .unwrap_or_else(|_| panic!("the statement was never answered\n{}", p.log_contents()))
        .unwrap();
    let waited = stopped.elapsed();
    let err = r.expect_err("the replay was lost: the statement cannot succeed");
    assert_eq!(
        err.code().map(|c| c.code()),
        Some("08007"),
        "{err:?}\n{}",
        p.log_contents()
    );
    assert_eq!(
        err.as_db_error().map(|e| e.severity()),
        Some("ERROR"),
        "{err:?}"
    );
    assert!(
        waited < Duration::from_secs(10),
        "answered {waited:?} after the replay's server was stopped, not at once"
    );
    // Told once, then aborted until the client ends it.
    let err = a.batch_execute("SELECT 1").await.unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("25P02"), "{err:?}");
    a.batch_execute("ROLLBACK")
        .await
        .expect("ROLLBACK ends the lost transaction");
    tokio::task::block_in_place(|| c.primary().start()).unwrap();
    a.batch_execute(&format!("INSERT INTO items VALUES ({next})"))
        .await
        .unwrap_or_else(|e| panic!("the next transaction runs: {e:?}\n{}", p.log_contents()));
    let found = c
        .primary()
        .sql_db(APP_DB, "SELECT id FROM items ORDER BY id")
        .unwrap();
    assert_eq!(
        found.split_whitespace().collect::<Vec<_>>(),
        rows,
        "nothing of the lost transaction committed"
    );
    a
}
