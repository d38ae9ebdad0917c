//! `topology = "etcd"` on MariaDB (GTID replication, semi-synchronous):
//! three instances under sysbench oltp_write_only and a counted writer
//! through each, the primary killed: one promotion, every instance writes
//! to the new primary, no acknowledged write lost, no table half-written.

use std::collections::HashSet;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fulcrum_suite::{family_sum, maria_toml, serial, try_maria_connect, try_scrape, with_metrics};
use fulcrum_testkit::{
    free_port, EtcdCluster, FulcrumProcess, MariaCluster, APP_DB, APP_PASSWORD, APP_USER,
};
use mysql_async::prelude::Queryable;

fn gauge(metrics: u16, family: &str) -> f64 {
    try_scrape(metrics).map_or(0.0, |t| family_sum(&t, family, &[]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_three_instances_promote_once_under_sysbench_write_only() {
    let _serial = serial().await;
    let c = tokio::task::block_in_place(|| {
        MariaCluster::builder()
            .replicas(1)
            .setting("rpl-semi-sync-master-enabled", "1")
            .setting("rpl-semi-sync-slave-enabled", "1")
            .setting("rpl-semi-sync-master-wait-point", "AFTER_SYNC")
            .setting("rpl-semi-sync-master-timeout", "60000")
            // A node with no replica connected does not wait: the primary
            // while its bootstrap runs (before the replica attaches), the
            // replica applying it (log-slave-updates, semi-sync master
            // too), the promoted replica after the kill. Otherwise each
            // waits the whole timeout on its first transaction, and the
            // replica has not caught up when the harness stops waiting
            // (seen on this machine with the previous commit too).
            .setting("rpl-semi-sync-master-wait-no-slave", "OFF")
            .start()
    })
    .expect("cluster");
    c.primary()
        .sql_db(APP_DB, "CREATE TABLE acked (id BIGINT PRIMARY KEY)")
        .unwrap();
    let etcd = tokio::task::block_in_place(|| EtcdCluster::start(3)).expect("etcd");
    let endpoints: Vec<String> = etcd
        .endpoints()
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect();
    let fleet: Vec<(u16, u16, FulcrumProcess)> = (1..=3)
        .map(|i| {
            let (port, metrics) = (free_port(), free_port());
            let extra = format!(
                "pool_timeout = \"10s\"\nhealth_interval = \"500ms\"\nfailover = \"promote\"\nfailover_timeout = \"2s\"\n\
                 transaction_replay = true\ntopology = \"etcd\"\netcd_endpoints = [{}]\netcd_lease = \"3s\"\n\
                 etcd_prefix = \"/fulcrum-maria-{}\"\ninstance_name = \"m{i}\"",
                endpoints.join(", "),
                std::process::id()
            );
            let p = FulcrumProcess::start(&with_metrics(&maria_toml(&c, port, &extra), metrics)).unwrap();
            (port, metrics, p)
        })
        .collect();
    crate::fleet::wait_for(
        "one leader and epoch 1 everywhere",
        Duration::from_secs(30),
        || {
            fleet
                .iter()
                .all(|(_, m, _)| gauge(*m, "fulcrum_topology_epoch") >= 1.0)
                && fleet
                    .iter()
                    .map(|(_, m, _)| gauge(*m, "fulcrum_topology_leader"))
                    .sum::<f64>()
                    == 1.0
        },
    )
    .await;
    let base = |port: u16| {
        vec![
            "--db-driver=mysql".to_string(),
            "--mysql-host=127.0.0.1".into(),
            format!("--mysql-port={port}"),
            format!("--mysql-user={APP_USER}"),
            format!("--mysql-password={APP_PASSWORD}"),
            format!("--mysql-db={APP_DB}"),
            "--tables=2".into(),
            "--table-size=10000".into(),
        ]
    };
    let sysbench = fulcrum_testkit::tool("/usr/bin/sysbench", "sysbench");
    let prepare = tokio::task::block_in_place(|| {
        Command::new(&sysbench)
            .args(base(fleet[0].0))
            .args(["oltp_write_only", "prepare"])
            .output()
            .unwrap()
    });
    assert!(prepare.status.success(), "{prepare:?}");
    c.wait_replicas_caught_up(Duration::from_secs(60)).unwrap();
    let run = {
        let (sysbench, args) = (sysbench.clone(), base(fleet[0].0));
        std::thread::spawn(move || {
            Command::new(sysbench)
                .args(args)
                .args([
                    "oltp_write_only",
                    "run",
                    "--threads=2",
                    "--time=12",
                    "--rand-type=uniform",
                    "--mysql-ignore-errors=1213,1020,1205,1927,2013,2006",
                ])
                .output()
                .unwrap()
        })
    };
    // A counted writer through each instance.
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::<(usize, u64, Instant)>::new()));
    let writers: Vec<_> = fleet
        .iter()
        .enumerate()
        .map(|(i, (port, _, _))| {
            let (stop, acked, port) = (stop.clone(), acked.clone(), *port);
            tokio::spawn(async move {
                let mut next = (i as u64 + 1) * 1_000_000;
                let mut conn = None;
                while !stop.load(Ordering::Relaxed) {
                    if conn.is_none() {
                        conn = try_maria_connect(port).await.ok();
                        if conn.is_none() {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    }
                    next += 1;
                    match conn
                        .as_mut()
                        .unwrap()
                        .query_drop(format!("INSERT INTO acked VALUES ({next})"))
                        .await
                    {
                        Ok(()) => acked.lock().unwrap().push((i, next, Instant::now())),
                        Err(e) => {
                            if !matches!(e, mysql_async::Error::Server(_)) {
                                conn = None;
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    let killed = Instant::now();
    let new = &c.replicas()[0];
    let took = crate::fleet::wait_for("a promotion", Duration::from_secs(30), || {
        new.read_only().is_ok_and(|r| !r)
    })
    .await;
    let promoted_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let out = tokio::task::block_in_place(|| run.join()).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "sysbench: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let acked = acked.lock().unwrap().clone();
    let resumed: Vec<Option<Duration>> = (0..3)
        .map(|i| {
            acked
                .iter()
                .filter(|(w, _, at)| *w == i && *at > promoted_at)
                .map(|(_, _, at)| at.duration_since(promoted_at))
                .min()
        })
        .collect();
    let rows = new.sql_db(APP_DB, "SELECT id FROM acked").unwrap();
    let present: HashSet<u64> = rows.lines().filter_map(|l| l.trim().parse().ok()).collect();
    let missing = acked
        .iter()
        .filter(|(_, id, _)| !present.contains(id))
        .count();
    let failovers: f64 = fleet
        .iter()
        .map(|(_, m, _)| gauge(*m, "fulcrum_failovers_total"))
        .sum();
    eprintln!(
        "MariaDB: promoted {took:?} after the kill ({:?}); writes on the new primary per instance after {resumed:?}; \
         {} writes acknowledged, {missing} missing; promotions by the fleet: {failovers}",
        killed.elapsed(),
        acked.len()
    );
    assert_eq!(failovers, 1.0, "exactly one promotion");
    assert_eq!(missing, 0, "acknowledged writes lost");
    for (i, r) in resumed.iter().enumerate() {
        let r = r.unwrap_or_else(|| panic!("instance m{} never wrote to the new primary", i + 1));
        assert!(
            r <= Duration::from_millis(2500),
            "instance m{}: {r:?}",
            i + 1
        );
    }
    for t in ["sbtest1", "sbtest2"] {
        let n = new
            .sql_db(APP_DB, &format!("SELECT count(*) FROM {t}"))
            .unwrap();
        assert_eq!(n.trim(), "10000", "{t} whole on the new primary");
    }
}
