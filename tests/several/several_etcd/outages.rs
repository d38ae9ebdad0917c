//! Outages around etcd: an instance frozen past its lease never writes to
//! the old primary, and with etcd stopped reads go on, writes hold and
//! nothing is promoted.

use std::time::{Duration, Instant};

use fulcrum_suite::{serial, try_pg_connect};
use fulcrum_testkit::{EtcdCluster, PgCluster, Signal, APP_DB};

use crate::fleet::{gauge, start_fleet, start_instance, wait_for, Instance};

use super::helpers::{converge, etcd_lines, leader, wait_settled, LEASE};

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
