//! Read-your-writes and causal reads through Fulcrum on a real PostgreSQL 15
//! cluster whose two replicas apply WAL 300 ms late on purpose
//! (`recovery_min_apply_delay`): write-then-read loops count stale reads per
//! `consistency` mode (eventual must show them, which proves the lag is real;
//! session and strong must not), tokio-postgres inserts N rows then counts
//! them, readers that never write keep using the replicas, a read waits on a
//! replica with `causal_wait = "always"`, strong sees another client's
//! write, and the per-statement hint and `SET fulcrum.consistency` work.
//!
//! One cluster for this module's tests (the binary's others do not use it);
//! each test starts its own Fulcrum.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use fulcrum_suite::{pg_connect, PgProxyConfig};
use fulcrum_testkit::{FulcrumProcess, PgCluster, APP_DB};
use tokio_postgres::{Client, SimpleQueryMessage};

/// How late the replicas apply WAL.
const APPLY_DELAY: &str = "300ms";

/// This module's own cluster: its replicas apply WAL `APPLY_DELAY` late.
fn cluster() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let c = PgCluster::builder().replicas(2).start().expect("cluster");
        c.primary()
            .sql_db(
                APP_DB,
                "CREATE TABLE rw (client int, i int, PRIMARY KEY (client, i)); \
                 CREATE TABLE rows_n (round int, n int)",
            )
            .unwrap();
        c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
        for r in c.replicas() {
            r.sql(&format!(
                "ALTER SYSTEM SET recovery_min_apply_delay = '{APPLY_DELAY}'"
            ))
            .unwrap();
            r.sql("SELECT pg_reload_conf()").unwrap();
        }
        c
    })
}

fn start(extra: &[&str]) -> (FulcrumProcess, PgProxyConfig) {
    let c = cluster();
    let mut cfg = PgProxyConfig::new(&c.primary().addr()).client_auth("md5");
    for r in c.replicas() {
        cfg = cfg.replica(&r.addr());
    }
    for e in extra {
        cfg = cfg.extra(e);
    }
    let p = FulcrumProcess::start(&cfg.to_toml()).unwrap();
    (p, cfg)
}

/// The first row of a simple query, as text columns.
async fn row(client: &Client, sql: &str) -> Vec<String> {
    client
        .simple_query(sql)
        .await
        .unwrap()
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(
                (0..r.len())
                    .map(|i| r.get(i).unwrap_or("").to_string())
                    .collect(),
            ),
            _ => None,
        })
        .expect("a row")
}

/// `clients` connections each insert a row then read it back `iterations`
/// times; returns (stale reads, reads by server port).
async fn write_then_read(
    cfg: &PgProxyConfig,
    base: i32,
    clients: i32,
    iterations: i32,
) -> (u64, HashMap<u16, u64>) {
    let tasks: Vec<_> = (0..clients)
        .map(|k| {
            let cfg = cfg.clone();
            tokio::spawn(async move {
                let c = pg_connect(&cfg).await;
                let id = base + k;
                let (mut stale, mut ports) = (0u64, HashMap::new());
                for i in 0..iterations {
                    c.simple_query(&format!("INSERT INTO rw VALUES ({id}, {i})"))
                        .await
                        .unwrap();
                    let r = row(
                        &c,
                        &format!(
                            "SELECT count(*), inet_server_port() FROM rw WHERE client = {id} AND i = {i}"
                        ),
                    )
                    .await;
                    if r[0] != "1" {
                        stale += 1;
                    }
                    *ports.entry(r[1].parse::<u16>().unwrap()).or_insert(0) += 1;
                }
                (stale, ports)
            })
        })
        .collect();
    let mut stale = 0;
    let mut ports = HashMap::new();
    for t in tasks {
        let (s, p) = t.await.unwrap();
        stale += s;
        for (k, v) in p {
            *ports.entry(k).or_insert(0) += v;
        }
    }
    (stale, ports)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_and_strong_never_read_stale_eventual_does() {
    let c = tokio::task::block_in_place(cluster);
    let mut stale_by_mode = Vec::new();
    for (n, mode) in ["eventual", "session", "strong"].iter().enumerate() {
        let (_p, cfg) = start(&[&format!("consistency = \"{mode}\"")]);
        let (stale, ports) = write_then_read(&cfg, 1000 * (n as i32 + 1), 4, 250).await;
        eprintln!("consistency={mode}: {stale} stale of 1000 reads; reads by port {ports:?}");
        stale_by_mode.push((mode, stale, ports));
    }
    let primary = c.primary().port();
    let (_, eventual_stale, eventual_ports) = &stale_by_mode[0];
    assert!(
        *eventual_stale > 0,
        "eventual reads replicas that apply {APPLY_DELAY} late: some reads must be stale ({eventual_ports:?})"
    );
    assert_eq!(
        eventual_ports.get(&primary),
        None,
        "eventual reads only replicas"
    );
    for (mode, stale, _) in &stale_by_mode[1..] {
        assert_eq!(*stale, 0, "consistency={mode} never reads stale");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inserted_rows_are_all_counted_every_time() {
    tokio::task::block_in_place(cluster);
    let (_p, cfg) = start(&[]);
    let client = pg_connect(&cfg).await;
    // Extended protocol, as applications use it: prepared insert, prepared count.
    let insert = client
        .prepare("INSERT INTO rows_n VALUES ($1, $2)")
        .await
        .unwrap();
    let count = client
        .prepare("SELECT count(*) FROM rows_n WHERE round = $1")
        .await
        .unwrap();
    for round in 0..20i32 {
        for n in 0..50i32 {
            client.execute(&insert, &[&round, &n]).await.unwrap();
        }
        let got: i64 = client.query_one(&count, &[&round]).await.unwrap().get(0);
        assert_eq!(got, 50, "round {round}: all 50 rows counted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_that_never_write_keep_the_replicas() {
    let c = tokio::task::block_in_place(cluster);
    let (_p, cfg) = start(&[]); // consistency = session, the default
    let reader = pg_connect(&cfg).await;
    let mut ports: HashMap<u16, u64> = HashMap::new();
    for _ in 0..40 {
        let r = row(&reader, "SELECT inet_server_port()").await;
        *ports.entry(r[0].parse().unwrap()).or_insert(0) += 1;
    }
    eprintln!("never-writing reader under session: reads by port {ports:?}");
    for r in c.replicas() {
        assert!(
            ports.get(&r.port()).copied().unwrap_or(0) >= 10,
            "replica {} serves its share: {ports:?}",
            r.port()
        );
    }
    assert_eq!(ports.get(&c.primary().port()), None, "{ports:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_waits_for_a_replica_when_told_to() {
    let c = tokio::task::block_in_place(cluster);
    let (_p, cfg) = start(&["causal_wait = \"always\"", "causal_timeout = \"3s\""]);
    let client = pg_connect(&cfg).await;
    let replicas: Vec<u16> = c.replicas().iter().map(|r| r.port()).collect();
    for i in 0..5 {
        client
            .simple_query(&format!("INSERT INTO rw VALUES (9000, {i})"))
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let r = row(
            &client,
            &format!("SELECT count(*), inet_server_port() FROM rw WHERE client = 9000 AND i = {i}"),
        )
        .await;
        let took = started.elapsed();
        assert_eq!(r[0], "1", "not stale");
        let port: u16 = r[1].parse().unwrap();
        assert!(replicas.contains(&port), "served by a replica, got {port}");
        assert!(
            took >= Duration::from_millis(100),
            "the read waited for the replica to apply the write ({took:?})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strong_sees_another_clients_write_session_may_not() {
    tokio::task::block_in_place(cluster);
    let mut stale = Vec::new();
    for (n, mode) in ["session", "strong"].iter().enumerate() {
        let (_p, cfg) = start(&[&format!("consistency = \"{mode}\"")]);
        let writer = pg_connect(&cfg).await;
        let reader = pg_connect(&cfg).await;
        let id = 20_000 + n as i32;
        let mut s = 0;
        for i in 0..100 {
            writer
                .simple_query(&format!("INSERT INTO rw VALUES ({id}, {i})"))
                .await
                .unwrap();
            let r = row(
                &reader,
                &format!("SELECT count(*) FROM rw WHERE client = {id} AND i = {i}"),
            )
            .await;
            if r[0] != "1" {
                s += 1;
            }
        }
        eprintln!("another client's write, consistency={mode}: {s} stale of 100");
        stale.push(s);
    }
    assert!(
        stale[0] > 0,
        "session does not promise another client's writes"
    );
    assert_eq!(
        stale[1], 0,
        "strong sees every write committed before the read"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hint_and_session_setting_choose_the_mode() {
    tokio::task::block_in_place(cluster);
    let (_p, cfg) = start(&[]);
    let client = pg_connect(&cfg).await;
    assert_eq!(row(&client, "SHOW fulcrum.consistency").await, ["session"]);
    // The hint makes one read eventual: right after a write it is stale.
    let mut stale = 0;
    for i in 0..20 {
        client
            .simple_query(&format!("INSERT INTO rw VALUES (30000, {i})"))
            .await
            .unwrap();
        let r = row(
            &client,
            &format!(
                "/* fulcrum:consistency=eventual */ SELECT count(*) FROM rw WHERE client = 30000 AND i = {i}"
            ),
        )
        .await;
        if r[0] != "1" {
            stale += 1;
        }
    }
    assert!(stale > 0, "the eventual hint reads a lagging replica");
    // The session setting does the same for every read, until reset.
    client
        .simple_query("SET fulcrum.consistency = 'eventual'")
        .await
        .unwrap();
    assert_eq!(row(&client, "SHOW fulcrum.consistency").await, ["eventual"]);
    let err = client
        .simple_query("SET fulcrum.consistency = 'sometimes'")
        .await
        .unwrap_err();
    assert_eq!(
        err.code().map(|c| c.code()),
        Some("22023"),
        "a bad value is refused: {err:?}"
    );
    client
        .simple_query("RESET fulcrum.consistency")
        .await
        .unwrap();
    assert_eq!(row(&client, "SHOW fulcrum.consistency").await, ["session"]);
    client
        .simple_query("INSERT INTO rw VALUES (30001, 0)")
        .await
        .unwrap();
    let r = row(&client, "SELECT count(*) FROM rw WHERE client = 30001").await;
    assert_eq!(r[0], "1", "session again after RESET");
}

/// Whether a server connection of the primary still shows `marker` as its
/// last statement after `wait`.
fn last_statement_shows(marker: &str, wait: Duration) -> bool {
    std::thread::sleep(wait);
    let found = cluster()
        .primary()
        .sql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() \
             AND query LIKE '%{marker}%'"
        ))
        .unwrap();
    found.trim() != "0"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_position_query_follows_writes_only_when_replicas_exist() {
    // With replicas, session mode asks the primary's position right after a
    // write, on the same server connection: the INSERT is no longer that
    // connection's last statement.
    let (_p, cfg) = start(&[]);
    let client = pg_connect(&cfg).await;
    client
        .simple_query("INSERT INTO rw VALUES (40001, 0) /* pos-marker-a */")
        .await
        .unwrap();
    assert!(
        !last_statement_shows("pos-marker-a", Duration::from_millis(500)),
        "the position query ran after the write"
    );
    // One backend: every read is on the primary already, so no position
    // query (a single-node cluster pays nothing for session mode).
    let single = PgProxyConfig::new(&cluster().primary().addr()).client_auth("md5");
    let _q = FulcrumProcess::start(&single.to_toml()).unwrap();
    let client = pg_connect(&single).await;
    client
        .simple_query("INSERT INTO rw VALUES (40002, 0) /* pos-marker-b */")
        .await
        .unwrap();
    assert!(
        last_statement_shows("pos-marker-b", Duration::from_millis(500)),
        "no position query after a write on a single-node cluster"
    );
}

/// `consistency = "user"`: a write on one connection is seen by the next
/// read on a fresh connection of the same user (the `psql -c` pattern, a web
/// app's pool handing the next request another connection). `session` misses
/// it, which proves the pattern reaches the lagging replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_consistency_covers_every_connection_of_the_user() {
    tokio::task::block_in_place(cluster);
    let mut stale_by_mode = Vec::new();
    for (mode, id) in [("session", 50_000), ("user", 60_000)] {
        let (_p, cfg) = start(&[&format!("consistency = \"{mode}\"")]);
        let writer = pg_connect(&cfg).await;
        let mut stale = 0;
        for i in 0..30 {
            writer
                .simple_query(&format!("INSERT INTO rw VALUES ({id}, {i})"))
                .await
                .unwrap();
            let reader = pg_connect(&cfg).await;
            let r = row(
                &reader,
                &format!("SELECT count(*) FROM rw WHERE client = {id} AND i = {i}"),
            )
            .await;
            if r[0] != "1" {
                stale += 1;
            }
        }
        stale_by_mode.push((mode, stale));
    }
    assert!(
        stale_by_mode[0].1 > 0,
        "session does not cover other connections: {stale_by_mode:?}"
    );
    assert_eq!(
        stale_by_mode[1].1, 0,
        "user never misses: {stale_by_mode:?}"
    );
}

/// The causal token: `SHOW fulcrum.position` after a write, then
/// `SET fulcrum.min_position` or the `fulcrum:after` hint on another
/// connection makes its reads wait for that write; a bad token is 22023 and
/// the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_causal_token_carries_a_write_to_another_connection() {
    tokio::task::block_in_place(cluster);
    let (_p, cfg) = start(&[]);
    let writer = pg_connect(&cfg).await;
    let id = 70_000;
    for i in 0..16 {
        writer
            .simple_query(&format!("INSERT INTO rw VALUES ({id}, {i})"))
            .await
            .unwrap();
        let token = row(&writer, "SHOW fulcrum.position").await[0].clone();
        let lsn = token.split_once('/');
        assert!(
            lsn.is_some_and(|(hi, lo)| u32::from_str_radix(hi, 16).is_ok()
                && u32::from_str_radix(lo, 16).is_ok()),
            "an LSN: {token:?}"
        );
        // A fresh connection each time: it has written nothing.
        let reader = pg_connect(&cfg).await;
        let count = format!("SELECT count(*) FROM rw WHERE client = {id} AND i = {i}");
        let r = if i % 2 == 0 {
            reader
                .simple_query(&format!("SET fulcrum.min_position = '{token}'"))
                .await
                .unwrap();
            row(&reader, &count).await
        } else {
            row(&reader, &format!("/* fulcrum:after={token} */ {count}")).await
        };
        assert_eq!(r[0], "1", "round {i}: the token's write is seen");
    }
    let reader = pg_connect(&cfg).await;
    let err = reader
        .simple_query("SET fulcrum.min_position = 'nope'")
        .await
        .unwrap_err();
    assert_eq!(err.as_db_error().map(|d| d.code().code()), Some("22023"));
    assert_eq!(row(&reader, "SELECT 1").await[0], "1");
}
