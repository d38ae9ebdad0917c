//! Commits across primary kills: pgbench tpcb through ten kills with no
//! error and nothing lost, and a commit in flight replayed once when it did
//! not commit, confirmed and not replayed when it did.

use std::time::{Duration, Instant};

use fulcrum_suite::{pg_connect, replays, serial};
use fulcrum_testkit::{FulcrumProcess, PgCluster, APP_DB, APP_PASSWORD, APP_USER};

use super::helpers::{config, promoted, synchronous_cluster};

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
