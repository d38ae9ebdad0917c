//! The loop's decisions over scripted servers: a table of what each
//! backend answers, changed between rounds. (The real servers are in
//! tests/pg_ha/pg_failover.rs; this pins down the sequencing.)

use std::sync::Mutex;

use fulcrum_config::MaxLag;

use super::*;

#[derive(Default)]
struct Scripted {
    answers: Mutex<Vec<Result<Observation, OpsError>>>,
    promoted: Mutex<Vec<BackendId>>,
    followed: Mutex<Vec<(BackendId, BackendId)>>,
    fenced: Mutex<Vec<BackendId>>,
    addresses: Vec<String>,
}

impl ServerOps for Scripted {
    fn address(&self, b: BackendId) -> &str {
        &self.addresses[b]
    }
    async fn probe(&self, b: BackendId) -> Result<Observation, OpsError> {
        self.answers.lock().unwrap()[b].clone()
    }
    async fn promote(&self, b: BackendId) -> Result<(), OpsError> {
        self.promoted.lock().unwrap().push(b);
        let mut answers = self.answers.lock().unwrap();
        if let Ok(o) = answers[b].as_mut() {
            o.writable = true;
            o.timeline += 1;
        }
        Ok(())
    }
    async fn follow(&self, r: BackendId, p: BackendId) -> Result<(), OpsError> {
        self.followed.lock().unwrap().push((r, p));
        Ok(())
    }
    async fn fence(&self, b: BackendId) -> Result<u64, OpsError> {
        self.fenced.lock().unwrap().push(b);
        Ok(self.answers.lock().unwrap()[b]
            .as_ref()
            .map_or(0, |o| o.position))
    }
}

fn primary(position: u64) -> Result<Observation, OpsError> {
    Ok(Observation {
        writable: true,
        timeline: 1,
        position,
        received: position,
        replay_age: None,
        detached: false,
    })
}

fn replica(replayed: u64, received: u64, age_ms: u64) -> Result<Observation, OpsError> {
    Ok(Observation {
        writable: false,
        timeline: 0,
        position: replayed,
        received,
        replay_age: Some(Duration::from_millis(age_ms)),
        detached: false,
    })
}

fn down() -> Result<Observation, OpsError> {
    Err(OpsError::Connect("refused".into()))
}

fn monitor(
    failover: Failover,
    max_lag: Option<MaxLag>,
) -> (Monitor<Scripted>, Arc<Scripted>, Arc<Router>) {
    monitor_with(failover, max_lag, MaxLag::Bytes(16 * 1024 * 1024))
}

fn monitor_with(
    failover: Failover,
    max_lag: Option<MaxLag>,
    failover_max_lag: MaxLag,
) -> (Monitor<Scripted>, Arc<Scripted>, Arc<Router>) {
    let ops = Arc::new(Scripted {
        addresses: vec!["p:1".into(), "r1:2".into(), "r2:3".into()],
        ..Default::default()
    });
    let router = Arc::new(Router::new(0, 3, &[1, 2], false));
    let settings = MonitorSettings {
        cluster: "test".into(),
        health: Health {
            interval: Duration::from_millis(10),
            timeout: Duration::from_secs(1),
            failures: 2,
            user: "u".into(),
            password: String::new(),
            database: "d".into(),
            max_lag,
            failover,
            failover_max_lag,
            failover_timeout: Duration::from_millis(30),
            failover_command: None,
        },
        roles: vec![Role::Primary, Role::Replica, Role::Replica],
        replay: false,
        topology: fulcrum_config::Topology::Probe,
    };
    let view = Arc::new(ClusterView::new(&ops.addresses));
    let m = Monitor::new(settings, ops.clone(), router.clone(), view);
    (m, ops, router)
}

fn script(ops: &Scripted, answers: Vec<Result<Observation, OpsError>>) {
    *ops.answers.lock().unwrap() = answers;
}

#[tokio::test]
async fn a_lost_primary_is_replaced_by_the_most_advanced_replica() {
    let (mut m, ops, router) = monitor(Failover::Promote, None);
    script(
        &ops,
        vec![primary(100), replica(90, 95, 5), replica(90, 99, 5)],
    );
    m.round().await;
    assert_eq!(router.primary(), Some(0));
    script(&ops, vec![down(), replica(90, 95, 5), replica(90, 99, 5)]);
    m.round().await;
    assert_eq!(router.primary(), Some(0), "one failure is not down");
    m.round().await;
    assert_eq!(router.primary(), None, "down after two: writes wait");
    assert!(
        ops.promoted.lock().unwrap().is_empty(),
        "not before failover_timeout"
    );
    tokio::time::sleep(Duration::from_millis(40)).await;
    m.round().await;
    assert_eq!(*ops.promoted.lock().unwrap(), vec![2], "received the most");
    assert_eq!(router.primary(), Some(2));
    assert_eq!(*ops.followed.lock().unwrap(), vec![(1, 2)]);
    assert_eq!(m.view.failovers(), 1);
    // The old primary returns writable: fenced, no traffic.
    script(&ops, vec![primary(100), replica(99, 99, 0), primary(120)]);
    m.round().await;
    assert_eq!(router.primary(), Some(2));
    assert_eq!(m.view.backends()[0].state, BackendState::Stale);
    assert!(!router.is_readable(0));
}

#[tokio::test]
async fn follow_and_none_never_promote() {
    for mode in [Failover::Follow, Failover::None] {
        let (mut m, ops, router) = monitor(mode, None);
        script(
            &ops,
            vec![primary(100), replica(100, 100, 0), replica(100, 100, 0)],
        );
        m.round().await;
        script(
            &ops,
            vec![down(), replica(100, 100, 0), replica(100, 100, 0)],
        );
        for _ in 0..3 {
            m.round().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(router.primary(), None, "{mode:?}");
        assert!(ops.promoted.lock().unwrap().is_empty(), "{mode:?}");
        assert!(
            router.is_readable(1) && router.is_readable(2),
            "reads go on"
        );
    }
}

#[tokio::test]
async fn a_replica_over_max_lag_serves_no_reads_until_under_half() {
    let (mut m, ops, router) = monitor(Failover::Follow, Some(MaxLag::Bytes(100)));
    script(
        &ops,
        vec![
            primary(1000),
            replica(850, 1000, 50),
            replica(1000, 1000, 0),
        ],
    );
    m.round().await;
    assert!(!router.is_readable(1), "150 bytes behind");
    assert_eq!(m.view.backends()[1].state, BackendState::Lagging);
    assert_eq!(m.view.backends()[1].lag_bytes, 150);
    script(
        &ops,
        vec![
            primary(1000),
            replica(930, 1000, 50),
            replica(1000, 1000, 0),
        ],
    );
    m.round().await;
    assert!(
        !router.is_readable(1),
        "70 bytes: still over half the limit"
    );
    script(
        &ops,
        vec![
            primary(1000),
            replica(960, 1000, 50),
            replica(1000, 1000, 0),
        ],
    );
    m.round().await;
    assert!(router.is_readable(1), "40 bytes: back");
}

#[tokio::test]
async fn a_suspect_report_wakes_the_loop_at_once() {
    let (m, ops, router) = monitor(Failover::Follow, None);
    script(&ops, vec![primary(1), replica(1, 1, 0), replica(1, 1, 0)]);
    let mut slow = m;
    slow.settings.health.interval = Duration::from_secs(3600);
    let view = slow.view.clone();
    let (tx, rx) = watch::channel(false);
    let task = slow.spawn(rx);
    tokio::time::sleep(Duration::from_millis(20)).await;
    script(&ops, vec![primary(1), down(), replica(1, 1, 0)]);
    router.suspect(1);
    assert!(!router.is_readable(1), "out of reads at once");
    // Two fast rounds (one woken by the report) take it down, long
    // before the hour-long interval.
    tokio::time::timeout(Duration::from_secs(5), async {
        while view.backends()[1].state != BackendState::Down {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("down within seconds");
    tx.send(true).unwrap();
    let _ = task.await;
}

#[tokio::test]
async fn a_switchover_fences_the_old_primary_and_promotes_the_target() {
    let (mut m, ops, router) = monitor(Failover::Follow, None);
    script(
        &ops,
        vec![primary(100), replica(100, 100, 0), replica(100, 100, 0)],
    );
    m.round().await;
    let held = m.switchover(1).await.unwrap();
    assert!(held < Duration::from_secs(1));
    assert_eq!(*ops.fenced.lock().unwrap(), vec![0]);
    assert_eq!(*ops.promoted.lock().unwrap(), vec![1]);
    assert_eq!(*ops.followed.lock().unwrap(), vec![(2, 1)]);
    assert_eq!(router.primary(), Some(1));
    assert!(!router.is_paused(), "work resumes");
    // The old primary, still writable, is stale from the next round on.
    script(&ops, vec![primary(100), primary(120), replica(120, 120, 0)]);
    m.round().await;
    assert_eq!(router.primary(), Some(1));
    assert_eq!(m.view.backends()[0].state, BackendState::Stale);
    // Refusals leave the cluster as it was.
    assert!(m
        .switchover(1)
        .await
        .unwrap_err()
        .contains("already the primary"));
    assert!(m
        .switchover(0)
        .await
        .unwrap_err()
        .contains("not a reachable replica"));
    assert!(!router.is_paused());
}

#[tokio::test]
async fn no_promotion_beyond_failover_max_lag_until_it_catches_up() {
    let (mut m, ops, router) = monitor_with(Failover::Promote, None, MaxLag::Bytes(1000));
    // Replicas have received everything but replayed 5,000 bytes less.
    script(
        &ops,
        vec![
            primary(10_000),
            replica(5_000, 10_000, 900),
            replica(4_000, 9_000, 900),
        ],
    );
    m.round().await;
    script(
        &ops,
        vec![
            down(),
            replica(5_000, 10_000, 900),
            replica(4_000, 9_000, 900),
        ],
    );
    m.round().await;
    m.round().await;
    tokio::time::sleep(Duration::from_millis(40)).await;
    m.round().await;
    m.round().await;
    assert!(ops.promoted.lock().unwrap().is_empty(), "too far behind");
    assert_eq!(router.primary(), None);
    let why = m.view.failover_blocked().expect("the reason is shown");
    assert!(
        why.contains("failover_max_lag") && why.contains("5000 bytes"),
        "{why}"
    );
    // It replays up to the last primary position: promoted, reason gone.
    script(
        &ops,
        vec![
            down(),
            replica(10_000, 10_000, 0),
            replica(4_000, 9_000, 900),
        ],
    );
    m.round().await;
    assert_eq!(*ops.promoted.lock().unwrap(), vec![1]);
    assert_eq!(m.view.failover_blocked(), None);
}

/// A coordinator's verdict naming `primary` (an address) at `stage`.
fn verdict(
    primary: &str,
    stage: fulcrum_coordination::Stage,
    cut_off: bool,
) -> fulcrum_coordination::Verdict {
    fulcrum_coordination::Verdict {
        published: Some(fulcrum_coordination::Published {
            epoch: 2,
            primary: Some(primary.into()),
            replicas: vec![],
            stage,
            by: "leader".into(),
            at_ms: 0,
            commit_floor: None,
            ..Default::default()
        }),
        leading: false,
        leader: Some("leader".into()),
        cut_off,
        last_heard: Some(Instant::now()),
        valid_until: Some(Instant::now() + Duration::from_secs(60)),
        last_error: None,
        members: vec![],
    }
}

fn member(
    name: &str,
    address: &str,
    role: &str,
    state: &str,
    lag: Option<u64>,
) -> fulcrum_coordination::Member {
    fulcrum_coordination::Member {
        name: name.into(),
        role: role.into(),
        state: state.into(),
        address: address.into(),
        timeline: Some(1),
        lag,
    }
}

#[tokio::test]
async fn patroni_s_word_on_a_replica_s_state_and_lag_bounds_its_reads() {
    use fulcrum_coordination::Stage;
    let (mut m, ops, router) = monitor(Failover::Follow, Some(MaxLag::Bytes(1024 * 1024)));
    // This instance's probes find both replicas fine and close behind.
    script(
        &ops,
        vec![primary(100), replica(100, 100, 0), replica(100, 100, 0)],
    );
    let with = |members| {
        let mut v = verdict("p:1", Stage::Ready, false);
        v.members = members;
        v
    };
    m.verdict = Some(with(vec![
        member("pg0", "p:1", "leader", "running", None),
        member("pg1", "r1:2", "replica", "stopped", None),
        member(
            "pg2",
            "r2:3",
            "replica",
            "streaming",
            Some(64 * 1024 * 1024),
        ),
    ]));
    m.round().await;
    assert_eq!(router.primary(), Some(0));
    assert!(!router.is_readable(1), "Patroni reports it stopped");
    assert_eq!(m.view.backends()[1].state, BackendState::Down);
    assert!(
        m.view.backends()[1]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("Patroni reports member pg1 stopped")),
        "{:?}",
        m.view.backends()[1].last_error
    );
    assert!(
        !router.is_readable(2),
        "64 MB behind by Patroni's count, over max_lag"
    );
    assert_eq!(m.view.backends()[2].state, BackendState::Lagging);
    // Both fine by Patroni: both serve reads.
    m.verdict = Some(with(vec![
        member("pg0", "p:1", "leader", "running", None),
        member("pg1", "r1:2", "replica", "running", Some(0)),
        member("pg2", "r2:3", "replica", "streaming", Some(0)),
    ]));
    m.round().await;
    m.round().await;
    assert!(router.is_readable(1) && router.is_readable(2));
    // Cut off from Patroni, its last word no longer bounds reads: the
    // probes alone do.
    let mut v = with(vec![
        member("pg0", "p:1", "leader", "running", None),
        member("pg1", "r1:2", "replica", "stopped", None),
    ]);
    v.cut_off = true;
    m.verdict = Some(v);
    m.round().await;
    assert!(router.is_readable(1), "reads go on while cut off");
}

#[tokio::test]
async fn under_a_coordinator_only_the_named_primary_takes_writes() {
    use fulcrum_coordination::Stage;
    let (mut m, ops, router) = monitor(Failover::Follow, None);
    // Two writable nodes; the coordinator names the second.
    script(&ops, vec![primary(100), primary(120), replica(90, 95, 5)]);
    m.verdict = Some(verdict("r1:2", Stage::Ready, false));
    m.round().await;
    assert_eq!(
        router.primary(),
        Some(1),
        "the named node, not this loop's pick"
    );
    assert_eq!(
        m.view.backends()[0].state,
        BackendState::Stale,
        "the other writable node is fenced"
    );
    // Promoting: nobody writes until it is ready.
    m.verdict = Some(verdict("r2:3", Stage::Promoting, false));
    script(&ops, vec![primary(100), primary(120), primary(130)]);
    m.round().await;
    assert_eq!(
        router.primary(),
        None,
        "a promotion under way takes no writes"
    );
    m.verdict = Some(verdict("r2:3", Stage::Ready, false));
    m.round().await;
    assert_eq!(router.primary(), Some(2));
    // Named but not writable by this instance's own probe: no writes.
    script(&ops, vec![primary(100), primary(120), replica(130, 130, 0)]);
    m.round().await;
    assert_eq!(router.primary(), None, "named, but read-only here");
    assert!(
        ops.promoted.lock().unwrap().is_empty(),
        "follow never promotes"
    );
}

#[tokio::test]
async fn cut_off_from_the_coordinator_writes_hold_and_the_router_expires_its_primary() {
    use fulcrum_coordination::Stage;
    let (mut m, ops, router) = monitor(Failover::Follow, None);
    script(
        &ops,
        vec![primary(100), replica(90, 95, 5), replica(90, 95, 5)],
    );
    m.verdict = Some(verdict("p:1", Stage::Ready, false));
    m.round().await;
    assert_eq!(router.primary(), Some(0));
    // The lease the router was given runs out before the loop runs again
    // (a process frozen and resumed): the router alone stops writes.
    let mut v = verdict("p:1", Stage::Ready, false);
    v.valid_until = Some(Instant::now() + Duration::from_millis(30));
    m.verdict = Some(v);
    m.round().await;
    assert_eq!(router.primary(), Some(0));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        router.primary(),
        None,
        "expired without news from the coordinator"
    );
    // The loop's next round, still cut off: hold.
    m.verdict = Some(verdict("p:1", Stage::Ready, true));
    m.round().await;
    assert_eq!(router.primary(), None, "hold while cut off");
    assert!(
        router.is_readable(1) && router.is_readable(2),
        "reads go on"
    );
    // last_known: the last named primary while it answers as one.
    m.settings.topology = fulcrum_config::Topology::Patroni(fulcrum_config::Patroni::plain(
        vec![],
        Duration::from_secs(5),
        fulcrum_config::CoordinatorLoss::LastKnown,
    ));
    m.round().await;
    assert_eq!(
        router.primary(),
        Some(0),
        "last_known keeps the named primary"
    );
    // ... for as long as a probe of this instance vouches for it: cut off,
    // a process frozen past the lease and resumed writes nowhere until it
    // has probed again.
    let mut v = verdict("p:1", Stage::Ready, true);
    v.valid_until = Some(Instant::now());
    m.verdict = Some(v);
    m.settings.topology = fulcrum_config::Topology::Patroni(fulcrum_config::Patroni::plain(
        vec![],
        Duration::from_millis(40),
        fulcrum_config::CoordinatorLoss::LastKnown,
    ));
    m.round().await;
    assert_eq!(
        router.primary(),
        Some(0),
        "vouched for by this round's probe"
    );
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(
        router.primary(),
        None,
        "a probe older than the lease vouches for nothing"
    );
    m.round().await;
    assert_eq!(router.primary(), Some(0), "a new probe does");
    script(
        &ops,
        vec![replica(100, 100, 0), replica(90, 95, 5), replica(90, 95, 5)],
    );
    m.round().await;
    assert_eq!(
        router.primary(),
        None,
        "but not once it answers as a replica"
    );
}
