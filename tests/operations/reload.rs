//! Online reload: SIGHUP (and the console's RELOAD) apply a changed config
//! without dropping connected clients (their cancel keys still work).
//! Adding a replica: new clients read from it. An invalid file: its `file:line: key: reason` is logged (and
//! returned by RELOAD) and the running config stays.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use fulcrum_suite::{console_connect, pg_connect, with_console, PgProxyConfig};
use fulcrum_testkit::{free_port, FulcrumProcess, PgCluster, Signal};
use tokio_postgres::SimpleQueryMessage;

async fn ports(cfg: &PgProxyConfig, reads: usize) -> HashSet<u16> {
    let c = pg_connect(cfg).await;
    let mut seen = HashSet::new();
    for _ in 0..reads {
        let msgs = c.simple_query("SELECT inet_server_port()").await.unwrap();
        seen.extend(msgs.iter().filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(|p| p.parse::<u16>().unwrap()),
            _ => None,
        }));
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_adds_a_replica_and_an_invalid_file_keeps_the_running_config() {
    let c =
        tokio::task::block_in_place(|| PgCluster::builder().replicas(2).start()).expect("cluster");
    let (r1, r2) = (&c.replicas()[0], &c.replicas()[1]);
    let admin_port = free_port();
    let one = PgProxyConfig::new(&c.primary().addr())
        .client_auth("md5")
        .replica(&r1.addr());
    let toml = |cfg: &PgProxyConfig| with_console(&cfg.to_toml(), admin_port);
    let p = FulcrumProcess::start(&toml(&one)).unwrap();
    assert_eq!(ports(&one, 6).await, HashSet::from([r1.port()]));
    // A client connected before the reload, in a transaction across it.
    let old = pg_connect(&one).await;
    old.batch_execute("BEGIN").await.unwrap();
    old.simple_query("SELECT 1").await.unwrap();

    let mut two = one.clone();
    two.backends.push((r2.addr(), "replica"));
    std::fs::write(p.config_path(), toml(&two)).unwrap();
    p.signal(Signal::Hup).unwrap();
    p.wait_for_log("config reloaded", Duration::from_secs(10))
        .unwrap();
    let start = Instant::now();
    loop {
        if ports(&two, 10).await == HashSet::from([r1.port(), r2.port()]) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the added replica never got reads"
        );
    }
    // The old client was not dropped: its transaction goes on and commits.
    old.simple_query("SELECT 2").await.unwrap();
    old.batch_execute("COMMIT").await.unwrap();
    // Its cancel key still reaches it: a CancelRequest is handed to the
    // context current when it connects, which has the keys issued before.
    fulcrum_suite::cancel_a_sleep(&old, None).await;

    // An invalid file: the error names file, line and key; nothing changes.
    let bad = toml(&two).replacen("pool_size = 20", "pool_size = 20\npool_sise = 5", 1);
    std::fs::write(p.config_path(), &bad).unwrap();
    p.signal(Signal::Hup).unwrap();
    p.wait_for_log("config not reloaded", Duration::from_secs(10))
        .unwrap();
    assert!(
        p.log_contents().contains("pool_sise"),
        "the log names the key"
    );
    assert_eq!(ports(&two, 10).await, HashSet::from([r1.port(), r2.port()]));

    // The console's RELOAD returns the same error.
    let admin = console_connect(admin_port).await;
    let e = admin.simple_query("RELOAD").await.unwrap_err();
    let text = format!("{e:?}");
    assert!(text.contains("pool_sise") && text.contains(":"), "{text}");
    // Back to a valid file: RELOAD applies it and says what it did.
    std::fs::write(p.config_path(), toml(&one)).unwrap();
    let msgs = admin.simple_query("RELOAD").await.unwrap();
    let summary = msgs
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap();
    assert!(summary.contains("applied to main"), "{summary}");
    assert_eq!(
        ports(&one, 6).await,
        HashSet::from([r1.port()]),
        "replica2 removed again"
    );
}

/// Client backends on `node` logged in as the health loop's user (the
/// probes keep one connection per backend and monitor).
fn probe_connections(node: &fulcrum_testkit::PgNode) -> usize {
    node.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE usename = 'postgres' \
         AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
    )
    .unwrap()
    .trim()
    .parse()
    .unwrap()
}

/// A cluster has one health loop at a time: five reloads (with a client
/// connected before them, which keeps the older configs alive) leave one
/// monitor probing the servers, and after a reload to `failover = "none"`
/// no earlier monitor promotes a replica when the primary stops. The client
/// from before the reloads follows the new loop's routing state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_leave_one_health_loop_per_cluster() {
    let c =
        tokio::task::block_in_place(|| PgCluster::builder().replicas(1).start()).expect("cluster");
    let cfg = |pool: u32, failover: &str| {
        PgProxyConfig::new(&c.primary().addr())
            .client_auth("md5")
            .replica(&c.replicas()[0].addr())
            .pool_size(pool)
            .extra("health_user = \"postgres\"")
            .extra("health_password = \"\"")
            .extra("health_interval = \"200ms\"")
            .extra("health_failures = 2")
            .extra(&format!("failover = \"{failover}\""))
            .extra("failover_timeout = \"1s\"")
    };
    let first = cfg(20, "promote");
    let p = FulcrumProcess::start(&first.to_toml()).unwrap();
    let early = pg_connect(&first).await;
    early.simple_query("SELECT 1").await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let before = probe_connections(c.primary());
    assert!(before >= 1, "the health loop probes the primary");
    for i in 1..=5u32 {
        let next = PgProxyConfig {
            listen: first.listen.clone(),
            ..cfg(20 + i, "promote")
        };
        std::fs::write(p.config_path(), next.to_toml()).unwrap();
        p.signal(Signal::Hup).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while p.log_contents().matches("config reloaded").count() < i as usize {
            assert!(Instant::now() < deadline, "reload {i} not applied");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        probe_connections(c.primary()),
        before,
        "one monitor's probes after five reloads"
    );
    // Reload to failover = "none", then lose the primary: nothing promotes.
    let none = PgProxyConfig {
        listen: first.listen.clone(),
        ..cfg(30, "none")
    };
    std::fs::write(p.config_path(), none.to_toml()).unwrap();
    p.signal(Signal::Hup).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.log_contents().matches("config reloaded").count() < 6 {
        assert!(
            Instant::now() < deadline,
            "reload to failover = none not applied"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        c.replicas()[0]
            .sql("SELECT pg_is_in_recovery()")
            .unwrap()
            .trim(),
        "t",
        "a monitor from before the reload promoted the replica:\n{}",
        p.log_contents()
    );
    // The client from before the reloads sees the primary gone too.
    let e = early
        .simple_query("CREATE TABLE after_loss (n int)")
        .await
        .expect_err("no write target");
    assert!(!e.to_string().is_empty());
}

/// The first value of the row whose first column is `key`, in a console answer.
fn row_value(msgs: &[SimpleQueryMessage], key: &str) -> Option<String> {
    msgs.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) if r.get(0) == Some(key) => r.get(1).map(str::to_owned),
        _ => None,
    })
}

/// What only a restart changes is said, not pretended: RELOAD names it,
/// `fulcrum_reload_pending_restart` counts it, SHOW CONFIG keeps the
/// running value, and the count goes back to 0 once the file agrees
/// again; `log` is applied on the spot, and SHOW CONFIG shows the filter
/// running (after `SET log` too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_reports_what_needs_a_restart_and_keeps_running_values() {
    let c = fulcrum_suite::pg_primary();
    let (admin_port, metrics_port) = (free_port(), free_port());
    let cfg = PgProxyConfig::new(&c.primary().addr()).client_auth("md5");
    let base = fulcrum_suite::with_metrics(&with_console(&cfg.to_toml(), admin_port), metrics_port);
    assert!(base.contains("[fulcrum]\n"));
    let p = FulcrumProcess::start(&base).unwrap();
    let admin = console_connect(admin_port).await;
    let changed = base
        .replacen("[fulcrum]\n", "[fulcrum]\nworkers = 3\n", 1)
        .replacen("log = \"info\"", "log = \"debug\"", 1)
        .replacen(
            "pool_mode = ",
            "max_client_connections = 77\npool_mode = ",
            1,
        );
    assert_ne!(changed, base);
    std::fs::write(p.config_path(), &changed).unwrap();
    let msgs = admin.simple_query("RELOAD").await.unwrap();
    let summary = msgs
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap();
    assert!(
        summary.contains("needs a restart: fulcrum.workers"),
        "{summary}"
    );
    assert!(summary.contains("main.max_client_connections"), "{summary}");
    assert!(summary.contains("log = \"debug\""), "{summary}");
    let pending = fulcrum_suite::family_sum(
        &fulcrum_suite::scrape(metrics_port),
        "fulcrum_reload_pending_restart",
        &[],
    );
    assert_eq!(pending, 2.0, "workers and max_client_connections");
    let config = admin.simple_query("SHOW CONFIG").await.unwrap();
    assert_ne!(
        row_value(&config, "fulcrum.workers").as_deref(),
        Some("3"),
        "the running value"
    );
    assert_eq!(
        row_value(&config, "fulcrum.log").as_deref(),
        Some("debug"),
        "applied"
    );
    p.wait_for_log("need a restart", Duration::from_secs(5))
        .unwrap();
    // SHOW CONFIG's log is the filter running: the console's SET log...
    admin.simple_query("SET log = 'warn'").await.unwrap();
    let config = admin.simple_query("SHOW CONFIG").await.unwrap();
    assert_eq!(row_value(&config, "fulcrum.log").as_deref(), Some("warn"));
    // The file agrees with the process again (and its `log` is applied).
    std::fs::write(p.config_path(), &base).unwrap();
    admin.simple_query("RELOAD").await.unwrap();
    let config = admin.simple_query("SHOW CONFIG").await.unwrap();
    assert_eq!(row_value(&config, "fulcrum.log").as_deref(), Some("info"));
    let pending = fulcrum_suite::family_sum(
        &fulcrum_suite::scrape(metrics_port),
        "fulcrum_reload_pending_restart",
        &[],
    );
    assert_eq!(pending, 0.0);
}

/// A cluster added to the file, or removed from it, needs a restart (its
/// listener is bound at start): RELOAD says so, the log warns, the gauge
/// counts each one, the removed cluster goes on serving, SHOW CONFIG keeps
/// the running clusters; and the count is 0 again once the file agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_added_or_removed_on_reload_is_reported_and_counted() {
    let c = fulcrum_suite::pg_primary();
    let (admin_port, metrics_port) = (free_port(), free_port());
    let cfg = PgProxyConfig::new(&c.primary().addr()).client_auth("md5");
    let base = fulcrum_suite::with_metrics(&with_console(&cfg.to_toml(), admin_port), metrics_port);
    let p = FulcrumProcess::start(&base).unwrap();
    let admin = console_connect(admin_port).await;
    let reload = || async {
        let msgs = admin.simple_query("RELOAD").await.unwrap();
        let summary = msgs
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                _ => None,
            })
            .unwrap();
        let pending = fulcrum_suite::family_sum(
            &fulcrum_suite::scrape(metrics_port),
            "fulcrum_reload_pending_restart",
            &[],
        );
        (summary, pending)
    };

    // A second cluster, on a port of its own.
    let extra_listen = format!("127.0.0.1:{}", free_port());
    let extra = PgProxyConfig {
        listen: extra_listen.clone(),
        ..cfg.clone()
    }
    .to_toml();
    let extra = &extra[extra.find("[[cluster]]").unwrap()..].replacen(
        "name = \"main\"",
        "name = \"extra\"",
        1,
    );
    std::fs::write(p.config_path(), format!("{base}\n{extra}")).unwrap();
    let (summary, pending) = reload().await;
    assert!(
        summary.contains(&format!(
            "needs a restart: cluster extra (new in the file; a restart starts it on {extra_listen})"
        )),
        "{summary}"
    );
    assert_eq!(pending, 1.0, "the new cluster");
    p.wait_for_log("need a restart", Duration::from_secs(5))
        .unwrap();
    assert!(
        p.log_contents().contains("cluster extra (new in the file"),
        "the warning names it:\n{}",
        p.log_contents()
    );
    assert!(
        tokio::net::TcpStream::connect(&extra_listen).await.is_err(),
        "nothing listens for the new cluster before a restart"
    );

    // "main" renamed: "main" removed and "other" new.
    std::fs::write(
        p.config_path(),
        base.replacen("name = \"main\"", "name = \"other\"", 1),
    )
    .unwrap();
    let (summary, pending) = reload().await;
    assert!(
        summary.contains("cluster main (removed from the file")
            && summary.contains("cluster other (new in the file"),
        "{summary}"
    );
    assert_eq!(pending, 2.0, "main removed, other new");
    let client = pg_connect(&cfg).await;
    client.simple_query("SELECT 1").await.unwrap();
    let config = admin.simple_query("SHOW CONFIG").await.unwrap();
    assert!(
        row_value(&config, "cluster.main.listen").is_some()
            && row_value(&config, "cluster.other.listen").is_none(),
        "SHOW CONFIG shows the running clusters"
    );

    // The file agrees with the process again.
    std::fs::write(p.config_path(), &base).unwrap();
    let (summary, pending) = reload().await;
    assert!(summary.ends_with("needs a restart: nothing"), "{summary}");
    assert_eq!(pending, 0.0);
}
