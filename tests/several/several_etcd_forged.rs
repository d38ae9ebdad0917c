//! `topology = "etcd"` against a forged topology: whoever can write the
//! etcd prefix puts `{"epoch": 2, "primary": <the replica>, "stage":
//! "promoting"}` under the topology key with `etcdctl`: plainly, with the
//! leader's lease and candidate revision copied into the value, and
//! attached to a lease of its own. No instance takes it: each says so in
//! its log, keeps routing writes to the real primary, nobody promotes the
//! replica, and the epoch stays. A real failover afterwards is still
//! published by the leader and followed by every instance.

use std::process::Command;
use std::time::Duration;

use fulcrum_suite::serial;
use fulcrum_testkit::{EtcdCluster, PgCluster};

use crate::fleet::{gauge, start_fleet, wait_for, write_port, Instance};

/// `etcdctl` (v3 API) against `etcd`; its standard output.
fn etcdctl(etcd: &EtcdCluster, args: &[&str]) -> String {
    let out = Command::new(fulcrum_testkit::tool("/usr/bin/etcdctl", "etcd-client"))
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", etcd.endpoints().join(",")))
        .args(args)
        .output()
        .expect("etcdctl runs");
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One field of `etcdctl -w fields` output.
fn field(fields: &str, name: &str) -> String {
    fields
        .lines()
        .find_map(|l| l.strip_prefix(&format!("\"{name}\" : ")))
        .unwrap_or_else(|| panic!("no {name} in {fields}"))
        .trim_matches('"')
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_topology_is_refused() {
    let _serial = serial().await;
    let c =
        tokio::task::block_in_place(|| PgCluster::builder().replicas(1).start()).expect("cluster");
    let etcd = tokio::task::block_in_place(|| EtcdCluster::start(1)).expect("etcd");
    let prefix = format!("/fulcrum-forged-{}", std::process::id());
    let endpoints: Vec<String> = etcd
        .endpoints()
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect();
    let lines = vec![
        "topology = \"etcd\"".to_string(),
        format!("etcd_endpoints = [{}]", endpoints.join(", ")),
        format!("etcd_prefix = \"{prefix}\""),
        "etcd_lease = \"3s\"".into(),
        "health_interval = \"500ms\"".into(),
        "failover = \"promote\"".into(),
        "failover_timeout = \"2s\"".into(),
    ];
    let fleet = start_fleet(&c, 2, &lines);
    let settled = |fleet: &[Instance]| {
        fleet
            .iter()
            .all(|i| gauge(i, "fulcrum_topology_epoch") == 1.0)
            && fleet
                .iter()
                .map(|i| gauge(i, "fulcrum_topology_leader"))
                .sum::<f64>()
                == 1.0
    };
    wait_for(
        "both instances on epoch 1, one leading",
        Duration::from_secs(30),
        || settled(&fleet),
    )
    .await;
    let primary = c.primary().port();
    for i in &fleet {
        assert_eq!(write_port(&i.cfg).await, Some(primary));
    }

    // The leader's candidate key: its lease and create revision.
    let leader = etcdctl(
        &etcd,
        &[
            "get",
            "--prefix",
            &format!("{prefix}/main/leader/"),
            "--sort-by=CREATE",
            "--order=ASCEND",
            "--limit=1",
            "-w",
            "fields",
        ],
    );
    let (lease, created, by) = (
        field(&leader, "Lease").parse::<i64>().unwrap(),
        field(&leader, "CreateRevision"),
        field(&leader, "Value"),
    );
    let replica = c.replicas()[0].addr();
    let forged = |extra: &str| {
        format!(
            r#"{{"epoch":2,"primary":"{replica}","replicas":[],"stage":"promoting","by":"{by}"{extra}}}"#
        )
    };
    let key = format!("{prefix}/main/topology");
    // A plain put.
    etcdctl(&etcd, &["put", &key, &forged("")]);
    // The leader's proof copied into the value.
    etcdctl(
        &etcd,
        &[
            "put",
            &key,
            &forged(&format!(
                r#","leader_lease":{lease},"leader_revision":{created}"#
            )),
        ],
    );
    // Attached to a lease of the writer's own.
    let granted = etcdctl(&etcd, &["lease", "grant", "60"]);
    let own = granted.split_whitespace().nth(1).expect("a lease id");
    etcdctl(
        &etcd,
        &[
            "put",
            &format!("--lease={own}"),
            &key,
            &forged(&format!(
                r#","leader_lease":{},"leader_revision":{created}"#,
                i64::from_str_radix(own, 16).unwrap()
            )),
        ],
    );

    wait_for(
        "both instances to log the refusals",
        Duration::from_secs(10),
        || {
            fleet.iter().all(|i| {
                i.process
                    .log_contents()
                    .matches("refusing a topology the leader did not write")
                    .count()
                    >= 3
            })
        },
    )
    .await;
    // Several health rounds (500 ms) and a lease (3 s) later, nothing moved.
    tokio::time::sleep(Duration::from_secs(4)).await;
    for (n, i) in fleet.iter().enumerate() {
        assert_eq!(
            write_port(&i.cfg).await,
            Some(primary),
            "f{} still writes to the real primary",
            n + 1
        );
        assert_eq!(gauge(i, "fulcrum_topology_epoch"), 1.0, "f{}", n + 1);
        assert_eq!(gauge(i, "fulcrum_failovers_total"), 0.0, "f{}", n + 1);
        let log = i.process.log_contents();
        for refusal in log.lines().filter(|l| l.contains("refusing a topology")) {
            eprintln!("f{}: {refusal}", n + 1);
        }
        assert!(
            log.contains("not written in the leader's transaction") && log.contains(&key),
            "f{}'s log names the key and why:\n{log}",
            n + 1
        );
    }
    assert!(
        c.replicas()[0].is_in_recovery().unwrap(),
        "the replica was not promoted"
    );
    assert!(
        c.primary().is_in_recovery().is_ok_and(|r| !r),
        "the primary was not fenced or demoted"
    );

    // The leader's own transaction still counts: a real failover is
    // published (over the forged key) and followed by both instances.
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    let new = c.replicas()[0].port();
    wait_for(
        "the replica promoted and both instances writing to it under epoch 2",
        Duration::from_secs(40),
        || {
            c.replicas()[0].is_in_recovery().is_ok_and(|r| !r)
                && fleet
                    .iter()
                    .all(|i| gauge(i, "fulcrum_topology_epoch") == 2.0)
        },
    )
    .await;
    for i in &fleet {
        let mut port = None;
        for _ in 0..100 {
            port = write_port(&i.cfg).await;
            if port == Some(new) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(port, Some(new), "writes follow the real failover");
    }
}
