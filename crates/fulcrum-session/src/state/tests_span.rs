//! The engine's promises that span the whole table: every wait ends, the
//! events a front end does not act on ask for nothing but a drain's close,
//! and deferred transaction control.

use super::*;
use crate::route::{decide, Facts, Txn};
use crate::state::tests::{engine, lost, ready, unit, PRIMARY, REPLICA};

#[test]
fn every_wait_has_an_end() {
    let phases = [
        Phase::Deferred { read_only: true },
        Phase::Busy { route: PRIMARY },
        Phase::Busy { route: REPLICA },
        Phase::Settling,
        Phase::InTransaction { failed: false },
        Phase::InTransaction { failed: true },
        Phase::Pinned("x"),
        Phase::Lost { in_txn: true },
        Phase::Lost { in_txn: false },
        Phase::Replaying,
        Phase::Resolving,
    ];
    let endings = [
        ready(Status::Idle, Owed::Nothing),
        Event::DeferredEnded,
        Event::LostEnded,
        Event::Reset,
        lost(|_| {}),
        Event::ClientGone,
        Event::Resolved(Resolution::Committed),
    ];
    for phase in phases {
        let ends = endings.iter().any(|ev| {
            let mut e = engine(phase);
            let _ = e.step(*ev);
            e.phase() == Phase::Idle
        });
        assert!(ends, "{phase:?} has no way back to Idle");
        // And a held unit is only ever held behind a server that owes an
        // answer: Hold never comes from a phase without a connection.
        for d in [Decision::Read, Decision::Write, Decision::Pin("p")] {
            let mut e = engine(phase);
            let held = e.step(unit(d)).contains(Action::Hold);
            assert!(
                !held || matches!(phase, Phase::Busy { .. } | Phase::Settling),
                "{phase:?} holds a unit without a server owing anything"
            );
        }
    }
}

#[test]
fn quiet_events_ask_only_for_a_drains_close() {
    let phases = [
        Phase::Idle,
        Phase::Deferred { read_only: false },
        Phase::Busy { route: PRIMARY },
        Phase::Busy { route: REPLICA },
        Phase::Settling,
        Phase::InTransaction { failed: false },
        Phase::InTransaction { failed: true },
        Phase::Pinned("x"),
        Phase::Lost { in_txn: true },
        Phase::Lost { in_txn: false },
        Phase::Replaying,
        Phase::Resolving,
    ];
    let quiet = [
        Event::Pin("p"),
        Event::Attached(PRIMARY),
        Event::Attached(REPLICA),
        Event::LostEnded,
        Event::Replayed,
        Event::ReplayFailed,
        Event::Resolved(Resolution::Committed),
        Event::Drain,
    ];
    for phase in phases {
        for ev in quiet {
            for draining in [false, true] {
                let mut e = engine(phase);
                e.draining = draining;
                let actions = e.step(ev);
                let asked: Vec<Action> = actions.iter().collect();
                let allowed = asked.iter().all(|a| {
                    matches!(a, Action::Close(Ending::Drained))
                        || (ev == Event::ReplayFailed && *a == Action::Fail(Outcome::NotCommitted))
                });
                assert!(allowed, "{phase:?} + {ev:?}: {asked:?} has no performer");
            }
        }
    }
}

#[test]
fn deferred_transaction_control_lives_in_the_engine() {
    let mut e = Engine::new(None);
    let (begin, _) = e.defer(Decision::Begin { read_only: false }, "BEGIN");
    assert!(matches!(begin, Some(crate::txn::Deferral::Opened(_))));
    assert_eq!(e.deferred(), Some(false));
    let _ = e.defer(Decision::TxnReadOnly, "SET TRANSACTION READ ONLY");
    assert_eq!(e.deferred(), Some(true));
    assert_eq!(
        e.defer(Decision::Read, "SELECT 1").0,
        None,
        "a statement goes to a server"
    );
    assert_eq!(
        e.deferred(),
        Some(true),
        "and the transaction stays deferred"
    );
    let mut f = Facts::idle(Decision::Read);
    f.txn = Txn::Deferred { read_only: true };
    assert_eq!(
        e.step(Event::Unit(decide(&f))).iter().collect::<Vec<_>>(),
        vec![Action::Attach(REPLICA)]
    );
    assert_eq!(
        e.take_begin().as_deref(),
        Some("BEGIN; SET TRANSACTION READ ONLY")
    );
    assert_eq!(e.take_begin(), None, "sent once");
    // COMMIT of an empty transaction ends it without a server.
    let mut e = Engine::new(None);
    let _ = e.defer(Decision::Begin { read_only: false }, "BEGIN");
    let (ended, actions) = e.defer(Decision::End, "COMMIT");
    assert_eq!(ended, Some(crate::txn::Deferral::Ended("COMMIT")));
    assert!(actions.is_empty(), "{actions:?}");
    assert_eq!(e.phase(), Phase::Idle);
    assert_eq!(e.take_begin(), None);
    // Nothing is deferred for a client holding a connection.
    let mut e = Engine::new(Some("session pool mode"));
    assert_eq!(
        e.defer(Decision::Begin { read_only: false }, "BEGIN").0,
        None
    );
}

/// A drain that came while the transaction was deferred ends the session
/// at the deferred COMMIT, the boundary it reaches without a server.
#[test]
fn a_deferred_commit_is_a_boundary_for_the_drain() {
    let mut e = Engine::new(None);
    let (_, opened) = e.defer(Decision::Begin { read_only: false }, "BEGIN");
    assert!(opened.is_empty(), "{opened:?}");
    let drain = e.step(Event::Drain);
    assert!(
        !drain.iter().any(|a| a == Action::Close(Ending::Drained)),
        "not at a boundary while deferred: {drain:?}"
    );
    let (_, actions) = e.defer(Decision::End, "COMMIT");
    assert_eq!(
        actions.iter().collect::<Vec<_>>(),
        vec![Action::Close(Ending::Drained)]
    );
    assert_eq!(e.phase(), Phase::Idle);
}
