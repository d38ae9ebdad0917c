//! Transactions left open when the primary goes: they go on on the new
//! primary (a changed one fails), a replay waits for the primary to come
//! back then gives up, and a switchover moves a transaction left open.

use std::time::{Duration, Instant};

use fulcrum_suite::{console_connect, pg_connect, replays, serial, with_console};
use fulcrum_testkit::{FulcrumProcess, PgCluster, APP_DB};
use tokio_postgres::{Client, SimpleQueryMessage};

use super::helpers::{config, config_with, promoted, synchronous_cluster};

/// The first column of the first row of a simple query.
async fn first(client: &Client, sql: &str) -> Result<String, tokio_postgres::Error> {
    let msgs = client.simple_query(sql).await?;
    Ok(msgs
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_transactions_go_on_on_the_new_primary_and_a_changed_one_fails() {
    let _serial = serial().await;
    let c = synchronous_cluster(2);
    c.primary()
        .sql_db(
            APP_DB,
            "CREATE TABLE items (id int PRIMARY KEY, note text); \
             INSERT INTO items VALUES (1, 'one'), (2, 'two')",
        )
        .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    let metrics_port = fulcrum_testkit::free_port();
    let (cfg, toml) = config(&c, metrics_port);
    let p = FulcrumProcess::start(&toml).unwrap();

    // A: idle in its transaction when the primary dies.
    let a = pg_connect(&cfg).await;
    a.batch_execute("BEGIN; INSERT INTO items VALUES (10, 'ten')")
        .await
        .unwrap();
    assert_eq!(
        first(&a, "SELECT note FROM items WHERE id = 1")
            .await
            .unwrap(),
        "one"
    );
    // B: a statement in flight when the primary dies.
    let b = pg_connect(&cfg).await;
    b.batch_execute("BEGIN").await.unwrap();
    b.batch_execute("INSERT INTO items VALUES (20, 'twenty')")
        .await
        .unwrap();
    // C: prepared statements (extended protocol, named statements).
    let mut c_client = pg_connect(&cfg).await;
    let c_txn = c_client.transaction().await.unwrap();
    let insert = c_txn
        .prepare("INSERT INTO items VALUES ($1, $2)")
        .await
        .unwrap();
    c_txn.execute(&insert, &[&30i32, &"thirty"]).await.unwrap();
    let read = c_txn
        .prepare("SELECT note FROM items WHERE id = $1")
        .await
        .unwrap();
    let row = c_txn.query_one(&read, &[&1i32]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "one");
    // D: read row 2, which another client then changes (committed and on
    // the synchronous standby before the kill): its replay must differ.
    let d = pg_connect(&cfg).await;
    d.batch_execute("BEGIN; INSERT INTO items VALUES (40, 'forty')")
        .await
        .unwrap();
    assert_eq!(
        first(&d, "SELECT note FROM items WHERE id = 2")
            .await
            .unwrap(),
        "two"
    );
    let e = pg_connect(&cfg).await;
    e.batch_execute("UPDATE items SET note = 'dos' WHERE id = 2")
        .await
        .unwrap();
    // F: more than transaction_replay_max_size (4kB) sent in its
    // transaction: not kept, so it fails as without replay.
    let f = pg_connect(&cfg).await;
    f.batch_execute("BEGIN; INSERT INTO items VALUES (50, 'fifty')")
        .await
        .unwrap();
    let long = format!("SELECT length('{}')", "x".repeat(5000));
    assert_eq!(first(&f, &long).await.unwrap(), "5000");

    let b_sleep = tokio::spawn(async move {
        let r = b.batch_execute("SELECT pg_sleep(1.5)").await;
        (b, r)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    let killed = Instant::now();

    // B's statement was answered by the new primary.
    let (b, slept) = b_sleep.await.unwrap();
    slept.expect("B's statement in flight at the kill was replayed");
    eprintln!("B answered {:?} after the kill", killed.elapsed());
    b.batch_execute("INSERT INTO items VALUES (21, 'twenty-one'); COMMIT")
        .await
        .expect("B commits");
    a.batch_execute("INSERT INTO items VALUES (11, 'eleven')")
        .await
        .expect("A goes on");
    assert_eq!(
        first(&a, "SELECT note FROM items WHERE id = 10")
            .await
            .unwrap(),
        "ten",
        "A's row from before the kill is in its transaction"
    );
    a.batch_execute("COMMIT").await.expect("A commits");
    c_txn
        .execute(&insert, &[&31i32, &"thirty-one"])
        .await
        .unwrap();
    c_txn.commit().await.expect("C commits");

    // D's replay saw 'dos' where D had seen 'two': D gets the error it
    // would get without replay, and its transaction is gone.
    let err = d
        .batch_execute("INSERT INTO items VALUES (41, 'forty-one')")
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("08006"), "{err:?}");
    assert!(
        err.to_string().contains("replay") || format!("{err:?}").contains("replay"),
        "the error says the replay failed: {err:?}"
    );
    d.batch_execute("ROLLBACK").await.unwrap();
    let err = f
        .batch_execute("INSERT INTO items VALUES (51, 'fifty-one')")
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("08006"), "{err:?}");
    f.batch_execute("ROLLBACK").await.unwrap();
    d.batch_execute("INSERT INTO items VALUES (42, 'forty-two')")
        .await
        .expect("D's next transaction runs on the new primary");

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
    // Replayed statements are not counted again: `SELECT note FROM items
    // WHERE id = <literal>` ran three times (A's id = 1 and id = 10, D's
    // id = 2), though A's and D's first ones were sent again by replays.
    let text = fulcrum_suite::scrape(metrics_port);
    let calls = |query: &str| {
        fulcrum_suite::family_sum(&text, "fulcrum_query_digest_calls", &[("query", query)])
    };
    assert_eq!(calls("select note from items where id = ?"), 3.0, "{text}");
    // A, D and F began their transactions once each; C's prepared insert
    // ran twice (30 before the kill, 31 after).
    assert_eq!(
        calls("begin; insert into items values (?, ?)"),
        3.0,
        "{text}"
    );
    assert_eq!(calls("insert into items values ($1, $2)"), 2.0, "{text}");
}

/// Without a failover (`failover = "none"`), a replay waits for the same
/// primary: restarted within `transaction_replay_timeout`, the transaction
/// goes on there; not back in time, the client gets the error it gets
/// without replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_waits_for_the_primary_to_come_back_then_gives_up() {
    let _serial = serial().await;
    // The harness runs with synchronous_commit = off (speed); this test
    // checks that a commit acknowledged just before an immediate stop is
    // there after the restart, which needs the commit written first.
    let c = tokio::task::block_in_place(|| {
        PgCluster::builder()
            .replicas(0)
            .setting("synchronous_commit", "on")
            .start()
    })
    .expect("cluster");
    assert_eq!(
        c.primary().sql("SHOW synchronous_commit").unwrap().trim(),
        "on"
    );
    c.primary()
        .sql_db(APP_DB, "CREATE TABLE items (id int PRIMARY KEY)")
        .unwrap();
    let metrics_port = fulcrum_testkit::free_port();
    let (cfg, toml) = config_with(
        &c,
        metrics_port,
        &["failover = \"none\"", "transaction_replay_timeout = \"4s\""],
    );
    let _p = FulcrumProcess::start(&toml).unwrap();

    let a = pg_connect(&cfg).await;
    a.batch_execute("BEGIN; INSERT INTO items VALUES (1)")
        .await
        .unwrap();
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    let stopped = Instant::now();
    tokio::task::block_in_place(|| {
        std::thread::sleep(Duration::from_millis(500));
        c.primary().start()
    })
    .unwrap();
    a.batch_execute("INSERT INTO items VALUES (2); COMMIT")
        .await
        .expect("the transaction goes on on the restarted primary");
    eprintln!("replayed {:?} after the stop", stopped.elapsed());

    let b = pg_connect(&cfg).await;
    b.batch_execute("BEGIN; INSERT INTO items VALUES (3)")
        .await
        .unwrap();
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    let stopped = Instant::now();
    let err = b
        .batch_execute("INSERT INTO items VALUES (4)")
        .await
        .unwrap_err();
    let waited = stopped.elapsed();
    assert_eq!(err.code().map(|c| c.code()), Some("08006"), "{err:?}");
    assert!(
        waited >= Duration::from_secs(3) && waited < Duration::from_secs(15),
        "gave up after {waited:?}"
    );
    assert!(replays(metrics_port, "failed") >= 1);
    tokio::task::block_in_place(|| c.primary().start()).unwrap();
    let rows = c
        .primary()
        .sql_db(APP_DB, "SELECT id FROM items ORDER BY id")
        .unwrap();
    assert_eq!(rows.split_whitespace().collect::<Vec<_>>(), ["1", "2"]);
}

/// SWITCHOVER with a client idle in its transaction on the primary: without
/// replay the switchover waits for it (and gives up after 10 s); with it,
/// the session is ended on the old primary after a second and its
/// transaction replayed on the new one once the held work resumes. The
/// client sees no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_moves_a_transaction_left_open() {
    let _serial = serial().await;
    let c =
        tokio::task::block_in_place(|| PgCluster::builder().replicas(1).start()).expect("cluster");
    c.primary()
        .sql_db(APP_DB, "CREATE TABLE items (id int PRIMARY KEY)")
        .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    let (metrics_port, admin_port) = (fulcrum_testkit::free_port(), fulcrum_testkit::free_port());
    let (cfg, toml) = config_with(&c, metrics_port, &[]);
    let toml = with_console(&toml, admin_port);
    let p = FulcrumProcess::start(&toml).unwrap();

    let a = pg_connect(&cfg).await;
    a.batch_execute("BEGIN; INSERT INTO items VALUES (1)")
        .await
        .unwrap();
    let admin = console_connect(admin_port).await;
    let started = Instant::now();
    admin
        .simple_query(&format!("SWITCHOVER main TO {}", c.replicas()[0].addr()))
        .await
        .unwrap_or_else(|e| panic!("switchover: {e:?}\n{}", p.log_contents()));
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "the switchover took {took:?}"
    );
    a.batch_execute("INSERT INTO items VALUES (2); COMMIT")
        .await
        .expect("the transaction goes on on the new primary");
    let new_primary = &c.replicas()[0];
    assert!(!new_primary.is_in_recovery().unwrap());
    let rows = new_primary
        .sql_db(APP_DB, "SELECT id FROM items ORDER BY id")
        .unwrap();
    assert_eq!(rows.split_whitespace().collect::<Vec<_>>(), ["1", "2"]);
    assert!(replays(metrics_port, "replayed") >= 1);
    assert!(p
        .log_contents()
        .contains("ended sessions idle in a transaction on the old primary"));
}
