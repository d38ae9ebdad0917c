//! Transaction replay (`transaction_replay = true`) on real PostgreSQL
//! clusters whose primary is killed: open transactions (idle, with a
//! statement in flight, through prepared statements) go on on the promoted
//! replica with no error and every row they wrote; one whose rows another
//! client changed meanwhile is caught by the checksum and fails as without
//! replay; a COMMIT in flight at the kill is resolved on the new primary
//! (confirmed when it committed, replayed when it did not); pgbench TPC-B
//! through ten kills gets no error and loses nothing acknowledged.
//!
//! Each test kills its own cluster's primary; they run one at a time (a
//! lock, shared with the binary's other tests that kill servers:
//! `fulcrum_suite::serial`) so failover timings are not distorted on a
//! small machine.

use std::time::{Duration, Instant};

use fulcrum_suite::{
    console_connect, pg_connect, replays, serial, with_console, with_metrics, PgProxyConfig,
};
use fulcrum_testkit::{FulcrumProcess, PgCluster, PgNode, APP_DB, APP_PASSWORD, APP_USER};
use tokio_postgres::{Client, SimpleQueryMessage};

/// Fulcrum in front of `c` with replay on and automatic promotion.
fn config(c: &PgCluster, metrics_port: u16) -> (PgProxyConfig, String) {
    config_with(
        c,
        metrics_port,
        &[
            "failover = \"promote\"",
            "failover_timeout = \"1s\"",
            "transaction_replay_timeout = \"20s\"",
            "transaction_replay_max_size = \"4kB\"",
            "transaction_replay_debug = true",
        ],
    )
}

fn config_with(c: &PgCluster, metrics_port: u16, keys: &[&str]) -> (PgProxyConfig, String) {
    let mut cfg = PgProxyConfig::new(&c.primary().addr()).client_auth("md5");
    for r in c.replicas() {
        cfg = cfg.replica(&r.addr());
    }
    for e in [
        "health_user = \"postgres\"",
        "health_password = \"\"",
        "pool_timeout = \"20s\"",
        "health_interval = \"300ms\"",
        "transaction_replay = true",
        "digest_metrics_top = 100",
    ]
    .iter()
    .chain(keys)
    {
        cfg = cfg.extra(e);
    }
    let toml = with_metrics(&cfg.to_toml(), metrics_port);
    (cfg, toml)
}

/// A primary and `replicas` streaming replicas, the first synchronous (so
/// a commit the client saw is on the replica that gets promoted).
fn synchronous_cluster(replicas: usize) -> PgCluster {
    tokio::task::block_in_place(|| {
        PgCluster::builder()
            .replicas(replicas)
            .synchronous_standby(true)
            .start()
    })
    .expect("cluster")
}

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

/// The COMMIT spawned before the primary's kill: answered in time, and a
/// success.
async fn commit_succeeds<T, E: std::fmt::Debug>(
    in_flight: tokio::task::JoinHandle<Result<T, E>>,
    p: &FulcrumProcess,
) {
    let outcome = tokio::time::timeout(Duration::from_secs(30), in_flight)
        .await
        .expect("the COMMIT is answered")
        .unwrap();
    if let Err(e) = outcome {
        panic!("the COMMIT failed: {e:?}\n{}", p.log_contents());
    }
}

/// The one value `sql` reads on the replica promoted after the kill.
fn rows_on_new_primary(c: &PgCluster, sql: &str) -> String {
    let new_primary = tokio::task::block_in_place(|| promoted(c));
    new_primary.sql_db(APP_DB, sql).unwrap().trim().to_owned()
}

/// The replica promoted after the kill (waits for it).
fn promoted(c: &PgCluster) -> &PgNode {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let up: Vec<&PgNode> = c
            .replicas()
            .iter()
            .filter(|r| r.is_in_recovery().is_ok_and(|rec| !rec))
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

/// pgbench TPC-B (4 clients, prepared statements) through ten primary
/// kills, the killed primary rebuilt each time as the new one's
/// synchronous standby: no client gets an error (a COMMIT in flight at a
/// kill is resolved on the new primary: confirmed, or replayed there), and
/// every transaction pgbench counts is on the last primary exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_tpcb_through_ten_primary_kills_gets_no_error_and_loses_nothing() {
    const KILLS: usize = 10;
    let _serial = serial().await;
    let c = synchronous_cluster(1);
    let metrics_port = fulcrum_testkit::free_port();
    let (cfg, toml) = config(&c, metrics_port);
    let p = FulcrumProcess::start(&toml).unwrap();
    let via = cfg.listen.clone();
    let port = via.rsplit_once(':').unwrap().1.to_owned();
    tokio::task::block_in_place(|| {
        fulcrum_testkit::pgbench_init(&via, APP_USER, APP_PASSWORD, APP_DB, 1)
    })
    .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    let nodes = [c.primary(), &c.replicas()[0]];
    let mut primary = 0;
    let mut processed = 0u64;
    let mut failovers = Vec::new();
    for kill in 1..=KILLS {
        let port = port.clone();
        let bench = std::thread::spawn(move || {
            fulcrum_testkit::pgbench(
                &[
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &port,
                    "-U",
                    APP_USER,
                    "-M",
                    "prepared",
                    "-c",
                    "4",
                    "-j",
                    "2",
                    "-T",
                    "6",
                    "-n",
                    APP_DB,
                ],
                Some(APP_PASSWORD),
            )
            .unwrap()
        });
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let killed_at = Instant::now();
        let (old, new) = (nodes[primary], nodes[1 - primary]);
        tokio::task::block_in_place(|| old.stop_immediate()).unwrap();
        // The survivor is promoted by Fulcrum while pgbench runs on.
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::task::block_in_place(|| new.is_in_recovery()).unwrap_or(true) {
            assert!(Instant::now() < deadline, "kill {kill}: no promotion");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        failovers.push(killed_at.elapsed());
        let out = tokio::task::block_in_place(|| bench.join()).unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let aborted: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("aborted") || l.contains("ERROR"))
            .collect();
        let log = p.log_contents();
        let told: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("lost") || l.contains("replay") || l.contains("COMMIT"))
            .collect();
        assert!(
            aborted.is_empty(),
            "kill {kill}: a client got an error: {aborted:?}\n{stdout}\nFulcrum's log on losses and replays:\n{}",
            told.join("\n")
        );
        processed += stdout
            .lines()
            .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
            .and_then(|n| n.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("kill {kill}: pgbench's summary\n{stdout}\n{stderr}"));
        // The killed node comes back as the new primary's synchronous
        // standby for the next kill.
        let history: u64 = tokio::task::block_in_place(|| {
            new.sql_db(APP_DB, "SELECT count(*) FROM pgbench_history")
        })
        .unwrap()
        .trim()
        .parse()
        .unwrap();
        eprintln!("ROUND kill {kill}: processed so far {processed}, history {history}");
        tokio::task::block_in_place(|| {
            old.rebuild_as_replica_of(new).unwrap();
            new.sql_script(
                "postgres",
                "ALTER SYSTEM SET synchronous_standby_names = '*';\n\
                 ALTER SYSTEM SET synchronous_commit = 'on';\n\
                 SELECT pg_reload_conf();\n",
            )
            .unwrap();
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let sync = tokio::task::block_in_place(|| {
                new.sql("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")
            })
            .unwrap_or_default();
            if sync.trim() == "1" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "kill {kill}: no synchronous standby again"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        primary = 1 - primary;
    }
    let history: u64 = nodes[primary]
        .sql_db(APP_DB, "SELECT count(*) FROM pgbench_history")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let confirmed = replays(metrics_port, "commit_confirmed");
    let not_committed = replays(metrics_port, "commit_not_committed");
    let replayed = replays(metrics_port, "replayed");
    eprintln!(
        "{KILLS} kills: {processed} transactions acknowledged, {history} history rows on the last primary; \
         COMMITs in flight confirmed {confirmed}, not committed {not_committed}; {replayed} transactions replayed; \
         kill to promotion {failovers:?}"
    );
    assert_eq!(
        history, processed,
        "every acknowledged transaction, exactly once"
    );
    assert_eq!(replays(metrics_port, "commit_unknown"), 0);
    assert_eq!(replays(metrics_port, "failed"), 0);
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

/// A prepared COMMIT in flight when the primary dies, which the new
/// primary never got (it waited in a deferred trigger, before its commit
/// record): the new primary says so, and the transaction is replayed and
/// committed there; the client gets its COMMIT's success, the row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_in_flight_that_did_not_commit_is_replayed_once() {
    let _serial = serial().await;
    let c = synchronous_cluster(1);
    c.primary()
        .sql_db(
            APP_DB,
            &format!(
                "CREATE TABLE slow_commit (id int PRIMARY KEY);
                 GRANT ALL ON slow_commit TO {APP_USER};
                 CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS
                   $$ BEGIN PERFORM pg_sleep(3); RETURN NULL; END $$;
                 CREATE CONSTRAINT TRIGGER slow_at_commit AFTER INSERT ON slow_commit
                   DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow();"
            ),
        )
        .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    let metrics_port = fulcrum_testkit::free_port();
    let (cfg, toml) = config(&c, metrics_port);
    let p = FulcrumProcess::start(&toml).unwrap();
    let client = pg_connect(&cfg).await;
    let begin = client.prepare("BEGIN").await.unwrap();
    let insert = client
        .prepare("INSERT INTO slow_commit VALUES ($1)")
        .await
        .unwrap();
    let commit = client.prepare("COMMIT").await.unwrap();
    // A first transaction commits (slowly): the statements are now prepared
    // on a server, and later ones are only bound and executed.
    client.execute(&begin, &[]).await.unwrap();
    client.execute(&insert, &[&1i32]).await.unwrap();
    client.execute(&commit, &[]).await.unwrap();
    client.execute(&begin, &[]).await.unwrap();
    client.execute(&insert, &[&2i32]).await.unwrap();
    let in_flight = tokio::spawn(async move { client.execute(&commit, &[]).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    commit_succeeds(in_flight, &p).await;
    assert_eq!(replays(metrics_port, "commit_not_committed"), 1);
    assert_eq!(replays(metrics_port, "replayed"), 1);
    assert_eq!(
        rows_on_new_primary(&c, "SELECT count(*) FROM slow_commit WHERE id = 2"),
        "1",
        "the replayed transaction, once"
    );
}

/// A COMMIT in flight when the primary dies that the new primary has
/// (the standby flushed its commit record but, replay paused, had not
/// applied it, so `remote_apply` held the answer back): the new primary
/// says it committed, and the client gets its COMMIT's success with
/// nothing replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_in_flight_that_committed_is_confirmed_not_replayed() {
    let _serial = serial().await;
    let c = synchronous_cluster(1);
    c.primary()
        .sql_db(
            APP_DB,
            &format!(
                "CREATE TABLE confirmed (id int PRIMARY KEY); GRANT ALL ON confirmed TO {APP_USER}"
            ),
        )
        .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    let metrics_port = fulcrum_testkit::free_port();
    let (cfg, toml) = config(&c, metrics_port);
    let p = FulcrumProcess::start(&toml).unwrap();
    let client = pg_connect(&cfg).await;
    for sql in [
        "BEGIN",
        "SET LOCAL synchronous_commit = remote_apply",
        "INSERT INTO confirmed VALUES (7)",
    ] {
        client.simple_query(sql).await.unwrap();
    }
    tokio::task::block_in_place(|| c.replicas()[0].sql("SELECT pg_wal_replay_pause()")).unwrap();
    let in_flight = tokio::spawn(async move { client.simple_query("COMMIT").await });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        !in_flight.is_finished(),
        "the COMMIT waits for the standby to apply it"
    );
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    commit_succeeds(in_flight, &p).await;
    assert_eq!(
        replays(metrics_port, "commit_confirmed"),
        1,
        "{}",
        p.log_contents()
    );
    assert_eq!(replays(metrics_port, "replayed"), 0, "nothing replayed");
    assert_eq!(
        rows_on_new_primary(&c, "SELECT count(*) FROM confirmed WHERE id = 7"),
        "1"
    );
}
