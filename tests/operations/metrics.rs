//! Prometheus metrics against a known workload on both protocols: the
//! counters move by exactly what the clients did (reads, writes, errors),
//! client connections are counted, backends are reported with their role and
//! state, and a live scrape passes `promtool check metrics`.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use fulcrum_suite::{
    family_sum, http_get, maria_connect, maria_toml, pg_connect, pg_connect_str, scrape,
    with_metrics, PgProxyConfig,
};
use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster, PgCluster, APP_DB, APP_USER};
use mysql_async::prelude::Queryable;

/// `promtool check metrics` on a scrape (Debian's prometheus package,
/// installed by the test kit if missing); its findings fail the test.
fn promtool_check(text: &str) {
    let promtool = fulcrum_testkit::tool("/usr/bin/promtool", "prometheus");
    let Ok(mut child) = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        panic!("promtool is missing: .ci/run installs Debian's prometheus package");
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_counters_match_a_known_workload() {
    let c =
        tokio::task::block_in_place(|| PgCluster::builder().replicas(1).start()).expect("cluster");
    c.primary()
        .sql_db(APP_DB, "CREATE TABLE m (n int)")
        .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    let metrics_port = free_port();
    let cfg = PgProxyConfig::new(&c.primary().addr())
        .client_auth("md5")
        .replica(&c.replicas()[0].addr())
        .extra("health_interval = \"200ms\"");
    let _p = FulcrumProcess::start(&with_metrics(&cfg.to_toml(), metrics_port)).unwrap();
    let client = pg_connect(&cfg).await;
    tokio::time::sleep(Duration::from_millis(500)).await; // a health round or two
    let before = scrape(metrics_port);
    for _ in 0..30 {
        client.simple_query("SELECT 1").await.unwrap();
    }
    assert!(client
        .simple_query("SELECT * FROM no_such_table")
        .await
        .is_err());
    for i in 0..20 {
        client
            .simple_query(&format!("INSERT INTO m VALUES ({i})"))
            .await
            .unwrap();
    }
    // A read after the client's writes (consistency = "session", the
    // default) is a causal read: on the replica if it has replayed them,
    // else on the primary; either way counted once.
    client.simple_query("SELECT count(*) FROM m").await.unwrap();
    // A unit is counted when its server connection is released, which can
    // be a moment after the client has its answer: scrape until it is in.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut after = scrape(metrics_port);
    while family_sum(&after, "fulcrum_transactions_total", &[])
        - family_sum(&before, "fulcrum_transactions_total", &[])
        < 52.0
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
        after = scrape(metrics_port);
    }
    let delta = |family: &str, filters: &[(&str, &str)]| {
        family_sum(&after, family, filters) - family_sum(&before, family, filters)
    };
    assert_eq!(delta("fulcrum_causal_reads_total", &[]), 1.0);
    let on_replica = delta("fulcrum_causal_reads_total", &[("outcome", "replica")]);
    assert_eq!(
        on_replica + delta("fulcrum_causal_reads_total", &[("outcome", "primary")]),
        1.0
    );
    assert_eq!(
        delta("fulcrum_queries_total", &[("route", "read")]),
        31.0 + on_replica,
        "30 reads + the failed one (+ the causal read if a replica took it)"
    );
    assert_eq!(
        delta("fulcrum_queries_total", &[("route", "write")]),
        20.0 + (1.0 - on_replica)
    );
    assert_eq!(
        delta(
            "fulcrum_queries_total",
            &[("backend", &c.replicas()[0].addr()), ("route", "read")]
        ),
        31.0 + on_replica,
        "reads ran on the replica"
    );
    assert_eq!(
        delta("fulcrum_errors_total", &[("code", "42")]),
        1.0,
        "42P01 is class 42"
    );
    assert_eq!(
        delta("fulcrum_transactions_total", &[]),
        52.0,
        "one unit per statement"
    );
    assert_eq!(family_sum(&after, "fulcrum_client_connections", &[]), 1.0);
    assert_eq!(
        family_sum(
            &after,
            "fulcrum_clients",
            &[("user", APP_USER), ("state", "idle")]
        ),
        1.0,
        "the one client, by user"
    );
    assert_eq!(
        family_sum(
            &after,
            "fulcrum_backend_primary",
            &[("backend", &c.primary().addr())]
        ),
        1.0
    );
    assert_eq!(
        family_sum(&after, "fulcrum_backend_state", &[("state", "up")]),
        2.0
    );
    assert!(delta("fulcrum_bytes_total", &[("direction", "in")]) > 0.0);
    assert_eq!(
        delta("fulcrum_proxy_seconds_count", &[]),
        delta("fulcrum_transactions_total", &[]),
        "the part Fulcrum adds is measured once per unit of work"
    );
    assert!(family_sum(&after, "fulcrum_classifier_cache_hits_total", &[]) > 0.0);
    // The build and the standard process series.
    assert_eq!(
        family_sum(
            &after,
            "fulcrum_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    assert!(family_sum(&after, "process_resident_memory_bytes", &[]) > 1e6);
    assert!(family_sum(&after, "process_open_fds", &[]) > 3.0);
    // (Whole seconds in this client library: a young process may show 0.)
    assert!(after.contains("\nprocess_cpu_seconds_total "), "{after}");
    assert!(family_sum(&after, "process_start_time_seconds", &[]) > 1.7e9);
    promtool_check(&after);
    assert_eq!(
        delta("fulcrum_position_queries_total", &[]),
        0.0,
        "no position query without strong reads"
    );

    // `consistency = "strong"` (SET per session): 8 clients x 25 reads at
    // once, each one counted as a causal read; reads asking at the same time
    // share the primary's position query, so there are fewer of those.
    let before = after;
    let mut clients = Vec::new();
    for _ in 0..8 {
        let conn_str = cfg.conn_string(APP_USER, APP_DB);
        clients.push(tokio::spawn(async move {
            let client = pg_connect_str(&conn_str).await.unwrap();
            client
                .simple_query("SET fulcrum.consistency = 'strong'")
                .await
                .unwrap();
            for _ in 0..25 {
                client.simple_query("SELECT 1").await.unwrap();
            }
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    let after = scrape(metrics_port);
    let delta = |family: &str| family_sum(&after, family, &[]) - family_sum(&before, family, &[]);
    let strong_reads = delta("fulcrum_causal_reads_total");
    let position_queries = delta("fulcrum_position_queries_total");
    assert_eq!(strong_reads, 200.0, "every strong read had a position");
    assert!(
        (1.0..strong_reads).contains(&position_queries),
        "{position_queries} position queries for {strong_reads} concurrent strong reads"
    );
    eprintln!("{position_queries} position queries for {strong_reads} concurrent strong reads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_counters_match_a_known_workload() {
    let c = tokio::task::block_in_place(|| MariaCluster::builder().replicas(1).start())
        .expect("cluster");
    c.primary().sql("CREATE TABLE m (n INT)").unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    let (port, metrics_port) = (free_port(), free_port());
    let toml = maria_toml(&c, port, "health_interval = \"200ms\"");
    let _p = FulcrumProcess::start(&with_metrics(&toml, metrics_port)).unwrap();
    let mut conn = maria_connect(port).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = scrape(metrics_port);
    for _ in 0..30 {
        conn.query_drop("SELECT 1").await.unwrap();
    }
    assert!(conn
        .query_drop("SELECT * FROM no_such_table")
        .await
        .is_err());
    for i in 0..20 {
        conn.query_drop(format!("INSERT INTO m VALUES ({i})"))
            .await
            .unwrap();
    }
    // A causal read (consistency = "session"): a replica that has the
    // client's writes, or the primary; counted once either way.
    conn.query_drop("SELECT count(*) FROM m").await.unwrap();
    let after = scrape(metrics_port);
    let delta = |family: &str, filters: &[(&str, &str)]| {
        family_sum(&after, family, filters) - family_sum(&before, family, filters)
    };
    assert_eq!(delta("fulcrum_causal_reads_total", &[]), 1.0);
    let on_replica = delta("fulcrum_causal_reads_total", &[("outcome", "replica")]);
    assert_eq!(
        delta("fulcrum_queries_total", &[("route", "read")]),
        31.0 + on_replica
    );
    assert_eq!(
        delta("fulcrum_queries_total", &[("route", "write")]),
        20.0 + (1.0 - on_replica)
    );
    assert_eq!(delta("fulcrum_errors_total", &[("code", "1146")]), 1.0);
    assert_eq!(
        family_sum(&after, "fulcrum_client_connections", &[("cluster", "shop")]),
        1.0
    );
    assert_eq!(
        family_sum(
            &after,
            "fulcrum_backend_primary",
            &[("backend", &c.primary().addr())]
        ),
        1.0
    );
    promtool_check(&after);
}

/// `/healthz` answers while the process runs; `/ready` is 200 while every
/// cluster has a write target and 503 naming the cluster once its primary
/// is gone (what a load balancer in front of several Fulcrums needs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_and_ready_follow_the_write_target() {
    let c = tokio::task::block_in_place(|| PgCluster::builder().start()).expect("cluster");
    let metrics_port = free_port();
    let cfg = PgProxyConfig::new(&c.primary().addr())
        .extra("health_interval = \"200ms\"")
        .extra("health_failures = 1");
    let _p = FulcrumProcess::start(&with_metrics(&cfg.to_toml(), metrics_port)).unwrap();
    assert_eq!(
        http_get(metrics_port, "/healthz"),
        ("HTTP/1.1 200 OK".into(), "ok\n".into())
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while http_get(metrics_port, "/ready").0 != "HTTP/1.1 200 OK" {
        assert!(std::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = http_get(metrics_port, "/ready");
        if status == "HTTP/1.1 503 Service Unavailable" {
            assert_eq!(body, "not ready: cluster \"main\" has no write target\n");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(http_get(metrics_port, "/healthz").0, "HTTP/1.1 200 OK");
    assert_eq!(http_get(metrics_port, "/nope").0, "HTTP/1.1 404 Not Found");
}
