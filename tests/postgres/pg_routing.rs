//! Read/write routing on a real primary with two streaming replicas: reads
//! report a replica, transactions and writes the primary, no corpus statement
//! fails on a replica with 25006, and pgbench -S spreads over both replicas.

use std::collections::HashSet;
use std::sync::OnceLock;
use std::time::Duration;

use fulcrum_suite::{pg_connect, pg_connect_as, PgProxyConfig};
use fulcrum_testkit::{
    free_port, pgbench_init, run_pgbench, FulcrumProcess, PgCluster, APP_DB, APP_PASSWORD, APP_USER,
};
use tokio_postgres::{Client, SimpleQueryMessage};

/// This module's own cluster, not shared: its tests count the commits each
/// server ran and time the replicas, so no other module's load may land on it.
fn cluster() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let c = PgCluster::builder()
            .replicas(2)
            .start()
            .expect("start PostgreSQL cluster");
        pgbench_init(&c.primary().addr(), APP_USER, APP_PASSWORD, APP_DB, 1).expect("pgbench -i");
        c.primary()
            .sql("CREATE SEQUENCE routing_seq; GRANT ALL ON SEQUENCE routing_seq TO PUBLIC")
            .expect("sequence");
        c.primary()
            .sql("CREATE FUNCTION bump_counter() RETURNS int LANGUAGE sql AS 'SELECT 1'")
            .expect("function");
        c.primary()
            .sql(
                "CREATE FUNCTION twice(x int) RETURNS int IMMUTABLE LANGUAGE sql AS 'SELECT x * 2'",
            )
            .expect("immutable function");
        // The corpus test runs DDL: it gets a database of its own.
        c.primary()
            .sql_script("postgres", "CREATE DATABASE corpus OWNER app;")
            .expect("corpus database");
        pgbench_init(&c.primary().addr(), APP_USER, APP_PASSWORD, "corpus", 1)
            .expect("pgbench -i corpus");
        c.wait_replicas_caught_up(Duration::from_secs(30))
            .expect("replicas catch up");
        c
    })
}

fn config() -> PgProxyConfig {
    let c = cluster();
    let mut cfg = PgProxyConfig::new(&c.primary().addr()).client_auth("md5");
    for r in c.replicas() {
        cfg = cfg.replica(&r.addr());
    }
    cfg
}

async fn port_of(client: &Client, sql: &str) -> u16 {
    let msgs = client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    msgs.iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(|p| p.parse().unwrap()),
            _ => None,
        })
        .expect("a row")
}

fn replica_ports() -> HashSet<u16> {
    cluster().replicas().iter().map(|r| r.port()).collect()
}

#[tokio::test]
async fn reads_go_to_both_replicas_round_robin() {
    let p = FulcrumProcess::start(&config().to_toml()).unwrap();
    let cfg = config_of(&p);
    let client = pg_connect(&cfg).await;
    let mut seen = HashSet::new();
    for _ in 0..10 {
        let port = port_of(&client, "SELECT inet_server_port()").await;
        assert!(replica_ports().contains(&port), "read served by {port}");
        seen.insert(port);
        // The extended protocol routes the same way.
        let row = client
            .query_one("SELECT inet_server_port()", &[])
            .await
            .unwrap();
        assert!(replica_ports().contains(&(row.get::<_, i32>(0) as u16)));
    }
    assert_eq!(seen, replica_ports(), "both replicas serve reads");
}

#[tokio::test]
async fn transactions_writes_and_hints_go_to_the_primary() {
    let p = FulcrumProcess::start(&config().to_toml()).unwrap();
    let cfg = config_of(&p);
    let client = pg_connect(&cfg).await;
    let primary = cluster().primary().port();
    client.batch_execute("BEGIN").await.unwrap();
    for _ in 0..5 {
        assert_eq!(
            port_of(&client, "SELECT inet_server_port()").await,
            primary,
            "inside a read-write transaction"
        );
    }
    client.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        port_of(&client, "/* fulcrum:primary */ SELECT inet_server_port()").await,
        primary
    );
    assert_eq!(
        port_of(
            &client,
            "SELECT inet_server_port() FROM pgbench_branches FOR UPDATE"
        )
        .await,
        primary
    );
    assert_eq!(
        port_of(
            &client,
            "SELECT inet_server_port() FROM (SELECT nextval('routing_seq')) s"
        )
        .await,
        primary
    );
    // A write in one Query with a read: the strictest part decides.
    let msgs = client
        .simple_query("SELECT 1; UPDATE pgbench_branches SET bbalance = bbalance WHERE bid = 1")
        .await
        .unwrap();
    assert!(!msgs.is_empty());
    // A read-only transaction may run on a replica (a client that has not
    // written: this one's writes would make it wait for the replica or use
    // the primary, consistency = "session").
    let client = pg_connect(&cfg).await;
    client.batch_execute("BEGIN READ ONLY").await.unwrap();
    let port = port_of(&client, "SELECT inet_server_port()").await;
    assert!(
        replica_ports().contains(&port),
        "read-only transaction on {port}"
    );
    assert_eq!(
        port_of(&client, "SELECT inet_server_port()").await,
        port,
        "stays on one server"
    );
    client.batch_execute("COMMIT").await.unwrap();
    // SET TRANSACTION READ ONLY before the first statement: a replica too.
    client.batch_execute("BEGIN").await.unwrap();
    client
        .batch_execute("SET TRANSACTION READ ONLY")
        .await
        .unwrap();
    let port = port_of(&client, "SELECT inet_server_port()").await;
    assert!(
        replica_ports().contains(&port),
        "BEGIN; SET TRANSACTION READ ONLY on {port}"
    );
    let err = client
        .batch_execute("UPDATE pgbench_branches SET bbalance = 0 WHERE bid = 1")
        .await
        .unwrap_err();
    assert_eq!(
        err.code().unwrap().code(),
        "25006",
        "the transaction is read-only, as declared"
    );
    client.batch_execute("ROLLBACK").await.unwrap();
    // An empty transaction needs no server at all.
    client.batch_execute("BEGIN").await.unwrap();
    client.batch_execute("COMMIT").await.unwrap();
    // A plain BEGIN then a read: the primary (a read-write transaction).
    client.batch_execute("BEGIN").await.unwrap();
    assert_eq!(port_of(&client, "SELECT inet_server_port()").await, primary);
    client.batch_execute("COMMIT").await.unwrap();
}

/// The config a running process was started with (its listen address).
fn config_of(p: &FulcrumProcess) -> PgProxyConfig {
    let mut cfg = config();
    cfg.listen = p.listen_addrs()[0].clone();
    cfg
}

#[tokio::test]
async fn no_corpus_statement_fails_on_a_read_only_replica() {
    let p = FulcrumProcess::start(&config().to_toml()).unwrap();
    let cfg = config_of(&p);
    let path = format!("{}/tests/corpus/postgres.txt", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    let (mut ran, mut ok, mut misrouted) = (0, 0, Vec::new());
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((_, sql)) = line.split_once(" | ") else {
            continue;
        };
        let sql = sql.replace("\\n", "\n");
        let lower = sql.to_ascii_lowercase();
        // Statements that would wait for COPY data or stop the servers.
        if lower.contains("stdin")
            || lower.contains("terminate")
            || lower.contains("pg_cancel")
            || lower.contains("pg_reload")
        {
            continue;
        }
        // A fresh client each time: no transaction or pin carries over.
        let client = pg_connect_as(&cfg, APP_USER, "corpus").await;
        ran += 1;
        match tokio::time::timeout(Duration::from_secs(10), client.simple_query(&sql)).await {
            Ok(Ok(_)) => ok += 1,
            Ok(Err(e)) => {
                if e.code().map(|c| c.code()) == Some("25006") {
                    misrouted.push(format!("{sql}: {e}"));
                }
            }
            Err(_) => panic!("statement hung: {sql}"),
        }
    }
    eprintln!(
        "corpus through fulcrum: {ran} run, {ok} succeeded, {} failed with 25006",
        misrouted.len()
    );
    assert!(ran >= 250, "ran {ran}");
    assert!(
        misrouted.is_empty(),
        "sent to a replica but writes:\n{}",
        misrouted.join("\n")
    );
}

#[tokio::test]
async fn reads_fall_back_to_the_primary_when_no_replica_answers() {
    let dead = format!("127.0.0.1:{}", free_port());
    let cfg = PgProxyConfig::new(&cluster().primary().addr())
        .client_auth("md5")
        .replica(&dead);
    let _p = FulcrumProcess::start(&cfg.to_toml()).unwrap();
    let client = pg_connect(&cfg).await;
    for _ in 0..3 {
        assert_eq!(
            port_of(&client, "SELECT inet_server_port()").await,
            cluster().primary().port()
        );
    }
}

#[tokio::test]
async fn session_mode_keeps_every_statement_on_the_primary() {
    let cfg = config().pool_mode("session");
    let _p = FulcrumProcess::start(&cfg.to_toml()).unwrap();
    let client = pg_connect(&cfg).await;
    for _ in 0..3 {
        assert_eq!(
            port_of(&client, "SELECT inet_server_port()").await,
            cluster().primary().port()
        );
    }
}

fn commits(node: &fulcrum_testkit::PgNode) -> u64 {
    node.sql("SELECT xact_commit FROM pg_stat_database WHERE datname = 'app'")
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn pgbench_select_only_spreads_over_both_replicas() {
    let c = cluster();
    let cfg = config();
    let before: Vec<u64> = c.nodes().map(commits).collect();
    let n = 4 * 500;
    {
        let _p = FulcrumProcess::start(&cfg.to_toml()).unwrap();
        for mode in ["simple", "prepared"] {
            let r = run_pgbench(
                &cfg.listen,
                APP_USER,
                APP_PASSWORD,
                APP_DB,
                &["-S", "-n", "-M", mode, "-c", "4", "-t", "250"],
            )
            .unwrap();
            assert_eq!(r.failed, 0);
            assert_eq!(r.transactions, 1000);
        }
        // Dropping the daemon closes its server connections: the servers flush their statistics.
    }
    std::thread::sleep(Duration::from_millis(1500));
    let after: Vec<u64> = c.nodes().map(commits).collect();
    let delta: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    eprintln!("pgbench -S, {n} transactions: commits per node (primary, replica 1, replica 2) = {delta:?}");
    for (i, d) in delta.iter().enumerate().skip(1) {
        assert!(
            *d as f64 >= 0.4 * n as f64 / 2.0,
            "replica {i} served {d} of {n}"
        );
    }
    assert!(
        (delta[0] as f64) < 0.05 * n as f64,
        "primary served {} of {n} reads",
        delta[0]
    );
}

/// Right from the first query: a fresh Fulcrum, and the very first
/// statement of its very first client reads through an immutable user
/// function. The login waited for the database's catalog
/// (`function_catalog_wait`), so the read goes to a replica, not to the
/// primary for want of the catalog. Both ways the catalog is read: a
/// database listed in `[[cluster.database]]` (read at start) and one that
/// is not (read at the first login).
#[tokio::test]
async fn the_first_read_after_start_is_routed_by_the_catalog() {
    // A busy machine (the whole suite, a debug build) may take longer
    // than the default 100 ms for a lookup: the wait is raised so the
    // test shows the mechanism, not the machine's speed.
    // twice() is declared free of session state: unlisted, a call of a
    // user function pins its client (default-deny), to the primary.
    let waits = config()
        .extra("function_catalog_wait = \"5s\"")
        .extra("session_free_functions = [\"twice\"]");
    let listed = waits
        .clone()
        .extra(&format!("[[cluster.database]]\nname = \"{APP_DB}\""));
    for cfg in [waits, listed] {
        let p = FulcrumProcess::start(&cfg.to_toml()).unwrap();
        let cfg = config_of(&p);
        let client = pg_connect(&cfg).await;
        let port = port_of(&client, "SELECT inet_server_port() + twice(0)").await;
        assert!(
            replica_ports().contains(&port),
            "the first read went to {port}\n{}",
            p.log_contents()
        );
    }
}

#[tokio::test]
async fn configured_write_functions_send_reads_to_the_primary() {
    // Declared free of session state, so routing alone decides (unlisted,
    // a call of a user function pins its client to the primary).
    let free = "session_free_functions = [\"bump_counter\"]";
    let cfg = config()
        .extra("write_functions = [\"public.bump_counter\"]")
        .extra(free);
    let _p = FulcrumProcess::start(&cfg.to_toml()).unwrap();
    cluster()
        .wait_replicas_caught_up(Duration::from_secs(30))
        .unwrap();
    for n in cluster().nodes() {
        assert_eq!(
            n.sql("SELECT count(*) FROM pg_proc WHERE proname = 'bump_counter'")
                .unwrap(),
            "1",
            "{}",
            n.name()
        );
    }
    let client = pg_connect(&cfg).await;
    let primary = cluster().primary().port();
    for _ in 0..3 {
        assert_eq!(
            port_of(&client, "SELECT inet_server_port() FROM bump_counter()").await,
            primary
        );
        assert_eq!(
            port_of(
                &client,
                "SELECT inet_server_port() WHERE bump_counter() = 1"
            )
            .await,
            primary
        );
    }
    // Without the setting the server's catalog says it: volatile, the
    // primary (`function_catalog`, on by default) ...
    let plain = config().extra(free);
    let _q = FulcrumProcess::start(&plain.to_toml()).unwrap();
    let other = pg_connect(&plain).await;
    for _ in 0..3 {
        let port = port_of(&other, "SELECT inet_server_port() WHERE bump_counter() = 1").await;
        assert_eq!(port, primary, "the catalog calls it volatile");
    }
    // ... and with neither the same read goes to a replica.
    let blind = config().extra("function_catalog = false").extra(free);
    let _r = FulcrumProcess::start(&blind.to_toml()).unwrap();
    let other = pg_connect(&blind).await;
    let port = port_of(&other, "SELECT inet_server_port() WHERE bump_counter() = 1").await;
    assert!(replica_ports().contains(&port));
}

#[tokio::test]
async fn weighted_balance_follows_the_weights() {
    let c = cluster();
    let mut cfg = PgProxyConfig::new(&c.primary().addr())
        .client_auth("md5")
        .extra("balance = \"weighted\"");
    cfg.backends.push((c.replicas()[0].addr(), "replica"));
    cfg.backends.push((c.replicas()[1].addr(), "replica"));
    // Weights 1:3 for the two replicas.
    let toml = cfg.to_toml().replacen(
        &format!(
            "address = \"{}\"\nrole = \"replica\"\nweight = 1",
            c.replicas()[1].addr()
        ),
        &format!(
            "address = \"{}\"\nrole = \"replica\"\nweight = 3",
            c.replicas()[1].addr()
        ),
        1,
    );
    assert!(toml.contains("weight = 3"));
    let _p = FulcrumProcess::start(&toml).unwrap();
    let client = pg_connect(&cfg).await;
    let mut counts = std::collections::HashMap::new();
    for _ in 0..200 {
        *counts
            .entry(port_of(&client, "SELECT inet_server_port()").await)
            .or_insert(0) += 1;
    }
    let light = counts.get(&c.replicas()[0].port()).copied().unwrap_or(0);
    let heavy = counts.get(&c.replicas()[1].port()).copied().unwrap_or(0);
    eprintln!("weighted 1:3 over 200 reads: {light} / {heavy}");
    assert_eq!(light + heavy, 200, "{counts:?}");
    assert!(
        (45..=55).contains(&light),
        "{light} of 200 on the weight-1 replica"
    );
}

/// Reads under `policy` from 8 concurrent clients while one replica answers
/// 20 ms slower (a server-side delay): the share of reads the slow one served.
async fn slow_replica_share(policy: &str) -> f64 {
    let c = cluster();
    let cfg = config().extra(&format!("balance = \"{policy}\""));
    let _p = FulcrumProcess::start(&cfg.to_toml()).unwrap();
    let slow = c.replicas()[0].port();
    let sql = format!(
        "SELECT inet_server_port() FROM pg_sleep(CASE WHEN inet_server_port() = {slow} THEN 0.02 ELSE 0.001 END)"
    );
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let cfg = cfg.clone();
        let sql = sql.clone();
        tasks.push(tokio::spawn(async move {
            let client = pg_connect(&cfg).await;
            let mut ports = Vec::new();
            for _ in 0..25 {
                ports.push(port_of(&client, &sql).await);
            }
            ports
        }));
    }
    let mut on_slow = 0;
    let mut total = 0;
    for t in tasks {
        for port in t.await.unwrap() {
            total += 1;
            if port == slow {
                on_slow += 1;
            }
        }
    }
    let share = on_slow as f64 / total as f64;
    eprintln!("{policy}: the slow replica served {on_slow} of {total} reads");
    share
}

#[tokio::test]
async fn least_connections_and_p2c_steer_away_from_a_slow_replica() {
    // Round robin gives the slow replica half; the adaptive policies much less.
    let rr = slow_replica_share("round_robin").await;
    assert!((0.4..=0.6).contains(&rr), "round_robin share {rr}");
    let lc = slow_replica_share("least_connections").await;
    assert!(lc < 0.3, "least_connections share {lc}");
    // p2c weighs latency by load: with 8 clients on two replicas the fast one
    // carries most of them, and on a busy machine its latency climbs, so the
    // slow one rightly gets some (0.16-0.24 seen); half would mean no steering.
    let p2c = slow_replica_share("p2c").await;
    assert!(p2c < 0.3, "p2c share {p2c}");
}
