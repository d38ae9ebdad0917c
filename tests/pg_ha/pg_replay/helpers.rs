//! Helpers shared by the replay tests: configs, a synchronous cluster, and
//! the node that was promoted.

use std::time::{Duration, Instant};

use fulcrum_suite::{with_metrics, PgProxyConfig};
use fulcrum_testkit::{PgCluster, PgNode};

/// Fulcrum in front of `c` with replay on and automatic promotion.
pub(super) fn config(c: &PgCluster, metrics_port: u16) -> (PgProxyConfig, String) {
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

pub(super) fn config_with(
    c: &PgCluster,
    metrics_port: u16,
    keys: &[&str],
) -> (PgProxyConfig, String) {
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
pub(super) fn synchronous_cluster(replicas: usize) -> PgCluster {
    tokio::task::block_in_place(|| {
        PgCluster::builder()
            .replicas(replicas)
            .synchronous_standby(true)
            .start()
    })
    .expect("cluster")
}

/// The replica promoted after the kill (waits for it).
pub(super) fn promoted(c: &PgCluster) -> &PgNode {
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
