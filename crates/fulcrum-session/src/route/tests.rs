//! The routing table: one row per case, each naming the facts that differ
//! from an idle, unpinned, complete unit under session consistency.

use super::*;

const PRIMARY: Target = Target::Go(Route::Primary);
const REPLICA: Target = Target::Go(Route::Replica);
const STAY: Target = Target::Stay;

const RO: Decision = Decision::Begin { read_only: true };
const RW: Decision = Decision::Begin { read_only: false };
const PIN: Decision = Decision::Pin("temporary table");

/// One row: a name, the facts, and the expected (target, pins, may write).
type Row = (&'static str, Facts, Target, bool, bool);

fn with(decision: Decision, change: impl FnOnce(&mut Facts)) -> Facts {
    let mut f = Facts::idle(decision);
    change(&mut f);
    f
}

fn rows() -> Vec<Row> {
    use Decision::*;
    let deferred = |read_only| move |f: &mut Facts| f.txn = super::Txn::Deferred { read_only };
    let open = |f: &mut Facts| {
        f.txn = super::Txn::Open;
        f.attached = true;
    };
    let pinned = |f: &mut Facts| {
        f.pinned = true;
        f.attached = true;
    };
    vec![
        // Outside a transaction: reads leave the primary, the rest does not.
        ("read", Facts::idle(Read), REPLICA, false, false),
        ("write", Facts::idle(Write), PRIMARY, false, true),
        ("primary read", Facts::idle(Primary), PRIMARY, false, true),
        ("unknown", Facts::idle(Unknown), PRIMARY, false, true),
        ("set", Facts::idle(Set), PRIMARY, false, true),
        ("txn control", Facts::idle(Txn), PRIMARY, false, true),
        (
            "txn read only",
            Facts::idle(TxnReadOnly),
            REPLICA,
            false,
            true,
        ),
        ("end", Facts::idle(End), PRIMARY, false, true),
        ("begin rw", Facts::idle(RW), PRIMARY, false, true),
        ("begin ro", Facts::idle(RO), REPLICA, false, true),
        ("pin", Facts::idle(PIN), PRIMARY, true, true),
        // An unfinished unit may still write.
        (
            "partial read",
            with(Read, |f| f.complete = false),
            PRIMARY,
            false,
            true,
        ),
        (
            "partial begin ro",
            with(RO, |f| f.complete = false),
            PRIMARY,
            false,
            true,
        ),
        // A unit that only prepares writes nothing, wherever it goes.
        (
            "prepare a write",
            with(Write, |f| f.executes = false),
            PRIMARY,
            false,
            false,
        ),
        (
            "prepare a read",
            with(Read, |f| f.executes = false),
            REPLICA,
            false,
            false,
        ),
        // default_route places what the parser could not read.
        (
            "unknown to replica",
            with(Unknown, |f| f.default_route = DefaultRoute::Replica),
            REPLICA,
            false,
            false,
        ),
        (
            "unknown to primary",
            with(Unknown, |f| f.default_route = DefaultRoute::Primary),
            PRIMARY,
            false,
            true,
        ),
        (
            "write ignores default_route",
            with(Write, |f| f.default_route = DefaultRoute::Replica),
            PRIMARY,
            false,
            true,
        ),
        (
            "partial unknown, replica default",
            with(Unknown, |f| {
                f.default_route = DefaultRoute::Replica;
                f.complete = false;
            }),
            PRIMARY,
            false,
            true,
        ),
        // A transaction Fulcrum deferred: its first statement picks the server.
        (
            "deferred ro, read",
            with(Read, deferred(true)),
            REPLICA,
            false,
            false,
        ),
        (
            "deferred ro, set local",
            with(Txn, deferred(true)),
            REPLICA,
            false,
            false,
        ),
        (
            "deferred ro, set",
            with(Set, deferred(true)),
            REPLICA,
            false,
            false,
        ),
        (
            "deferred ro, commit",
            with(End, deferred(true)),
            REPLICA,
            false,
            false,
        ),
        (
            "deferred ro, write",
            with(Write, deferred(true)),
            PRIMARY,
            false,
            true,
        ),
        (
            "deferred ro, primary read",
            with(Primary, deferred(true)),
            PRIMARY,
            false,
            true,
        ),
        (
            "deferred ro, unknown",
            with(Unknown, deferred(true)),
            PRIMARY,
            false,
            true,
        ),
        (
            "deferred ro, pin",
            with(PIN, deferred(true)),
            PRIMARY,
            true,
            true,
        ),
        (
            "deferred rw, read",
            with(Read, deferred(false)),
            PRIMARY,
            false,
            true,
        ),
        (
            "deferred rw, write",
            with(Write, deferred(false)),
            PRIMARY,
            false,
            true,
        ),
        (
            "deferred rw, only prepares",
            with(Read, |f| {
                f.txn = super::Txn::Deferred { read_only: false };
                f.executes = false;
            }),
            PRIMARY,
            false,
            false,
        ),
        (
            "deferred ro, partial",
            with(Read, |f| {
                f.txn = super::Txn::Deferred { read_only: true };
                f.complete = false;
            }),
            PRIMARY,
            false,
            true,
        ),
        // Inside a transaction or pinned: the same connection, whatever it is.
        ("open, read", with(Read, open), STAY, false, false),
        ("open, write", with(Write, open), STAY, false, true),
        ("open, end", with(End, open), STAY, false, true),
        ("open, pin", with(PIN, open), STAY, true, true),
        ("pinned, read", with(Read, pinned), STAY, false, false),
        ("pinned, write", with(Write, pinned), STAY, false, true),
        ("pinned, another pin", with(PIN, pinned), STAY, false, true),
        ("pinned, begin ro", with(RO, pinned), STAY, false, true),
        (
            "pinned, not attached",
            with(Read, |f| f.pinned = true),
            PRIMARY,
            false,
            false,
        ),
        (
            "open, not attached",
            with(Read, |f| f.txn = super::Txn::Open),
            PRIMARY,
            false,
            false,
        ),
        // Read-your-writes: a position not learnt keeps session reads on the primary.
        (
            "blind session read",
            with(Read, |f| f.position_unknown = true),
            PRIMARY,
            false,
            false,
        ),
        (
            "blind eventual read",
            with(Read, |f| {
                f.position_unknown = true;
                f.session = Consistency::Eventual;
            }),
            REPLICA,
            false,
            false,
        ),
        (
            "blind strong read",
            with(Read, |f| {
                f.position_unknown = true;
                f.session = Consistency::Strong;
            }),
            REPLICA,
            false,
            false,
        ),
        (
            "blind read, eventual hint",
            with(Read, |f| {
                f.position_unknown = true;
                f.hint = Some(Consistency::Eventual);
            }),
            REPLICA,
            false,
            false,
        ),
        (
            "blind read, session hint",
            with(Read, |f| {
                f.position_unknown = true;
                f.session = Consistency::Eventual;
                f.hint = Some(Consistency::Session);
            }),
            PRIMARY,
            false,
            false,
        ),
        (
            "blind write",
            with(Write, |f| f.position_unknown = true),
            PRIMARY,
            false,
            true,
        ),
        (
            "blind deferred ro read",
            with(Read, |f| {
                f.position_unknown = true;
                f.txn = super::Txn::Deferred { read_only: true };
            }),
            PRIMARY,
            false,
            false,
        ),
        (
            "blind begin ro",
            with(RO, |f| f.position_unknown = true),
            PRIMARY,
            false,
            true,
        ),
        (
            "known position read",
            with(Read, |f| f.session = Consistency::Session),
            REPLICA,
            false,
            false,
        ),
        (
            "strong read",
            with(Read, |f| f.session = Consistency::Strong),
            REPLICA,
            false,
            false,
        ),
        (
            "eventual read",
            with(Read, |f| f.session = Consistency::Eventual),
            REPLICA,
            false,
            false,
        ),
        (
            "strong hint on a write",
            with(Write, |f| f.hint = Some(Consistency::Strong)),
            PRIMARY,
            false,
            true,
        ),
        // Attached outside a transaction (e.g. held for the position query):
        // the unit is routed afresh.
        (
            "attached idle, read",
            with(Read, |f| f.attached = true),
            REPLICA,
            false,
            false,
        ),
        (
            "attached idle, write",
            with(Write, |f| f.attached = true),
            PRIMARY,
            false,
            true,
        ),
        // Classifications combined for a multi-statement unit.
        (
            "read then write",
            Facts::idle(Read.combine(Write)),
            PRIMARY,
            false,
            true,
        ),
        (
            "begin ro with reads",
            Facts::idle(RO.combine(Read)),
            REPLICA,
            false,
            true,
        ),
        (
            "begin ro with a write",
            Facts::idle(RO.combine(Write)),
            PRIMARY,
            false,
            true,
        ),
        (
            "begin ro with a primary read",
            Facts::idle(RO.combine(Primary)),
            PRIMARY,
            false,
            true,
        ),
        (
            "begin, set transaction read only",
            Facts::idle(RW.combine(TxnReadOnly)),
            REPLICA,
            false,
            true,
        ),
        (
            "read with a pin",
            Facts::idle(Read.combine(PIN)),
            PRIMARY,
            true,
            true,
        ),
        (
            "set with reads",
            Facts::idle(Set.combine(Read)),
            PRIMARY,
            false,
            true,
        ),
        (
            "unknown with a read",
            Facts::idle(Unknown.combine(Read)),
            PRIMARY,
            false,
            true,
        ),
    ]
}

#[test]
fn every_row_of_the_routing_table() {
    let rows = rows();
    assert!(rows.len() >= 60, "{} rows", rows.len());
    let mut failures = Vec::new();
    for (name, facts, target, pins, may_write) in &rows {
        let r = decide(facts);
        let got = (r.target, r.pin.is_some(), r.may_write);
        if got != (*target, *pins, *may_write) {
            failures.push(format!(
                "{name}: got {got:?}, want {:?}",
                (target, pins, may_write)
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn the_hint_wins_over_the_session_consistency() {
    let f = with(Decision::Read, |f| {
        f.session = Consistency::Eventual;
        f.hint = Some(Consistency::Strong);
    });
    assert_eq!(decide(&f).consistency, Consistency::Strong);
    assert_eq!(
        decide(&Facts::idle(Decision::Read)).consistency,
        Consistency::Session
    );
}

#[test]
fn a_pin_names_its_reason_once() {
    assert_eq!(
        decide(&Facts::idle(PIN)).pin,
        Some("temporary table"),
        "first pin"
    );
    assert_eq!(
        decide(&with(PIN, |f| f.pinned = true)).pin,
        None,
        "already pinned"
    );
}
