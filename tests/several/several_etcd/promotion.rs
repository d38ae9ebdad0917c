//! Promotion coordinated through etcd: three instances promote once and lose
//! no acknowledged transaction, and a leader killed mid-failover is replaced
//! and the promotion finished once.

use std::time::{Duration, Instant};

use fulcrum_suite::serial;
use fulcrum_testkit::{EtcdCluster, PgCluster, Signal, APP_DB, APP_PASSWORD, APP_USER};

use crate::fleet::{gauge, start_fleet, wait_for};

use super::helpers::{converge, etcd_lines, leader, promoted, wait_settled};

fn synchronous_cluster(replicas: usize) -> PgCluster {
    let c = tokio::task::block_in_place(|| {
        PgCluster::builder()
            .replicas(replicas)
            .synchronous_standby(true)
            .start()
    })
    .expect("cluster");
    // The harness's servers run with synchronous_commit = off.
    c.primary()
        .sql_script(
            "postgres",
            "ALTER SYSTEM SET synchronous_commit = 'on';\nSELECT pg_reload_conf();\n",
        )
        .unwrap();
    c
}

fn processed(stdout: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
        .and_then(|n| n.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_promote_once_and_lose_no_acknowledged_transaction() {
    let _serial = serial().await;
    let c = synchronous_cluster(2);
    let etcd = tokio::task::block_in_place(|| EtcdCluster::start(3)).expect("etcd");
    let fleet = start_fleet(
        &c,
        3,
        &etcd_lines(
            &etcd,
            &["transaction_replay = true", "pool_timeout = \"15s\""],
        ),
    );
    wait_settled(&fleet).await;
    let via = fleet[0].cfg.listen.clone();
    tokio::task::block_in_place(|| {
        fulcrum_testkit::pgbench_init(&via, APP_USER, APP_PASSWORD, APP_DB, 1)
    })
    .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();

    let benches: Vec<_> = fleet
        .iter()
        .map(|i| {
            let port = i.cfg.listen.rsplit_once(':').unwrap().1.to_owned();
            std::thread::spawn(move || {
                fulcrum_testkit::pgbench(
                    &[
                        "-h",
                        "127.0.0.1",
                        "-p",
                        &port,
                        "-U",
                        APP_USER,
                        "-M",
                        "prepared",
                        "-c",
                        "2",
                        "-T",
                        "12",
                        "-n",
                        APP_DB,
                    ],
                    Some(APP_PASSWORD),
                )
                .unwrap()
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    let took = wait_for("a promotion", Duration::from_secs(30), || {
        !promoted(&c).is_empty()
    })
    .await;
    let promoted_at = Instant::now();
    let new = promoted(&c)[0].port();
    let times = converge(&fleet, new, promoted_at, Duration::from_secs(10)).await;
    eprintln!("promotion {took:?} after the kill; instances route writes there {times:?} after it");
    for t in &times {
        assert!(
            *t <= Duration::from_millis(500) + Duration::from_secs(2),
            "convergence {times:?}"
        );
    }

    let mut acknowledged = 0;
    for (i, b) in benches.into_iter().enumerate() {
        let out = tokio::task::block_in_place(|| b.join()).unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let n = processed(&stdout);
        eprintln!(
            "instance f{}: {n} transactions acknowledged; errors: {:?}",
            i + 1,
            stderr
                .lines()
                .filter(|l| l.contains("ERROR") || l.contains("aborted"))
                .collect::<Vec<_>>()
        );
        assert!(
            out.status.success(),
            "pgbench through f{} ended with {}: no client may abort across the failover\n{stderr}",
            i + 1,
            out.status
        );
        acknowledged += n;
    }
    let now_promoted = promoted(&c);
    assert_eq!(now_promoted.len(), 1, "exactly one replica promoted");
    let history: u64 = now_promoted[0]
        .sql_db(APP_DB, "SELECT count(*) FROM pgbench_history")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let failovers: f64 = fleet
        .iter()
        .map(|i| gauge(i, "fulcrum_failovers_total"))
        .sum();
    eprintln!("{acknowledged} transactions acknowledged through three instances, {history} history rows on the new primary; promotions by the fleet: {failovers}");
    assert!(acknowledged > 0);
    assert!(
        history >= acknowledged,
        "acknowledged transactions lost: {acknowledged} acknowledged, {history} on the new primary"
    );
    assert_eq!(failovers, 1.0, "exactly one promotion across the fleet");
    let epochs: Vec<f64> = fleet
        .iter()
        .map(|i| gauge(i, "fulcrum_topology_epoch"))
        .collect();
    assert!(
        epochs.iter().all(|e| *e == 2.0),
        "one new epoch, seen by all: {epochs:?}"
    );
}

/// One POST to etcd's JSON gateway, on the first member that answers:
/// the response's body.
fn gateway_post(etcd: &EtcdCluster, path: &str, body: &str) -> Option<String> {
    use std::io::{Read, Write};
    for e in etcd.endpoints() {
        let Ok(mut s) = std::net::TcpStream::connect(&e) else {
            continue;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: {e}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        if s.write_all(req.as_bytes()).is_err() {
            continue;
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        return Some(out);
    }
    None
}

/// The first base64 `"value"` in a gateway answer, decoded.
fn value_of(answer: &str) -> Option<String> {
    let value = answer.split("\"value\":\"").nth(1)?.split('"').next()?;
    String::from_utf8(base64_decode(value)).ok()
}

/// Reads the published topology straight from etcd's gateway.
fn published_stage(etcd: &EtcdCluster, prefix: &str) -> Option<String> {
    let key = base64_encode(format!("{prefix}/main/topology").as_bytes());
    value_of(&gateway_post(
        etcd,
        "/v3/kv/range",
        &format!("{{\"key\":\"{key}\"}}"),
    )?)
}

/// The leader as etcd's election API tells it (`etcdctl elect --listen`
/// reads the same): the instance name its key holds.
fn election_leader(etcd: &EtcdCluster, prefix: &str) -> Option<String> {
    let name = base64_encode(format!("{prefix}/main/leader").as_bytes());
    value_of(&gateway_post(
        etcd,
        "/v3/election/leader",
        &format!("{{\"name\":\"{name}\"}}"),
    )?)
}

fn base64_encode(bytes: &[u8]) -> String {
    const T: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn base64_decode(text: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let clean: Vec<u8> = text.bytes().filter(|c| *c != b'=').collect();
    let mut out = Vec::new();
    for chunk in clean.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= u32::from(val(*c)) << (18 - 6 * i);
        }
        for i in 0..chunk.len().saturating_sub(1) {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_mid_failover_is_replaced_and_the_promotion_finished_once() {
    let _serial = serial().await;
    let c =
        tokio::task::block_in_place(|| PgCluster::builder().replicas(2).start()).expect("cluster");
    let etcd = tokio::task::block_in_place(|| EtcdCluster::start(3)).expect("etcd");
    let lines = etcd_lines(&etcd, &[]);
    let prefix = lines[2].split('"').nth(1).unwrap().to_owned();
    let mut fleet = start_fleet(&c, 3, &lines);
    wait_settled(&fleet).await;
    let lead = leader(&fleet);
    // The lead is etcd's election API's: its leader call names it.
    assert_eq!(
        tokio::task::block_in_place(|| election_leader(&etcd, &prefix)),
        Some(format!("f{}", lead + 1)),
        "etcd's election API names the instance that leads"
    );
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    // The leader publishes "promoting" before it promotes: kill it then.
    let mut caught = false;
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let stage =
            tokio::task::block_in_place(|| published_stage(&etcd, &prefix)).unwrap_or_default();
        if stage.contains("\"promoting\"") {
            fleet[lead].process.signal(Signal::Kill).unwrap();
            caught = true;
            eprintln!("killed the leader f{} at {stage}", lead + 1);
            break;
        }
        if stage.contains("\"epoch\":2") {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        caught,
        "the leader's promotion was not seen in its promoting stage"
    );
    let dead = fleet.remove(lead);
    let took = wait_for("another leader", Duration::from_secs(15), || {
        fleet
            .iter()
            .map(|i| gauge(i, "fulcrum_topology_leader"))
            .sum::<f64>()
            == 1.0
    })
    .await;
    let done = wait_for(
        "the promotion to be published ready",
        Duration::from_secs(20),
        || {
            published_stage(&etcd, &prefix)
                .is_some_and(|s| s.contains("\"ready\"") && s.contains("\"epoch\":2"))
        },
    )
    .await;
    let p = promoted(&c);
    assert_eq!(p.len(), 1, "exactly one replica promoted");
    let new_leader = tokio::task::block_in_place(|| election_leader(&etcd, &prefix));
    assert!(
        new_leader
            .as_ref()
            .is_some_and(|l| *l != format!("f{}", lead + 1)),
        "etcd's election API names a surviving instance: {new_leader:?}"
    );
    let times = converge(&fleet, p[0].port(), Instant::now(), Duration::from_secs(10)).await;
    eprintln!("a new leader {took:?} after the kill, the promotion ready {done:?} later, writes on the new primary after {times:?}");
    let finisher: Vec<String> = fleet
        .iter()
        .filter(|i| {
            i.process
                .log_contents()
                .contains("finishing a published promotion")
        })
        .map(|i| i.cfg.listen.clone())
        .collect();
    eprintln!(
        "the promotion was finished by the new leader (it ran pg_promote again): {}",
        !finisher.is_empty()
    );
    let stage = published_stage(&etcd, &prefix).unwrap();
    assert!(
        stage.contains(&format!("127.0.0.1:{}", p[0].port())),
        "{stage}"
    );
    // The dead leader re-pointed nobody: the new leader does it from the
    // published duties, so the other replica streams from the new primary
    // and nothing is left pending.
    let new_port = p[0].port();
    let other = c
        .replicas()
        .iter()
        .find(|r| r.port() != new_port)
        .expect("the other replica");
    let repointed = wait_for(
        "the other replica to stream from the new primary",
        Duration::from_secs(20),
        || {
            other
                .sql("SELECT sender_port FROM pg_stat_wal_receiver WHERE status = 'streaming'")
                .is_ok_and(|port| port.trim() == new_port.to_string())
        },
    )
    .await;
    let stage = wait_for(
        "the failover's duties to be published done",
        Duration::from_secs(10),
        || published_stage(&etcd, &prefix).is_some_and(|s| !s.contains("pending")),
    )
    .await;
    eprintln!("the other replica streams from the new primary {repointed:?} after that; duties published done {stage:?} later");
    let on_new: u64 = p[0]
        .sql("SELECT count(*) FROM pg_stat_replication")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(on_new, 1, "the new primary has the other replica streaming");
    assert_eq!(promoted(&c).len(), 1, "still exactly one replica promoted");
    drop(dead);
}
