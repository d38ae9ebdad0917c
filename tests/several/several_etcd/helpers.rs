//! Helpers shared by the etcd tests: instance configs, waiting for the
//! instances to settle and converge, the leader, and the promoted node.

use std::time::{Duration, Instant};

use fulcrum_testkit::{EtcdCluster, PgCluster, PgNode};

use crate::fleet::{gauge, wait_for, write_port, Instance};

pub(super) const LEASE: &str = "3s";

pub(super) fn etcd_lines(etcd: &EtcdCluster, extra: &[&str]) -> Vec<String> {
    let endpoints: Vec<String> = etcd
        .endpoints()
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect();
    let mut lines = vec![
        "topology = \"etcd\"".to_string(),
        format!("etcd_endpoints = [{}]", endpoints.join(", ")),
        format!("etcd_prefix = \"/fulcrum-test-{}\"", std::process::id()),
        format!("etcd_lease = \"{LEASE}\""),
        "health_interval = \"500ms\"".into(),
        "failover = \"promote\"".into(),
        "failover_timeout = \"2s\"".into(),
    ];
    lines.extend(extra.iter().map(|s| s.to_string()));
    lines
}

/// Every instance has seen the first published topology, and exactly one leads.
pub(super) async fn wait_settled(fleet: &[Instance]) {
    wait_for(
        "every instance to see epoch >= 1 and exactly one leader",
        Duration::from_secs(30),
        || {
            fleet
                .iter()
                .all(|i| gauge(i, "fulcrum_topology_epoch") >= 1.0)
                && fleet
                    .iter()
                    .map(|i| gauge(i, "fulcrum_topology_leader"))
                    .sum::<f64>()
                    == 1.0
        },
    )
    .await;
}

pub(super) fn leader(fleet: &[Instance]) -> usize {
    fleet
        .iter()
        .position(|i| gauge(i, "fulcrum_topology_leader") == 1.0)
        .expect("a leader")
}

pub(super) fn promoted(c: &PgCluster) -> Vec<&PgNode> {
    c.replicas()
        .iter()
        .filter(|r| r.is_in_recovery().is_ok_and(|rec| !rec))
        .collect()
}

/// Waits until every instance routes writes to `port`; each instance's
/// time from `since`.
pub(super) async fn converge(
    fleet: &[Instance],
    port: u16,
    since: Instant,
    timeout: Duration,
) -> Vec<Duration> {
    let mut times = vec![None; fleet.len()];
    let deadline = Instant::now() + timeout;
    while times.iter().any(Option::is_none) {
        for (i, inst) in fleet.iter().enumerate() {
            if times[i].is_none() && write_port(&inst.cfg).await == Some(port) {
                times[i] = Some(since.elapsed());
            }
        }
        assert!(
            Instant::now() < deadline,
            "not every instance routes writes to port {port} after {timeout:?}: {times:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    times.into_iter().map(Option::unwrap).collect()
}
