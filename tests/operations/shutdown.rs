//! SIGTERM under a write load: Fulcrum stops accepting, lets every
//! transaction in progress finish (its COMMIT succeeds), ends idle clients at
//! a transaction boundary with 57P01, and exits within `shutdown_timeout`;
//! every committed transaction is in the database. SIGINT stops at once.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fulcrum_suite::{maria_connect, maria_toml, pg_connect, try_pg_connect, PgProxyConfig};
use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster, PgCluster, Signal, APP_DB};
use mysql_async::prelude::Queryable;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_transactions_finish_and_loses_no_commit() {
    let c = tokio::task::block_in_place(|| PgCluster::builder().start()).expect("cluster");
    c.primary()
        .sql_db(APP_DB, "CREATE TABLE done (id bigint PRIMARY KEY)")
        .unwrap();
    let cfg = PgProxyConfig::new(&c.primary().addr()).client_auth("md5");
    let toml = cfg
        .to_toml()
        .replacen("[fulcrum]\n", "[fulcrum]\nshutdown_timeout = \"10s\"\n", 1);
    let p = FulcrumProcess::start(&toml).unwrap();

    let committed = Arc::new(Mutex::new(Vec::<(i64, Instant)>::new()));
    let mid_txn_errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4i64)
        .map(|w| {
            let (cfg, committed, errors, stop) =
                (cfg.clone(), committed.clone(), mid_txn_errors.clone(), stop.clone());
            tokio::spawn(async move {
                let Ok(client) = try_pg_connect(&cfg).await else {
                    return;
                };
                let mut id = w * 1_000_000;
                while !stop.load(Ordering::Relaxed) {
                    id += 1;
                    // BEGIN is where a draining Fulcrum may turn the client away.
                    if client.batch_execute("BEGIN").await.is_err() {
                        return;
                    }
                    let body = format!(
                        "INSERT INTO done VALUES ({id}); SELECT pg_sleep(0.2); INSERT INTO done VALUES ({})",
                        -id
                    );
                    if let Err(e) = client.batch_execute(&body).await {
                        errors.lock().unwrap().push(format!("inside a transaction: {e}"));
                        return;
                    }
                    match client.batch_execute("COMMIT").await {
                        Ok(()) => committed.lock().unwrap().push((id, Instant::now())),
                        Err(e) => {
                            errors.lock().unwrap().push(format!("at COMMIT: {e}"));
                            return;
                        }
                    }
                }
            })
        })
        .collect();
    // SIGTERM once the load is really running (a loaded machine can take a
    // while to connect the writers), in the middle of transactions.
    let deadline = Instant::now() + Duration::from_secs(30);
    while committed.lock().unwrap().len() < 4 {
        assert!(Instant::now() < deadline, "the writers never committed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    p.signal(Signal::Term).unwrap();
    let term = Instant::now();
    let status = tokio::task::block_in_place(|| p.wait_exit(Duration::from_secs(15)))
        .expect("fulcrum exits after SIGTERM");
    let exited_after = term.elapsed();
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let _ = w.await;
    }
    assert!(status.success(), "clean exit: {status:?}");
    let errors = mid_txn_errors.lock().unwrap().clone();
    assert!(errors.is_empty(), "transactions were cut: {errors:?}");
    let committed = committed.lock().unwrap().clone();
    let after_term = committed.iter().filter(|(_, at)| *at > term).count();
    eprintln!(
        "{} transactions committed, {after_term} of them finished after SIGTERM; exit {exited_after:?} after it",
        committed.len()
    );
    assert!(
        after_term > 0,
        "transactions in progress at SIGTERM finished"
    );
    let rows = c.primary().sql_db(APP_DB, "SELECT id FROM done").unwrap();
    let present: HashSet<i64> = rows.lines().filter_map(|l| l.trim().parse().ok()).collect();
    for (id, _) in &committed {
        assert!(
            present.contains(id) && present.contains(&-id),
            "committed transaction {id} lost"
        );
    }
    assert_eq!(
        present.len(),
        committed.len() * 2,
        "nothing uncommitted is there either"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_stops_at_once() {
    let c = tokio::task::block_in_place(|| PgCluster::builder().start()).expect("cluster");
    let cfg = PgProxyConfig::new(&c.primary().addr()).client_auth("md5");
    let p = FulcrumProcess::start(&cfg.to_toml()).unwrap();
    let client = pg_connect(&cfg).await;
    client.batch_execute("BEGIN").await.unwrap();
    client.simple_query("SELECT 1").await.unwrap();
    p.signal(Signal::Int).unwrap();
    let status = tokio::task::block_in_place(|| p.wait_exit(Duration::from_secs(5)))
        .expect("SIGINT does not wait for the open transaction");
    assert!(status.success(), "{status:?}");
}

/// The engine's `Close(Drained)` on MySQL: at SIGTERM an idle client is
/// closed at once; one in a transaction finishes it (its COMMIT succeeds)
/// and is closed at that boundary; Fulcrum then exits, the rows there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_sigterm_lets_a_transaction_finish_and_closes_at_its_end() {
    let c = tokio::task::block_in_place(|| MariaCluster::builder().start()).expect("MariaDB");
    c.primary()
        .sql("CREATE TABLE drained (id INT PRIMARY KEY)")
        .unwrap();
    let port = free_port();
    let toml = maria_toml(&c, port, "").replacen(
        "[fulcrum]\n",
        "[fulcrum]\nshutdown_timeout = \"10s\"\n",
        1,
    );
    let p = FulcrumProcess::start(&toml).unwrap();
    let mut idle = maria_connect(port).await;
    idle.query_drop("SELECT 1").await.unwrap();
    let mut busy = maria_connect(port).await;
    busy.query_drop("BEGIN").await.unwrap();
    busy.query_drop("INSERT INTO drained VALUES (1)")
        .await
        .unwrap();
    p.signal(Signal::Term).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        idle.query_drop("SELECT 1").await.is_err(),
        "an idle client is closed at SIGTERM"
    );
    busy.query_drop("INSERT INTO drained VALUES (2)")
        .await
        .expect("the transaction in progress goes on");
    busy.query_drop("COMMIT")
        .await
        .expect("its COMMIT succeeds");
    assert!(
        busy.query_drop("SELECT 1").await.is_err(),
        "closed at the transaction's end"
    );
    let status = tokio::task::block_in_place(|| p.wait_exit(Duration::from_secs(15)))
        .expect("fulcrum exits after SIGTERM");
    assert!(status.success(), "clean exit: {status:?}");
    let rows = c.primary().sql("SELECT count(*) FROM drained").unwrap();
    assert_eq!(rows.trim(), "2", "both rows committed");
}
