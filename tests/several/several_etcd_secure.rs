//! `topology = "etcd"` with etcd's TLS and authentication on, as a
//! production etcd runs: an instance given the CA (`etcd_tls_ca`) and
//! root's credentials (`etcd_user`, `etcd_password`) leads and publishes
//! the topology over TLS; one with a wrong password never gets in (it is
//! cut off, leads nothing, and says why in its log).

use std::time::Duration;

use fulcrum_suite::serial;
use fulcrum_testkit::{EtcdCluster, PgCluster, TestCerts};

use crate::fleet::{gauge, start_instance, wait_for, write_port};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_tls_with_credentials() {
    let _serial = serial().await;
    let certs = TestCerts::new().expect("certificates");
    let c =
        tokio::task::block_in_place(|| PgCluster::builder().replicas(1).start()).expect("cluster");
    let etcd = tokio::task::block_in_place(|| EtcdCluster::start_tls(1, &certs.cert, &certs.key))
        .expect("etcd with TLS");
    etcd.enable_auth("root-secret").expect("etcd auth");
    let endpoints: Vec<String> = etcd
        .tls_endpoints()
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect();
    let lines = |password: &str| -> Vec<String> {
        vec![
            "topology = \"etcd\"".into(),
            format!("etcd_endpoints = [{}]", endpoints.join(", ")),
            format!("etcd_prefix = \"/fulcrum-secure-{}\"", std::process::id()),
            "etcd_lease = \"3s\"".into(),
            "etcd_user = \"root\"".into(),
            format!("etcd_password = \"{password}\""),
            format!("etcd_tls_ca = \"{}\"", certs.ca.display()),
            "health_interval = \"500ms\"".into(),
        ]
    };
    let good = start_instance(&c, "good", &lines("root-secret"));
    let bad = start_instance(&c, "bad", &lines("not-the-password"));
    wait_for(
        "the instance with the right credentials to lead and publish",
        Duration::from_secs(30),
        || {
            gauge(&good, "fulcrum_topology_leader") == 1.0
                && gauge(&good, "fulcrum_topology_epoch") >= 1.0
                && gauge(&good, "fulcrum_topology_cut_off") == 0.0
        },
    )
    .await;
    assert_eq!(
        write_port(&good.cfg).await,
        Some(c.primary().port()),
        "writes go to the published primary"
    );
    assert_eq!(gauge(&bad, "fulcrum_topology_leader"), 0.0);
    assert_eq!(gauge(&bad, "fulcrum_topology_cut_off"), 1.0);
    assert_eq!(
        gauge(&bad, "fulcrum_topology_contact_age_seconds"),
        -1.0,
        "never heard from etcd"
    );
    let log = bad.process.log_contents();
    assert!(
        log.contains("etcd refused etcd_user \"root\"") && log.contains("authentication failed"),
        "the refusal is in its log:\n{log}"
    );
}
