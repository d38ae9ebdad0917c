//! `topology = "patroni"` against a real Patroni (two PostgreSQL members,
//! a three-member etcd as its store): two Fulcrum instances follow a
//! switchover asked through Fulcrum's console (Patroni's `/switchover`)
//! and a killed Patroni leader; no acknowledged write is lost, so none
//! reached the old primary after Patroni demoted it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fulcrum_suite::{
    console_connect, serial, try_pg_connect, with_console, with_metrics, PgProxyConfig,
};
use fulcrum_testkit::{free_port, EtcdCluster, FulcrumProcess, PatroniCluster};
use tokio_postgres::Client;

use crate::fleet::{switchover_through_patroni, write_port};

struct Follower {
    cfg: PgProxyConfig,
    _process: FulcrumProcess,
    admin: u16,
}

fn followers(pat: &PatroniCluster, n: usize) -> Vec<Follower> {
    let addresses = pat.pg_addresses();
    let apis: Vec<String> = pat
        .api_endpoints()
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect();
    (0..n)
        .map(|_| {
            let mut cfg = PgProxyConfig::new(&addresses[0]).client_auth("md5");
            for a in &addresses[1..] {
                cfg = cfg.replica(a);
            }
            for l in [
                "health_user = \"postgres\"".to_string(),
                "health_password = \"\"".into(),
                "health_interval = \"500ms\"".into(),
                "pool_timeout = \"20s\"".into(),
                "failover = \"follow\"".into(),
                "topology = \"patroni\"".into(),
                format!("patroni_endpoints = [{}]", apis.join(", ")),
            ] {
                cfg = cfg.extra(&l);
            }
            let admin = free_port();
            let toml = with_metrics(&with_console(&cfg.to_toml(), admin), free_port());
            let process = FulcrumProcess::start(&toml).unwrap();
            Follower {
                cfg,
                _process: process,
                admin,
            }
        })
        .collect()
}

fn port_of(address: &str) -> u16 {
    address.rsplit_once(':').unwrap().1.parse().unwrap()
}

async fn converge(fleet: &[Follower], port: u16, timeout: Duration) -> Vec<Duration> {
    let start = Instant::now();
    let mut out = Vec::new();
    for f in fleet {
        loop {
            if write_port(&f.cfg).await == Some(port) {
                out.push(start.elapsed());
                break;
            }
            assert!(
                start.elapsed() < timeout,
                "instance not on port {port} after {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    out
}

/// Writers through each instance, every acknowledged id recorded, and
/// every write a server refused as read-only counted (a write that
/// reached a demoted primary).
fn writers(
    fleet: &[Follower],
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<u64>>>,
    read_only: Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    fleet
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let (cfg, stop, acked) = (f.cfg.clone(), stop.clone(), acked.clone());
            let read_only = read_only.clone();
            tokio::spawn(async move {
                let mut next = (i as u64 + 1) * 1_000_000;
                let mut client: Option<Client> = None;
                while !stop.load(Ordering::Relaxed) {
                    if client.as_ref().is_none_or(|c| c.is_closed()) {
                        client = try_pg_connect(&cfg).await.ok();
                        if client.is_none() {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    }
                    next += 1;
                    let sql = format!("INSERT INTO acked VALUES ({next})");
                    match client.as_ref().unwrap().simple_query(&sql).await {
                        Ok(_) => acked.lock().unwrap().push(next),
                        Err(e) => {
                            if e.code()
                                == Some(&tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION)
                            {
                                read_only.fetch_add(1, Ordering::Relaxed);
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await
                        }
                    }
                }
            })
        })
        .collect()
}

fn missing_on(pat: &PatroniCluster, member: usize, acked: &[u64]) -> usize {
    let rows = pat.psql(member, "SELECT id FROM acked").unwrap();
    let present: HashSet<u64> = rows.lines().filter_map(|l| l.trim().parse().ok()).collect();
    acked.iter().filter(|id| !present.contains(id)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_follow_a_patroni_switchover_and_a_killed_leader() {
    let _serial = serial().await;
    let etcd = tokio::task::block_in_place(|| EtcdCluster::start(3)).expect("etcd");
    let mut pat = tokio::task::block_in_place(|| PatroniCluster::start(&etcd, 2)).expect("patroni");
    let addresses = pat.pg_addresses();
    let first = pat.leader().expect("a leader");
    pat.psql(
        first,
        "CREATE TABLE acked (id bigint PRIMARY KEY); ALTER TABLE acked OWNER TO app",
    )
    .unwrap();
    let fleet = followers(&pat, 2);
    let times = converge(&fleet, port_of(&addresses[first]), Duration::from_secs(20)).await;
    eprintln!("both instances write to Patroni's leader after {times:?}");

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let read_only = Arc::new(AtomicU64::new(0));
    let load = writers(&fleet, stop.clone(), acked.clone(), read_only.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A switchover asked through Fulcrum's console goes to Patroni.
    let target = 1 - first;
    let console = console_connect(fleet[0].admin).await;
    let asked = Instant::now();
    switchover_through_patroni(&console, &addresses[target], "", String::new).await;
    assert_eq!(pat.leader(), Some(target), "Patroni switched over");
    // SHOW CLUSTERS names the source, its epoch and its leader.
    let rows = console.simple_query("SHOW CLUSTERS").await.unwrap();
    let row = rows
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        })
        .expect("a row");
    assert_eq!(row.get("topology"), Some("patroni"));
    assert_eq!(row.get("leader"), Some(format!("pg{target}").as_str()));
    assert!(
        row.get("epoch")
            .is_some_and(|e| e.parse::<u64>().is_ok_and(|e| e >= 2)),
        "epoch {:?}",
        row.get("epoch")
    );
    let times = converge(&fleet, port_of(&addresses[target]), Duration::from_secs(20)).await;
    eprintln!(
        "switchover: {:?} for the console's answer; instances on the new leader {times:?} after it",
        asked.elapsed()
    );
    // The console answers once its own instance routes writes there; the
    // other follows within one poll plus one probe (health_interval each),
    // with a second for this test's own polling.
    for t in &times {
        assert!(*t <= ONE_POLL_AND_PROBE, "{times:?}");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Everything acknowledged so far is on the new leader: nothing reached
    // the old primary after Patroni demoted it.
    let so_far = acked.lock().unwrap().clone();
    let missing = missing_on(&pat, target, &so_far);
    eprintln!(
        "switchover: {} writes acknowledged, {missing} missing on the new leader",
        so_far.len()
    );
    assert_eq!(
        missing, 0,
        "an acknowledged write went to the demoted primary"
    );

    // Patroni's leader killed: Patroni promotes the other, both follow.
    let killed = Instant::now();
    tokio::task::block_in_place(|| pat.kill_member(target));
    let next = tokio::task::block_in_place(|| pat.wait_new_leader(target, Duration::from_secs(60)))
        .expect("a new leader");
    let elected = killed.elapsed();
    let times = converge(&fleet, port_of(&addresses[next]), Duration::from_secs(20)).await;
    eprintln!(
        "leader killed: Patroni promoted after {elected:?}; instances on it {times:?} after that"
    );
    for t in &times {
        assert!(*t <= ONE_POLL_AND_PROBE, "{times:?}");
    }
    let converged = acked.lock().unwrap().len();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for w in load {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let after_kill = acked.len() - so_far.len();
    // What was acknowledged once both followed is all on the new leader.
    let missing = missing_on(&pat, next, &acked[converged..]);
    let refused = read_only.load(Ordering::Relaxed);
    eprintln!(
        "{} writes acknowledged through two instances, {after_kill} after the switchover check, {} after both followed the kill ({missing} missing on the new leader); writes refused as read-only (sent to a demoted primary): {refused}",
        acked.len(),
        acked.len() - converged
    );
    assert!(
        acked.len() > converged,
        "writes went on after the leader's kill"
    );
    assert_eq!(
        missing, 0,
        "acknowledged writes missing on Patroni's new leader"
    );
    assert_eq!(
        refused, 0,
        "a write reached a primary Patroni had demoted (refused as read-only)"
    );
}

/// One Patroni poll plus one probe (`health_interval = 500ms` each), and
/// a second for the test's own 50 ms polling and a busy machine.
const ONE_POLL_AND_PROBE: Duration = Duration::from_millis(2_000);
