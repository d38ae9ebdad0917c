//! `topology = "etcd"` against a real three-member etcd: three instances
//! fail over once under pgbench TPC-B and lose no acknowledged
//! transaction; a leader killed in the middle of a failover is replaced
//! and the promotion finished under the same epoch; an instance frozen
//! past its lease never writes to the old primary; with etcd stopped,
//! reads go on, writes hold and nothing is promoted, and the instances
//! converge once etcd is back.

use std::time::{Duration, Instant};

use fulcrum_suite::{serial, try_pg_connect};
use fulcrum_testkit::{EtcdCluster, PgCluster, PgNode, Signal, APP_DB, APP_PASSWORD, APP_USER};

use crate::fleet::{gauge, start_fleet, start_instance, wait_for, write_port, Instance};

const LEASE: &str = "3s";

fn etcd_lines(etcd: &EtcdCluster, extra: &[&str]) -> Vec<String> {
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
async fn wait_settled(fleet: &[Instance]) {
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

fn leader(fleet: &[Instance]) -> usize {
    fleet
        .iter()
        .position(|i| gauge(i, "fulcrum_topology_leader") == 1.0)
        .expect("a leader")
}

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

fn promoted(c: &PgCluster) -> Vec<&PgNode> {
    c.replicas()
        .iter()
        .filter(|r| r.is_in_recovery().is_ok_and(|rec| !rec))
        .collect()
}

fn processed(stdout: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
        .and_then(|n| n.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Waits until every instance routes writes to `port`; each instance's
/// time from `since`.
async fn converge(
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_frozen_past_its_lease_never_writes_to_the_old_primary() {
    let _serial = serial().await;
    let c =
        tokio::task::block_in_place(|| PgCluster::builder().replicas(1).start()).expect("cluster");
    c.primary()
        .sql_db(
            APP_DB,
            "CREATE TABLE marks (who text, at timestamptz DEFAULT now())",
        )
        .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    let etcd = tokio::task::block_in_place(|| EtcdCluster::start(3)).expect("etcd");
    let mut fleet = start_fleet(&c, 2, &etcd_lines(&etcd, &["pool_timeout = \"5s\""]));
    wait_settled(&fleet).await;
    // A third instance keeps writing to the last published primary while
    // cut off (on_coordinator_loss = "last_known"), as long as its own
    // probe vouches for it.
    fleet.push(start_instance(
        &c,
        "f3",
        &etcd_lines(
            &etcd,
            &[
                "pool_timeout = \"5s\"",
                "on_coordinator_loss = \"last_known\"",
            ],
        ),
    ));
    wait_settled(&fleet).await;
    // Frozen: the leader (it believes it leads when it resumes) and the
    // last_known instance; the third instance carries on.
    let lead = leader(&fleet);
    let frozen: Vec<&Instance> = [lead, 2].iter().map(|&i| &fleet[i]).collect();
    let other = &fleet[if lead == 0 { 1 } else { 0 }];
    // A session open on each before they freeze.
    let mut sessions = Vec::new();
    for f in &frozen {
        let s = try_pg_connect(&f.cfg).await.unwrap();
        s.batch_execute("INSERT INTO marks VALUES ('before')")
            .await
            .unwrap();
        sessions.push(s);
    }
    for f in &frozen {
        f.process.signal(Signal::Stop).unwrap();
    }
    let frozen_at = Instant::now();
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    let replica = &c.replicas()[0];
    wait_for(
        "the other instance to promote",
        Duration::from_secs(30),
        || replica.is_in_recovery().is_ok_and(|r| !r),
    )
    .await;
    converge(
        std::slice::from_ref(other),
        replica.port(),
        Instant::now(),
        Duration::from_secs(10),
    )
    .await;
    // The old primary comes back writable on its old timeline: the split
    // brain a frozen instance could write into.
    tokio::task::block_in_place(|| c.primary().start()).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lease = Duration::from_secs(LEASE.trim_end_matches('s').parse().unwrap());
    let frozen_for = frozen_at.elapsed();
    assert!(frozen_for > lease, "frozen {frozen_for:?}, past the lease");
    for f in &frozen {
        f.process.signal(Signal::Cont).unwrap();
    }
    let resumed = Instant::now();
    let mut ok = 0;
    let mut errors = 0;
    while resumed.elapsed() < Duration::from_secs(8) {
        for (f, session) in frozen.iter().zip(&sessions) {
            match tokio::time::timeout(
                Duration::from_secs(6),
                session.batch_execute("INSERT INTO marks VALUES ('after')"),
            )
            .await
            {
                Ok(Ok(())) => ok += 1,
                _ => errors += 1,
            }
            if let Ok(fresh) = try_pg_connect(&f.cfg).await {
                match fresh
                    .batch_execute("INSERT INTO marks VALUES ('after')")
                    .await
                {
                    Ok(()) => ok += 1,
                    Err(_) => errors += 1,
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let on_old: u64 = c
        .primary()
        .sql_db(APP_DB, "SELECT count(*) FROM marks WHERE who = 'after'")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let on_new: u64 = replica
        .sql_db(APP_DB, "SELECT count(*) FROM marks WHERE who = 'after'")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    eprintln!("frozen {frozen_for:?} (lease {lease:?}): the leader f{} (hold) and f3 (last_known); after resuming: {ok} writes acknowledged, {errors} refused; {on_new} on the new primary, {on_old} on the old one", lead + 1);
    if on_old > 0 {
        for f in &frozen {
            for l in f
                .process
                .log_contents()
                .lines()
                .filter(|l| !l.contains("DEBUG"))
            {
                eprintln!("{}: {l}", f.cfg.listen);
            }
        }
    }
    assert_eq!(on_old, 0, "a frozen instance wrote to the old primary");
    assert!(
        on_new > 0 && on_new as usize == ok,
        "acknowledged writes are on the new primary"
    );
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_etcd_stopped_reads_go_on_writes_hold_and_nothing_is_promoted() {
    let _serial = serial().await;
    let c =
        tokio::task::block_in_place(|| PgCluster::builder().replicas(1).start()).expect("cluster");
    c.primary()
        .sql_db(APP_DB, "CREATE TABLE t (id int)")
        .unwrap();
    c.wait_replicas_caught_up(Duration::from_secs(30)).unwrap();
    let mut etcd = tokio::task::block_in_place(|| EtcdCluster::start(3)).expect("etcd");
    let fleet = start_fleet(&c, 2, &etcd_lines(&etcd, &["pool_timeout = \"2s\""]));
    wait_settled(&fleet).await;
    tokio::task::block_in_place(|| etcd.stop_all());
    let stopped = Instant::now();
    wait_for(
        "both instances to count themselves cut off",
        Duration::from_secs(15),
        || {
            fleet
                .iter()
                .all(|i| gauge(i, "fulcrum_topology_cut_off") == 1.0)
        },
    )
    .await;
    eprintln!("cut off {:?} after etcd stopped", stopped.elapsed());
    for i in &fleet {
        let client = try_pg_connect(&i.cfg).await.unwrap();
        client
            .simple_query("SELECT count(*) FROM t")
            .await
            .expect("reads go on");
        let started = Instant::now();
        let err = client
            .batch_execute("INSERT INTO t VALUES (1)")
            .await
            .unwrap_err();
        eprintln!("a write held {:?}, then: {err}", started.elapsed());
        assert!(
            started.elapsed() >= Duration::from_secs(2),
            "held up to pool_timeout"
        );
    }
    tokio::task::block_in_place(|| c.primary().stop_immediate()).unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        c.replicas()[0].is_in_recovery().unwrap(),
        "nothing promoted while cut off"
    );
    tokio::task::block_in_place(|| etcd.start_all()).unwrap();
    let back = Instant::now();
    let replica = &c.replicas()[0];
    wait_for(
        "one promotion once etcd is back",
        Duration::from_secs(30),
        || replica.is_in_recovery().is_ok_and(|r| !r),
    )
    .await;
    let times = converge(&fleet, replica.port(), back, Duration::from_secs(20)).await;
    eprintln!("etcd back: writes on the new primary after {times:?}");
    let failovers: f64 = fleet
        .iter()
        .map(|i| gauge(i, "fulcrum_failovers_total"))
        .sum();
    assert_eq!(failovers, 1.0);
    let client = try_pg_connect(&fleet[1].cfg).await.unwrap();
    client
        .batch_execute("INSERT INTO t VALUES (2)")
        .await
        .unwrap();
}
