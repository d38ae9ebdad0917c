//! The transition table, row by row, and the properties the front ends rely
//! on: every waiting state has an event that ends it, and a drain ends the
//! session exactly at a boundary.

use super::*;
use crate::route::{decide, Facts, Txn};
use crate::state::tests_loss_rows::loss_rows;
use fulcrum_config::Consistency;
use fulcrum_sql::Decision;

pub(super) const PRIMARY: Route = Route::Primary;
pub(super) const REPLICA: Route = Route::Replica;

pub(super) fn unit(decision: Decision) -> Event {
    Event::Unit(decide(&Facts::idle(decision)))
}

fn unit_in(decision: Decision, txn: Txn) -> Event {
    let mut f = Facts::idle(decision);
    f.txn = txn;
    Event::Unit(decide(&f))
}

pub(super) fn ready(status: Status, owed: Owed) -> Event {
    Event::Ready { status, owed }
}

pub(super) fn lost(change: impl FnOnce(&mut Loss)) -> Event {
    let mut l = Loss::default();
    change(&mut l);
    Event::ServerLost(l)
}

pub(super) fn engine(phase: Phase) -> Engine {
    Engine {
        phase,
        draining: false,
        quiet: true,
        begin: String::new(),
        unit: Default::default(),
        txn_log: crate::replay::TxnLog::new(None, crate::replay::Framing::Whole),
        status: Status::Idle,
        state_left: None,
        keep_next: false,
        let_go: false,
        lost_because: None,
    }
}

pub(super) type Row = (&'static str, Phase, Event, Phase, Vec<Action>);

fn rows() -> Vec<Row> {
    use Action::*;
    use Phase::*;
    let busy_r = Busy { route: REPLICA };
    let busy_p = Busy { route: PRIMARY };
    let in_txn = InTransaction { failed: false };
    let pin = Decision::Pin("LISTEN");
    let mut rows = vec![
        (
            "idle read attaches a replica",
            Idle,
            unit(Decision::Read),
            busy_r,
            vec![Attach(REPLICA)],
        ),
        (
            "idle write attaches the primary",
            Idle,
            unit(Decision::Write),
            busy_p,
            vec![Attach(PRIMARY)],
        ),
        (
            "idle pin attaches and pins",
            Idle,
            unit(pin),
            Pinned("LISTEN"),
            vec![Attach(PRIMARY)],
        ),
        (
            "begin answered locally",
            Idle,
            Event::Deferred { read_only: false },
            Deferred { read_only: false },
            vec![],
        ),
        (
            "set transaction read only",
            Deferred { read_only: false },
            Event::Deferred { read_only: true },
            Deferred { read_only: true },
            vec![],
        ),
        (
            "deferred ro read goes to a replica",
            Deferred { read_only: true },
            unit_in(Decision::Read, Txn::Deferred { read_only: true }),
            busy_r,
            vec![Attach(REPLICA)],
        ),
        (
            "deferred rw read goes to the primary",
            Deferred { read_only: false },
            unit_in(Decision::Read, Txn::Deferred { read_only: false }),
            busy_p,
            vec![Attach(PRIMARY)],
        ),
        (
            "deferred commit",
            Deferred { read_only: true },
            Event::DeferredEnded,
            Idle,
            vec![],
        ),
        (
            "server opens the transaction",
            busy_p,
            ready(Status::InTransaction, Owed::Nothing),
            in_txn,
            vec![],
        ),
        (
            "server reports it failed",
            in_txn,
            ready(Status::Failed, Owed::Nothing),
            InTransaction { failed: true },
            vec![],
        ),
        (
            "transaction ends",
            in_txn,
            ready(Status::Idle, Owed::Nothing),
            Idle,
            vec![Detach],
        ),
        (
            "unit ends",
            busy_r,
            ready(Status::Idle, Owed::Nothing),
            Idle,
            vec![Detach],
        ),
        (
            "pipelined work still owed",
            busy_r,
            ready(Status::Idle, Owed::Client),
            busy_r,
            vec![],
        ),
        (
            "position still owed",
            busy_p,
            ready(Status::Idle, Owed::OwnQuery),
            Settling,
            vec![],
        ),
        (
            "position arrives",
            Settling,
            ready(Status::Idle, Owed::Nothing),
            Idle,
            vec![Detach],
        ),
        (
            "read waits for the position",
            Settling,
            unit(Decision::Read),
            Settling,
            vec![Hold],
        ),
        (
            "write rides along",
            Settling,
            unit(Decision::Write),
            busy_p,
            vec![],
        ),
        (
            "pin rides along",
            Settling,
            unit(pin),
            Pinned("LISTEN"),
            vec![],
        ),
        (
            "write behind a replica read is held",
            busy_r,
            unit(Decision::Write),
            busy_r,
            vec![Hold],
        ),
        (
            "pin behind a replica read is held",
            busy_r,
            unit(pin),
            busy_r,
            vec![Hold],
        ),
        (
            "read behind a replica read follows",
            busy_r,
            unit(Decision::Read),
            busy_r,
            vec![],
        ),
        (
            "read behind a primary unit follows",
            busy_p,
            unit(Decision::Read),
            busy_p,
            vec![],
        ),
        (
            "pin behind a primary unit pins",
            busy_p,
            unit(pin),
            Pinned("LISTEN"),
            vec![],
        ),
        (
            "pin in a transaction pins",
            in_txn,
            unit(pin),
            Pinned("LISTEN"),
            vec![],
        ),
        (
            "anything in a transaction stays",
            in_txn,
            unit(Decision::Write),
            in_txn,
            vec![],
        ),
        (
            "pinned stays pinned",
            Pinned("x"),
            ready(Status::Idle, Owed::Nothing),
            Pinned("x"),
            vec![],
        ),
        (
            "a LISTEN pins a unit in flight",
            busy_r,
            Event::Pin("LISTEN"),
            Pinned("LISTEN"),
            vec![],
        ),
        (
            "a temp table pins a transaction",
            in_txn,
            Event::Pin("temp"),
            Pinned("temp"),
            vec![],
        ),
        (
            "a second pin keeps the first reason",
            Pinned("x"),
            Event::Pin("y"),
            Pinned("x"),
            vec![],
        ),
        (
            "reset lifts a pin",
            Pinned("x"),
            Event::Reset,
            Idle,
            vec![Detach],
        ),
    ];
    rows.extend(loss_rows());
    rows
}

#[test]
fn every_row_of_the_transition_table() {
    let mut failures = Vec::new();
    for (name, from, event, to, want) in rows() {
        let mut e = engine(from);
        let got: Vec<Action> = e.step(event).iter().collect();
        if e.phase() != to || got != want {
            failures.push(format!(
                "{name}: {from:?} --{event:?}--> {:?} {got:?}, want {to:?} {want:?}",
                e.phase()
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn a_drain_closes_at_the_next_boundary() {
    let mut e = engine(Phase::InTransaction { failed: false });
    assert!(e.step(Event::Drain).is_empty());
    assert!(e.draining());
    let a = e.step(ready(Status::Idle, Owed::Nothing));
    assert_eq!(
        a.iter().collect::<Vec<_>>(),
        vec![Action::Detach, Action::Close(Ending::Drained)]
    );
    let mut e = engine(Phase::Deferred { read_only: false });
    let _ = e.step(Event::Drain);
    assert!(e
        .step(Event::DeferredEnded)
        .contains(Action::Close(Ending::Drained)));
    let mut e = engine(Phase::Lost { in_txn: true });
    let _ = e.step(Event::Drain);
    assert!(e
        .step(Event::LostEnded)
        .contains(Action::Close(Ending::Drained)));
}

/// Every phase other than `Idle` (which waits for the client alone) has
/// an event from the server, Fulcrum or the client that leads back to
/// `Idle`: no phase waits for something that cannot come.
#[test]
fn a_pinned_client_drains_when_its_connection_is_quiet() {
    let mut e = Engine::new(Some("session pool mode"));
    assert!(e.at_boundary());
    let _ = e.step(unit(Decision::Read));
    assert!(!e.at_boundary(), "a unit in flight");
    assert!(e.step(Event::Drain).is_empty());
    let a = e.step(ready(Status::InTransaction, Owed::Nothing));
    assert!(a.is_empty(), "in a transaction: not yet");
    let a = e.step(ready(Status::Idle, Owed::Nothing));
    assert_eq!(
        a.iter().collect::<Vec<_>>(),
        vec![Action::Close(Ending::Drained)]
    );
}

#[test]
fn session_pooling_starts_pinned_and_reads_stay() {
    let mut e = Engine::new(Some("session pool mode"));
    assert_eq!(e.pinned(), Some("session pool mode"));
    let mut f = Facts::idle(Decision::Read);
    f.pinned = true;
    f.attached = true;
    f.session = Consistency::Eventual;
    assert!(e.step(Event::Unit(decide(&f))).is_empty());
    assert_eq!(e.phase(), Phase::Pinned("session pool mode"));
    assert_eq!(Engine::new(None).phase(), Phase::Idle);
}

#[test]
fn a_client_pinned_before_it_has_a_connection_attaches_the_primary() {
    // Session pooling pins at login; the first unit has nothing to stay on.
    let mut e = Engine::new(Some("session pool mode"));
    let mut f = Facts::idle(Decision::Read);
    f.pinned = true;
    let a = e.step(Event::Unit(decide(&f)));
    assert_eq!(
        a.iter().collect::<Vec<_>>(),
        vec![Action::Attach(Route::Primary)]
    );
    assert_eq!(e.phase(), Phase::Pinned("session pool mode"));
}

#[test]
fn outcomes_carry_their_sqlstate() {
    assert_eq!(Outcome::Unknown.sqlstate(), "08007");
    assert_eq!(Outcome::NotCommitted.sqlstate(), "08006");
    assert_eq!(Outcome::NotAnswered.sqlstate(), "08006");
    assert!(Outcome::Unknown.advice().contains("may or may not"));
}

#[test]
fn state_left_is_recorded_for_a_client_pinned_from_the_start() {
    let mut e = Engine::new(Some("session pool mode"));
    assert_eq!(e.state_left(), None, "the login's pin is not state left");
    let _ = e.step(Event::Pin("temporary table"));
    assert_eq!(e.pinned(), Some("session pool mode"), "the phase stays");
    assert_eq!(e.state_left(), Some("temporary table"));
    let _ = e.step(Event::Pin("advisory lock"));
    assert_eq!(e.state_left(), Some("temporary table"), "the first is kept");
    let _ = e.step(Event::Reset);
    assert_eq!(e.state_left(), None, "a reset clears it");

    let mut t = Engine::new(None);
    let _ = t.step(Event::Pin("prepared by SQL"));
    assert_eq!(t.state_left(), Some("prepared by SQL"));
}

#[test]
fn a_session_pool_pin_after_login_is_no_state_left() {
    // MySQL pins a session-pooled client after its login, with the event.
    let mut e = Engine::new(None);
    let _ = e.step(Event::Pin(SESSION_POOL));
    assert_eq!(e.pinned(), Some(SESSION_POOL));
    assert_eq!(e.state_left(), None);
    let _ = e.step(Event::Pin("user variable"));
    assert_eq!(e.state_left(), Some("user variable"));
}

#[test]
fn a_connection_kept_for_the_next_command_stays_for_that_one_only() {
    let busy = Phase::Busy { route: PRIMARY };
    let mut e = engine(busy);
    let kept_for_this = e.command_sent();
    assert!(!kept_for_this);
    e.answer_keeps(true, kept_for_this); // an INSERT's id
    assert!(e.kept_for_next());
    assert!(
        e.step(ready(Status::Idle, Owed::Nothing)).is_empty(),
        "kept: no detach"
    );
    // The next command uses the keep; its own insert id keeps no longer.
    let kept_for_this = e.command_sent();
    assert!(kept_for_this && !e.kept_for_next());
    e.answer_keeps(true, kept_for_this);
    assert!(!e.kept_for_next(), "no chain of keeps");
    assert_eq!(
        e.step(ready(Status::Idle, Owed::Nothing))
            .iter()
            .collect::<Vec<_>>(),
        vec![Action::Detach]
    );
    let mut e = engine(busy);
    e.answer_keeps(true, false);
    e.drop_keep();
    assert_eq!(
        e.step(ready(Status::Idle, Owed::Nothing))
            .iter()
            .collect::<Vec<_>>(),
        vec![Action::Detach],
        "a dropped keep detaches"
    );
}

#[test]
fn why_a_connection_was_given_up_is_said_once_and_forgotten_on_a_retry() {
    let mut e = Engine::new(None);
    assert_eq!(e.take_lost_because(), None);
    e.server_lost_because("it sent a malformed message".into());
    assert_eq!(
        e.take_lost_because().as_deref(),
        Some("it sent a malformed message")
    );
    assert_eq!(e.take_lost_because(), None, "said once");
    e.server_lost_because("over max_message_size".into());
    e.forget_lost_because();
    assert_eq!(e.take_lost_because(), None);
}
