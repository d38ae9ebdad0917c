//! The MariaDB health operations and the health loop on a real MariaDB
//! primary with two GTID replicas (the testkit's): roles and positions as the
//! probe reads them, and a lost primary replaced by the most advanced replica
//! with the other one re-pointed at it, checked by replicating a new write.
//!
//! Formerly crates/fulcrum-mysql/tests/maria_failover.rs (it drives that
//! crate's health operations directly, not the daemon). The test that kills
//! a primary takes its turn with the binary's other ones
//! (`fulcrum_suite::serial`).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fulcrum_cluster::{BackendState, ClusterView, Monitor, MonitorSettings, ServerOps};
use fulcrum_mysql::backend::health::MariaServerOps;
use fulcrum_pool::Router;
use fulcrum_suite::serial;
use fulcrum_testkit::MariaCluster;

fn config(c: &MariaCluster) -> fulcrum_config::Cluster {
    let mut toml = String::from(
        "[[cluster]]\nname = \"shop\"\nprotocol = \"mysql\"\nlisten = \"127.0.0.1:0\"\n\
         health_user = \"root\"\nhealth_password = \"\"\nhealth_interval = \"100ms\"\n\
         failover = \"promote\"\nfailover_timeout = \"300ms\"\n",
    );
    toml.push_str(&format!(
        "[[cluster.backend]]\naddress = \"{}\"\nrole = \"primary\"\n",
        c.primary().addr()
    ));
    for r in c.replicas() {
        toml.push_str(&format!(
            "[[cluster.backend]]\naddress = \"{}\"\nrole = \"replica\"\n",
            r.addr()
        ));
    }
    toml.push_str("[[cluster.user]]\nname = \"app\"\npassword = \"secret\"\n");
    fulcrum_config::parse(&toml, Path::new("test.toml"))
        .expect("valid config")
        .clusters
        .remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_reads_roles_and_gtid_positions() {
    let c = MariaCluster::builder()
        .replicas(2)
        .start()
        .expect("cluster");
    c.primary()
        .sql("CREATE TABLE t (id INT PRIMARY KEY); INSERT INTO t VALUES (1),(2),(3)")
        .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    let ops = MariaServerOps::new(&config(&c));
    let p = ops.probe(0).await.unwrap();
    assert!(p.writable);
    for b in [1, 2] {
        let r = ops.probe(b).await.unwrap();
        assert!(!r.writable, "replica {b} is read-only");
        assert_eq!(r.position, p.position, "replica {b} replayed everything");
        assert_eq!(r.received, p.position);
    }
    // A stopped SQL thread: received moves on, replayed does not.
    c.replicas()[0]
        .sql_db("mysql", "STOP SLAVE SQL_THREAD")
        .unwrap();
    c.primary().sql("INSERT INTO t VALUES (4),(5)").unwrap();
    let start = Instant::now();
    loop {
        let r = ops.probe(1).await.unwrap();
        if r.received > r.position {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "received never moved ahead: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.replicas()[0]
        .sql_db("mysql", "START SLAVE SQL_THREAD")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced_by_the_most_advanced_replica() {
    let _serial = serial().await;
    let c = MariaCluster::builder()
        .replicas(2)
        .start()
        .expect("cluster");
    c.primary()
        .sql("CREATE TABLE t (id INT PRIMARY KEY)")
        .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    // replica1 stops replicating: replica2 ends up ahead.
    c.replicas()[0].sql_db("mysql", "STOP SLAVE").unwrap();
    c.primary().sql("INSERT INTO t VALUES (1),(2),(3)").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.replicas()[1]
        .sql("SELECT COUNT(*) FROM t")
        .unwrap()
        .trim()
        != "3"
    {
        assert!(Instant::now() < deadline, "replica2 never caught up");
        std::thread::sleep(Duration::from_millis(50));
    }

    let cfg = config(&c);
    let router = Arc::new(Router::new(0, 3, &[1, 2], false));
    let view = Arc::new(ClusterView::new(
        &cfg.backends
            .iter()
            .map(|b| b.address.clone())
            .collect::<Vec<_>>(),
    ));
    let settings = MonitorSettings {
        cluster: cfg.name.clone(),
        health: cfg.health.clone(),
        roles: cfg.backends.iter().map(|b| b.role).collect(),
        replay: false,
        topology: fulcrum_config::Topology::Probe,
    };
    let ops = Arc::new(MariaServerOps::new(&cfg));
    let mut monitor = Monitor::new(settings, ops, router.clone(), view.clone());
    monitor.round().await;
    assert_eq!(router.primary(), Some(0));

    c.primary().stop_immediate().unwrap();
    let killed = Instant::now();
    while router.primary() != Some(2) {
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "no promotion: {:?}",
            view.backends()
        );
        monitor.round().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "MariaDB: replica2 promoted {:?} after the kill",
        killed.elapsed()
    );
    assert!(
        !c.replicas()[1].read_only().unwrap(),
        "promoted replica takes writes"
    );
    assert_eq!(view.failovers(), 1);
    assert_eq!(view.backends()[0].state, BackendState::Down);

    // replica1 follows the new primary: a new write reaches it.
    c.replicas()[1].sql("INSERT INTO t VALUES (4)").unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while c.replicas()[0]
        .sql("SELECT COUNT(*) FROM t")
        .unwrap()
        .trim()
        != "4"
    {
        assert!(
            Instant::now() < deadline,
            "replica1 does not follow the new primary: {:?}",
            c.replicas()[0].slave_status()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
