use std::collections::VecDeque;
use std::path::Path;

use fulcrum_metrics::Metrics;

use super::*;

/// Positions as plain numbers.
#[derive(Debug, Clone)]
struct Num;

impl Positions for Num {
    type P = u64;
    fn newer(a: &u64, b: &u64) -> bool {
        a > b
    }
    fn parse(text: &str) -> Option<u64> {
        text.parse().ok()
    }
    fn is_origin(p: &u64) -> bool {
        *p == 0
    }
}

/// A replica that answers from a script: each ask takes the next answer
/// and records the wait it was given.
#[derive(Default)]
struct Scripted {
    answers: VecDeque<Option<bool>>,
    asked: Vec<(u64, Duration)>,
}

impl ReplicaProbe<u64> for Scripted {
    async fn reached(&mut self, position: &u64, wait: Duration) -> Option<bool> {
        self.asked.push((*position, wait));
        self.answers
            .pop_front()
            .expect("an answer scripted for each ask")
    }
}

struct World {
    config: Cluster,
    router: Router,
    metrics: ClusterMetrics,
    users: fulcrum_pool::UserPositions<u64>,
    user: Arc<str>,
    db: Arc<str>,
}

impl World {
    fn new(extra: &str) -> World {
        let toml = format!(
            "[[cluster]]\nname = \"c\"\nprotocol = \"postgres\"\nlisten = \"127.0.0.1:6543\"\n{extra}\n\
             [[cluster.backend]]\naddress = \"127.0.0.1:1\"\nrole = \"primary\"\n\
             [[cluster.backend]]\naddress = \"127.0.0.1:2\"\nrole = \"replica\"\n\
             [[cluster.user]]\nname = \"u\"\npassword = \"p\"\n"
        );
        let config = fulcrum_config::parse(&toml, Path::new("t.toml"))
            .expect("test config")
            .clusters
            .remove(0);
        World {
            config,
            router: Router::new(0, 2, &[1], false),
            metrics: ClusterMetrics::new(
                Arc::new(Metrics::new()),
                "c",
                &["a".to_owned(), "b".to_owned()],
            ),
            users: Default::default(),
            user: "u".into(),
            db: "d".into(),
        }
    }

    fn shared(&self) -> Shared<'_, u64> {
        Shared {
            config: &self.config,
            router: &self.router,
            metrics: &self.metrics,
            user_positions: &self.users,
            user: &self.user,
            database: &self.db,
        }
    }
}

fn run<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(f)
}

fn check(w: &World, reads: &mut Reads<Num>, probe: &mut Scripted, strong: Option<u64>) -> Check {
    run(reads.check(&w.shared(), 1, probe, || async move { strong }))
}

#[test]
fn a_client_that_never_wrote_reads_anywhere_without_asking() {
    let w = World::new("");
    let mut r = Reads::<Num>::new(Consistency::Session);
    let mut probe = Scripted::default();
    assert_eq!(check(&w, &mut r, &mut probe, None), Check::Serve);
    assert!(probe.asked.is_empty());
}

#[test]
fn a_replica_past_the_write_serves_and_is_not_asked_again() {
    let w = World::new("");
    let mut r = Reads::<Num>::new(Consistency::Session);
    r.learnt(&w.shared(), Some(7));
    let mut probe = Scripted {
        answers: [Some(true)].into(),
        ..Default::default()
    };
    assert_eq!(check(&w, &mut r, &mut probe, None), Check::Serve);
    assert_eq!(probe.asked, vec![(7, Duration::ZERO)]);
    assert_eq!(check(&w, &mut r, &mut probe, None), Check::Serve);
    assert_eq!(probe.asked.len(), 1, "verified once per write");
    r.learnt(&w.shared(), Some(9));
    probe.answers.push_back(Some(true));
    assert_eq!(check(&w, &mut r, &mut probe, None), Check::Serve);
    assert_eq!(
        probe.asked[1],
        (9, Duration::ZERO),
        "a new write asks again"
    );
}

#[test]
fn a_replica_behind_waits_only_when_the_policy_says_so() {
    // auto with an idle primary: read on the primary at once.
    let w = World::new("");
    let mut r = Reads::<Num>::new(Consistency::Session);
    r.learnt(&w.shared(), Some(7));
    let mut probe = Scripted {
        answers: [Some(false)].into(),
        ..Default::default()
    };
    assert_eq!(check(&w, &mut r, &mut probe, None), Check::Primary);
    assert_eq!(probe.asked.len(), 1);
    // wait_always: wait up to causal_timeout, then serve.
    let w = World::new("causal_wait = \"always\"\ncausal_timeout = \"2s\"");
    let mut r = Reads::<Num>::new(Consistency::Session);
    r.learnt(&w.shared(), Some(7));
    let mut probe = Scripted {
        answers: [Some(false), Some(true)].into(),
        ..Default::default()
    };
    assert_eq!(check(&w, &mut r, &mut probe, None), Check::Serve);
    assert_eq!(
        probe.asked,
        vec![(7, Duration::ZERO), (7, Duration::from_secs(2))]
    );
}

#[test]
fn an_unknown_position_or_a_failed_probe_reads_on_the_primary() {
    let w = World::new("");
    let mut r = Reads::<Num>::new(Consistency::Session);
    r.learnt(&w.shared(), None);
    assert!(r.position_unknown());
    let mut probe = Scripted::default();
    assert_eq!(check(&w, &mut r, &mut probe, None), Check::Primary);
    r.learnt(&w.shared(), Some(3));
    probe.answers.push_back(None);
    assert_eq!(check(&w, &mut r, &mut probe, None), Check::Primary);
}

#[test]
fn eventual_never_asks_and_strong_asks_for_the_primarys_position() {
    let w = World::new("");
    let mut r = Reads::<Num>::new(Consistency::Eventual);
    r.learnt(&w.shared(), Some(7));
    let mut probe = Scripted::default();
    assert_eq!(check(&w, &mut r, &mut probe, None), Check::Serve);
    assert!(probe.asked.is_empty());

    let mut r = Reads::<Num>::new(Consistency::Strong);
    assert_eq!(
        check(&w, &mut r, &mut probe, None),
        Check::Primary,
        "no position"
    );
    assert_eq!(
        check(&w, &mut r, &mut probe, Some(0)),
        Check::Serve,
        "nothing committed"
    );
    probe.answers.push_back(Some(true));
    assert_eq!(check(&w, &mut r, &mut probe, Some(12)), Check::Serve);
    assert_eq!(probe.asked, vec![(12, Duration::ZERO)]);
}

#[test]
fn user_reads_respect_another_connections_write_and_wait_while_it_is_learnt() {
    let w = World::new("");
    let writer = Reads::<Num>::new(Consistency::User);
    let mut reader = Reads::<Num>::new(Consistency::User);
    writer.learning(&w.shared());
    let mut probe = Scripted::default();
    assert_eq!(
        check(&w, &mut reader, &mut probe, None),
        Check::Primary,
        "a write whose position is being learnt"
    );
    let mut writer = writer;
    writer.learnt(&w.shared(), Some(20));
    probe.answers.push_back(Some(true));
    assert_eq!(check(&w, &mut reader, &mut probe, None), Check::Serve);
    assert_eq!(probe.asked, vec![(20, Duration::ZERO)]);
    assert_eq!(reader.token(&w.shared()), Some(20));
}

#[test]
fn hints_settings_and_tokens() {
    let w = World::new("");
    let mut r = Reads::<Num>::new(Consistency::Session);
    r.note_hint(b"/* fulcrum:consistency=strong */ SELECT 1");
    assert_eq!(r.for_unit(), Consistency::Strong);
    assert_eq!(r.session(), Consistency::Session);
    r.note_hint(b"SELECT 1");
    assert_eq!(r.for_unit(), Consistency::Session);
    assert_eq!(r.token(&w.shared()), None);
    r.note_hint(b"/* fulcrum:after=40 */ SELECT 1");
    assert_eq!(r.token(&w.shared()), Some(40));
    assert!(r.set_min_position("30"), "older: kept, not lowered");
    assert_eq!(r.token(&w.shared()), Some(40));
    assert!(!r.set_min_position("x"));
    assert_eq!(r.setting(SettingOp::Set("eventual")), SettingAnswer::Set);
    assert_eq!(r.setting(SettingOp::Show), SettingAnswer::Show("eventual"));
    assert!(matches!(
        r.setting(SettingOp::Set("sometimes")),
        SettingAnswer::Invalid { .. }
    ));
    assert_eq!(r.setting(SettingOp::Reset), SettingAnswer::Reset);
    assert_eq!(r.session(), Consistency::Session);
}

#[test]
fn serves_at_once_only_where_check_would_serve_without_asking() {
    let w = World::new("");
    // A session read that never wrote, and any eventual read: served.
    let mut r = Reads::<Num>::new(Consistency::Session);
    assert!(r.serves_at_once(&w.shared(), 1));
    let mut e = Reads::<Num>::new(Consistency::Eventual);
    e.learnt(&w.shared(), Some(7));
    assert!(e.serves_at_once(&w.shared(), 1));
    // A write not yet seen on the replica, or at an unknown position:
    // left to `check`, which asks the replica (or goes to the primary).
    r.learnt(&w.shared(), Some(7));
    assert!(!r.serves_at_once(&w.shared(), 1));
    let mut probe = Scripted {
        answers: [Some(true)].into(),
        ..Default::default()
    };
    assert_eq!(check(&w, &mut r, &mut probe, None), Check::Serve);
    // Seen there once: served at once until the next write.
    assert!(r.serves_at_once(&w.shared(), 1));
    r.learnt(&w.shared(), None);
    assert!(!r.serves_at_once(&w.shared(), 1));
    assert_eq!(check(&w, &mut r, &mut probe, None), Check::Primary);
    // User and strong reads always take the full check.
    let mut u = Reads::<Num>::new(Consistency::User);
    assert!(!u.serves_at_once(&w.shared(), 1));
    let mut s = Reads::<Num>::new(Consistency::Strong);
    assert!(!s.serves_at_once(&w.shared(), 1));
}
