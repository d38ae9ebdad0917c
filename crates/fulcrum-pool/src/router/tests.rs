//! Unit tests of `router`.

use super::*;

#[test]
fn writes_go_to_the_primary_reads_round_robin() {
    let r = Router::new(0, 3, &[1, 2], false);
    assert_eq!(r.pick(Route::Primary), Some(0));
    let picks: Vec<_> = (0..6).map(|_| r.pick(Route::Replica).unwrap()).collect();
    assert_eq!(picks.iter().filter(|&&b| b == 1).count(), 3);
    assert_eq!(picks.iter().filter(|&&b| b == 2).count(), 3);
    assert!(!picks.contains(&0));
}

#[test]
fn no_replica_means_reads_on_the_primary() {
    let r = Router::new(0, 1, &[], false);
    assert_eq!(r.pick(Route::Replica).unwrap(), 0);
}

#[test]
fn reads_on_primary_adds_it_to_the_rotation() {
    let r = Router::new(0, 2, &[1], true);
    let picks: Vec<_> = (0..4).map(|_| r.pick(Route::Replica).unwrap()).collect();
    assert_eq!(picks.iter().filter(|&&b| b == 0).count(), 2);
}

#[test]
fn weighted_policy_follows_the_weights() {
    let r = Router::with_policy(0, &[1, 1, 3], &[1, 2], false, Balance::Weighted);
    let picks: Vec<_> = (0..400).map(|_| r.pick(Route::Replica).unwrap()).collect();
    assert_eq!(picks.iter().filter(|&&b| b == 1).count(), 100);
    assert_eq!(picks.iter().filter(|&&b| b == 2).count(), 300);
}

#[test]
fn weight_zero_readers_get_no_reads() {
    for balance in [
        Balance::RoundRobin,
        Balance::Weighted,
        Balance::Random,
        Balance::LeastConnections,
    ] {
        let r = Router::with_policy(0, &[1, 0, 1], &[1, 2], false, balance);
        assert!(
            (0..50).all(|_| r.pick(Route::Replica).unwrap() == 2),
            "{balance:?}"
        );
    }
}

#[test]
fn least_connections_ties_alternate_whatever_the_pick_pattern() {
    // A client whose units take two picks (prepare, then execute) or three:
    // every pick goes to the reader picked longest ago, so the split is
    // even and a unit's first pick does not stick to one reader.
    for per_unit in [2usize, 3] {
        let r = Router::with_policy(0, &[1, 1, 1], &[1, 2], false, Balance::LeastConnections);
        let picks: Vec<_> = (0..6 * per_unit)
            .map(|_| r.pick(Route::Replica).unwrap())
            .collect();
        let ones = picks.iter().filter(|&&b| b == 1).count();
        assert_eq!(ones * 2, picks.len(), "{per_unit}: {picks:?}");
        assert!(
            picks.windows(2).all(|w| w[0] != w[1]),
            "alternating: {picks:?}"
        );
        if per_unit == 3 {
            let firsts: Vec<_> = picks.iter().step_by(3).collect();
            assert!(firsts.contains(&&1) && firsts.contains(&&2), "{firsts:?}");
        }
    }
}

#[test]
fn least_connections_avoids_the_busy_reader() {
    let r = Router::with_policy(0, &[1, 1, 1], &[1, 2], false, Balance::LeastConnections);
    r.load_counter(1).store(5, Ordering::Relaxed);
    assert!((0..20).all(|_| r.pick(Route::Replica).unwrap() == 2));
    r.load_counter(2).store(5, Ordering::Relaxed);
    let picks: Vec<_> = (0..20).map(|_| r.pick(Route::Replica).unwrap()).collect();
    assert!(
        picks.contains(&1) && picks.contains(&2),
        "ties rotate: {picks:?}"
    );
}

#[test]
fn p2c_steers_away_from_a_slow_reader() {
    let r = Router::with_policy(0, &[1, 1, 1], &[1, 2], false, Balance::P2c);
    for _ in 0..10 {
        r.record_latency(1, Duration::from_millis(50));
        r.record_latency(2, Duration::from_micros(500));
    }
    let picks: Vec<_> = (0..100).map(|_| r.pick(Route::Replica).unwrap()).collect();
    assert!(
        picks.iter().all(|&b| b == 2),
        "the slow reader lost every pair"
    );
}

#[test]
fn random_policy_uses_every_reader() {
    let r = Router::with_policy(0, &[1, 1, 1], &[1, 2], false, Balance::Random);
    let picks: Vec<_> = (0..200).map(|_| r.pick(Route::Replica).unwrap()).collect();
    let ones = picks.iter().filter(|&&b| b == 1).count();
    assert!((50..=150).contains(&ones), "{ones} of 200");
    assert!(!picks.contains(&0));
}

#[test]
fn banned_readers_are_skipped_until_the_ban_ends() {
    let r = Router::new(0, 3, &[1, 2], false);
    r.ban(1, Duration::from_millis(50));
    assert!((0..6).all(|_| r.pick(Route::Replica).unwrap() == 2));
    r.ban(2, Duration::from_millis(50));
    assert_eq!(
        r.pick(Route::Replica),
        Some(0),
        "all readers banned: the primary"
    );
    std::thread::sleep(Duration::from_millis(60));
    let picks: Vec<_> = (0..4).map(|_| r.pick(Route::Replica).unwrap()).collect();
    assert!(picks.contains(&1) && picks.contains(&2));
}

#[test]
fn unreadable_and_suspect_backends_get_no_reads() {
    let r = Router::new(0, 3, &[1, 2], false);
    r.set_readable(1, false);
    assert!((0..6).all(|_| r.pick(Route::Replica) == Some(2)));
    r.suspect(2);
    assert_eq!(r.pick(Route::Replica), Some(0), "no reader: the primary");
    assert_eq!(r.take_suspects(), vec![2]);
    assert!(r.take_suspects().is_empty(), "taking clears them");
}

#[test]
fn a_new_primary_takes_writes_and_leaves_the_readers() {
    let r = Router::new(0, 3, &[1, 2], false);
    r.set_primary(None);
    r.set_readable(0, false); // the health loop saw it die
    assert_eq!(r.pick(Route::Primary), None);
    assert!(
        r.pick(Route::Replica).is_some(),
        "reads go on without a primary"
    );
    r.set_primary(Some(1));
    assert_eq!(r.pick(Route::Primary), Some(1));
    assert!((0..6).all(|_| r.pick(Route::Replica) == Some(2)));
}

#[tokio::test]
async fn waiting_for_a_primary_ends_when_one_is_set() {
    let r = Arc::new(Router::new(0, 2, &[1], false));
    r.set_primary(None);
    let waiter = {
        let r = r.clone();
        tokio::spawn(async move { r.wait_primary(Some(0), Duration::from_secs(5)).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    r.set_primary(Some(1));
    assert_eq!(waiter.await.unwrap(), Some(1));
    assert_eq!(
        r.wait_primary(Some(1), Duration::from_millis(20)).await,
        None
    );
}

#[test]
fn a_disabled_backend_gets_no_reads_until_enabled() {
    let r = Router::new(0, 3, &[1, 2], false);
    r.set_disabled(1, true);
    assert!((0..6).all(|_| r.pick(Route::Replica) == Some(2)));
    r.set_readable(1, true); // the health loop does not undo it
    assert!((0..6).all(|_| r.pick(Route::Replica) == Some(2)));
    r.set_disabled(1, false);
    assert!((0..6).any(|_| r.pick(Route::Replica) == Some(1)));
}

#[tokio::test]
async fn paused_work_waits_for_resume() {
    let r = Arc::new(Router::new(0, 1, &[], false));
    r.wait_unpaused().await; // not paused: free
    r.set_paused(true);
    let waiter = {
        let r = r.clone();
        tokio::spawn(async move { r.wait_unpaused().await })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(!waiter.is_finished(), "held while paused");
    r.set_paused(false);
    tokio::time::timeout(Duration::from_secs(1), waiter)
        .await
        .unwrap()
        .unwrap();
}

#[test]
fn a_router_replaced_by_a_reload_follows_its_successor() {
    let old = Arc::new(Router::new(0, 3, &[1, 2], false));
    old.set_readable(2, false);
    old.set_disabled(1, true);
    let new = Arc::new(Router::new(0, 3, &[1, 2], false));
    assert!(new.adopt(&old));
    assert!(
        !new.is_readable(2) && new.is_disabled(1),
        "state taken over"
    );
    // The one health loop left drives both.
    new.set_primary(Some(1));
    new.set_readable(2, true);
    new.set_paused(true);
    assert_eq!(old.primary(), Some(1));
    assert!(old.is_readable(2) && old.is_paused());
    // A second reload: the oldest follows the newest too.
    let newer = Arc::new(Router::new(0, 3, &[1, 2], false));
    assert!(newer.adopt(&new));
    assert_eq!(newer.primary(), Some(1));
    newer.set_primary(None);
    assert_eq!((new.primary(), old.primary()), (None, None));
    // An old session's suspect report reaches the loop that looks.
    old.suspect(2);
    assert_eq!(newer.take_suspects(), vec![2]);
    // Other backends cannot follow.
    let other = Arc::new(Router::new(0, 2, &[1], false));
    assert!(!other.adopt(&newer));
}

#[test]
fn the_commit_floor_belongs_to_the_primary_it_was_read_on() {
    let r = Router::new(0, 3, &[1, 2], false);
    assert_eq!(r.commit_floor(0), None, "the configured primary has none");
    r.set_primary(None);
    r.set_commit_floor(1, Some(740));
    r.set_primary(Some(1));
    assert_eq!(r.commit_floor(1), Some(740));
    assert_eq!(r.commit_floor(0), None);
    r.set_primary(Some(1));
    assert_eq!(r.commit_floor(1), Some(740), "the same primary keeps it");
    r.set_primary(None);
    assert_eq!(r.commit_floor(1), None, "gone with the primary");
    r.set_primary(Some(1));
    assert_eq!(
        r.commit_floor(1),
        None,
        "a primary back from a restart has none"
    );
    r.set_commit_floor(2, Some(900));
    r.set_primary(Some(2));
    assert_eq!(r.commit_floor(2), Some(900));
    r.set_primary(Some(0));
    assert_eq!(r.commit_floor(2), None, "another primary");
}

/// `try_admit` counts a unit past the gate as `admit` does, and admits
/// none while paused.
#[test]
fn try_admit_counts_a_unit_and_refuses_while_paused() {
    let r = Router::new(0, 1, &[], false);
    let a = r.try_admit().expect("not paused");
    assert_eq!(r.admitting(), 1);
    drop(a);
    assert_eq!(r.admitting(), 0);
    r.set_paused(true);
    assert!(r.try_admit().is_none());
    assert_eq!(r.admitting(), 0, "a refused unit is not counted");
    r.set_paused(false);
    assert!(r.try_admit().is_some());
}

/// A database's pause holds its units alone, counts none it refused, and
/// is released by its resume; the cluster's pause holds every database.
#[tokio::test]
async fn a_database_pause_holds_that_database_alone() {
    let r = std::sync::Arc::new(Router::new(0, 1, &[], false));
    r.set_database_paused("shop", true);
    assert!(r.try_admit_to("shop").is_none());
    assert_eq!(r.admitting(), 0, "a refused unit is not counted");
    assert!(r.try_admit_to("crm").is_some(), "another database goes on");
    assert!(r.is_database_paused("shop") && !r.is_database_paused("crm"));
    assert_eq!(
        r.paused_databases(),
        vec![std::sync::Arc::<str>::from("shop")]
    );
    let waiting = tokio::spawn({
        let r = r.clone();
        async move {
            let _a = r.admit_to("shop").await;
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(!waiting.is_finished(), "the paused database's unit waits");
    r.set_database_paused("shop", false);
    tokio::time::timeout(std::time::Duration::from_secs(2), waiting)
        .await
        .expect("released by the resume")
        .unwrap();
    r.set_paused(true);
    assert!(
        r.try_admit_to("crm").is_none(),
        "the cluster's pause holds all"
    );
    r.set_paused(false);
    assert!(r.try_admit_to("shop").is_some());
}
