//! `topology = "patroni"` with Patroni's REST API as production runs it:
//! `https://` (its `restapi.certfile`) and basic authentication on unsafe
//! endpoints (`restapi.authentication`). An instance given the CA
//! (`patroni_tls_ca`) and the credentials follows Patroni and its
//! SWITCHOVER goes through; one with a wrong password still follows
//! (reading `/cluster` needs no password) but its SWITCHOVER is refused
//! with Patroni's 401, in the console's answer and in its log, and
//! nothing moves.

use std::time::{Duration, Instant};

use fulcrum_suite::{console_connect, serial, with_console, with_metrics, PgProxyConfig};
use fulcrum_testkit::{free_port, EtcdCluster, FulcrumProcess, PatroniCluster, TestCerts};

use crate::fleet::{switchover_through_patroni, write_port};

struct Follower {
    cfg: PgProxyConfig,
    process: FulcrumProcess,
    admin: u16,
}

fn follower(pat: &PatroniCluster, certs: &TestCerts, password: &str) -> Follower {
    let addresses = pat.pg_addresses();
    let apis: Vec<String> = pat
        .api_endpoints()
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect();
    assert!(apis.iter().all(|a| a.starts_with("\"https://")), "{apis:?}");
    let mut cfg = PgProxyConfig::new(&addresses[0]).client_auth("md5");
    for a in &addresses[1..] {
        cfg = cfg.replica(a);
    }
    for l in [
        "health_user = \"postgres\"".to_string(),
        "health_password = \"\"".into(),
        "health_interval = \"500ms\"".into(),
        "failover = \"follow\"".into(),
        "topology = \"patroni\"".into(),
        format!("patroni_endpoints = [{}]", apis.join(", ")),
        format!("patroni_tls_ca = \"{}\"", certs.ca.display()),
        "patroni_user = \"patroni\"".into(),
        format!("patroni_password = \"{password}\""),
    ] {
        cfg = cfg.extra(&l);
    }
    let admin = free_port();
    let toml = with_metrics(&with_console(&cfg.to_toml(), admin), free_port());
    let process = FulcrumProcess::start(&toml).unwrap();
    Follower {
        cfg,
        process,
        admin,
    }
}

fn port_of(address: &str) -> u16 {
    address.rsplit_once(':').unwrap().1.parse().unwrap()
}

async fn follows(f: &Follower, port: u16, timeout: Duration) -> Duration {
    let start = Instant::now();
    while write_port(&f.cfg).await != Some(port) {
        assert!(
            start.elapsed() < timeout,
            "instance not on port {port} after {timeout:?}:\n{}",
            f.process.log_contents()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patroni_over_https_with_basic_authentication() {
    let _serial = serial().await;
    let certs = TestCerts::new().expect("certificates");
    let etcd = tokio::task::block_in_place(|| EtcdCluster::start(1)).expect("etcd");
    let pat = tokio::task::block_in_place(|| {
        PatroniCluster::start_secure(&etcd, 2, &certs, "patroni", "rest-secret")
    })
    .expect("patroni with TLS and authentication");
    let addresses = pat.pg_addresses();
    let first = pat.leader().expect("a leader");
    let target = 1 - first;
    let good = follower(&pat, &certs, "rest-secret");
    let bad = follower(&pat, &certs, "not-the-password");
    for f in [&good, &bad] {
        let took = follows(f, port_of(&addresses[first]), Duration::from_secs(20)).await;
        eprintln!("on Patroni's leader over https after {took:?}");
    }

    // Wrong credentials: Patroni's 401, in the answer and in the log.
    let console = console_connect(bad.admin).await;
    let e = console
        .simple_query(&format!("SWITCHOVER main TO {}", addresses[target]))
        .await
        .expect_err("a wrong password cannot switch over");
    let said = e
        .as_db_error()
        .map_or_else(|| e.to_string(), |d| d.message().to_owned());
    eprintln!("wrong password: {said}");
    assert!(said.contains("HTTP 401"), "{said}");
    let log = bad.process.log_contents();
    assert!(
        log.contains("Patroni refused the switchover")
            && log
                .contains("Patroni refused patroni_user \"patroni\" for the switchover (HTTP 401)"),
        "the refusal is in its log:\n{log}"
    );
    assert_eq!(pat.leader(), Some(first), "nothing moved");

    // The right credentials: Patroni switches over, both follow.
    let console = console_connect(good.admin).await;
    let log = || good.process.log_contents();
    switchover_through_patroni(&console, &addresses[target], " over https", log).await;
    assert_eq!(pat.leader(), Some(target), "Patroni switched over");
    for f in [&good, &bad] {
        let took = follows(f, port_of(&addresses[target]), Duration::from_secs(20)).await;
        eprintln!("on the new leader {took:?} after the switchover");
    }
}
