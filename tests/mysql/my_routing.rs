//! The MySQL routing corpus through Fulcrum on a real MariaDB primary with
//! two read-only GTID replicas, as a user without SUPER: no statement fails
//! with 1290 (a write sent to a read-only replica), and the statements the
//! corpus calls reads run on the replicas, by the servers' own Com_select
//! counters (the health loop probes once an hour here, so it adds nothing).

use std::time::Duration;

use fulcrum_suite::{com_select, maria_opts, maria_toml};
use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;

const TABLE: &str = "(id INT AUTO_INCREMENT PRIMARY KEY, k INT NOT NULL DEFAULT 0, \
                     c CHAR(120) NOT NULL DEFAULT '', pad CHAR(60) NOT NULL DEFAULT '', KEY k_1 (k))";

/// (line, label, statement) of every case in the MySQL corpus.
fn corpus() -> Vec<(usize, String, String)> {
    let path = format!("{}/tests/corpus/mysql.txt", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .filter_map(|(n, l)| {
            let (label, sql) = l.split_once(" | ")?;
            Some((n + 1, label.trim().to_owned(), sql.replace("\\n", "\n")))
        })
        .collect()
}

async fn fresh_tables(c: &MariaCluster) {
    for i in 1..=4 {
        c.primary()
            .sql(&format!(
                "DROP TABLE IF EXISTS sbtest{i}; CREATE TABLE sbtest{i} {TABLE}; \
                 INSERT INTO sbtest{i} (k, c, pad) SELECT seq, 'c', 'pad' FROM seq_1_to_200"
            ))
            .unwrap();
    }
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_corpus_statement_hits_a_read_only_replica_and_reads_use_the_replicas() {
    let c = MariaCluster::builder()
        .replicas(2)
        .start()
        .expect("cluster");
    fresh_tables(&c).await;
    let port = free_port();
    let t = maria_toml(&c, port, "health_interval = \"1h\"");
    let _p = FulcrumProcess::start(&t).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // the first probe round is done
    let opts = maria_opts(port);

    // Reads first, on clean tables: where do they run?
    let reads: Vec<_> = corpus()
        .into_iter()
        .filter(|(_, l, _)| l == "read")
        .collect();
    let before: Vec<u64> = c.nodes().map(com_select).collect();
    let mut conn = Conn::new(opts.clone()).await.unwrap();
    let mut read_errors = Vec::new();
    for (line, _, sql) in &reads {
        if let Err(e) = conn.query_drop(sql.as_str()).await {
            read_errors.push(format!("mysql.txt:{line}: {e}: {sql}"));
        }
    }
    let after: Vec<u64> = c.nodes().map(com_select).collect();
    let delta: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    eprintln!(
        "{} corpus reads: SELECTs on primary/replica1/replica2 {delta:?}; {} failed",
        reads.len(),
        read_errors.len()
    );
    assert!(
        delta[0] * 20 < delta[1] + delta[2],
        "reads should run on the replicas: {delta:?}"
    );
    assert!(delta[1] > 0 && delta[2] > 0, "both replicas: {delta:?}");

    // Then every statement, each on a fresh connection (the corpus mixes
    // session state): none may fail because it reached a read-only replica.
    let mut misrouted = Vec::new();
    let mut other_errors = Vec::new();
    for (line, label, sql) in corpus() {
        let mut conn = Conn::new(opts.clone()).await.unwrap();
        if let Err(e) = conn.query_drop(sql.as_str()).await {
            match &e {
                mysql_async::Error::Server(s) if s.code == 1290 => {
                    misrouted.push(format!("mysql.txt:{line}: {label}: {sql}: {}", s.message))
                }
                _ => other_errors.push(format!("mysql.txt:{line}: {e}")),
            }
        }
        let _ = conn.disconnect().await;
    }
    eprintln!(
        "corpus through Fulcrum: {} misrouted, {} other errors (missing objects, MySQL-only syntax), e.g.:\n{}",
        misrouted.len(),
        other_errors.len(),
        other_errors.iter().take(8).cloned().collect::<Vec<_>>().join("\n")
    );
    assert!(
        misrouted.is_empty(),
        "writes that reached a read-only replica:\n{}",
        misrouted.join("\n")
    );
}
