//! The transition table's rows for units that end abnormally: a server
//! lost (a replica read retried, a transaction replayed, a COMMIT in
//! flight resolved or failed), a client gone, a drain. `tests.rs` runs
//! them after its own rows, as one table.

use super::*;
use crate::state::tests::{lost, ready, Row, PRIMARY, REPLICA};

pub(super) fn loss_rows() -> Vec<Row> {
    use Action::*;
    use Phase::*;
    let busy_r = Busy { route: REPLICA };
    let busy_p = Busy { route: PRIMARY };
    let in_txn = InTransaction { failed: false };
    vec![
        (
            "replica read lost before its answer",
            busy_r,
            lost(|l| l.retryable = true),
            Idle,
            vec![Retry],
        ),
        (
            "read lost",
            busy_p,
            lost(|_| {}),
            Idle,
            vec![Fail(Outcome::NotAnswered)],
        ),
        (
            "autocommit write lost",
            busy_p,
            lost(|l| l.commit_in_flight = true),
            Idle,
            vec![Fail(Outcome::Unknown)],
        ),
        (
            "unsynced batch lost",
            busy_p,
            lost(|l| l.batch_open = true),
            Lost { in_txn: false },
            vec![Fail(Outcome::NotAnswered)],
        ),
        (
            "transaction lost",
            in_txn,
            lost(|_| {}),
            Lost { in_txn: true },
            vec![Fail(Outcome::NotCommitted)],
        ),
        (
            "commit lost",
            in_txn,
            lost(|l| l.commit_in_flight = true),
            Lost { in_txn: true },
            vec![Fail(Outcome::Unknown)],
        ),
        (
            "a retry is never attempted in a transaction",
            in_txn,
            lost(|l| l.retryable = true),
            Lost { in_txn: true },
            vec![Fail(Outcome::NotCommitted)],
        ),
        (
            "half a message sent",
            busy_r,
            lost(|l| {
                l.mid_message = true;
                l.retryable = true;
            }),
            Idle,
            vec![Close(Ending::StateLost)],
        ),
        (
            "pinned state lost",
            Pinned("x"),
            lost(|_| {}),
            Idle,
            vec![Close(Ending::StateLost)],
        ),
        ("own query lost", Settling, lost(|_| {}), Idle, vec![]),
        (
            "lost transaction ended",
            Lost { in_txn: true },
            Event::LostEnded,
            Idle,
            vec![],
        ),
        (
            "client gone mid-unit",
            busy_r,
            Event::ClientGone,
            Idle,
            vec![Clean {
                rollback: false,
                reset: false,
            }],
        ),
        (
            "client gone in a transaction",
            in_txn,
            Event::ClientGone,
            Idle,
            vec![Clean {
                rollback: true,
                reset: false,
            }],
        ),
        (
            "client gone pinned",
            Pinned("x"),
            Event::ClientGone,
            Idle,
            vec![Clean {
                rollback: true,
                reset: true,
            }],
        ),
        ("client gone idle", Idle, Event::ClientGone, Idle, vec![]),
        (
            "client gone deferred",
            Deferred { read_only: true },
            Event::ClientGone,
            Idle,
            vec![],
        ),
        (
            "drain when idle",
            Idle,
            Event::Drain,
            Idle,
            vec![Close(Ending::Drained)],
        ),
        (
            "drain in a transaction waits",
            in_txn,
            Event::Drain,
            in_txn,
            vec![],
        ),
        (
            "drain while deferred waits",
            Deferred { read_only: false },
            Event::Drain,
            Deferred { read_only: false },
            vec![],
        ),
        (
            "a replayable transaction is replayed",
            in_txn,
            lost(|l| l.replayable = true),
            Replaying,
            vec![Replay],
        ),
        (
            "the first statement of a replayable transaction in flight",
            busy_p,
            lost(|l| l.replayable = true),
            Replaying,
            vec![Replay],
        ),
        (
            "a COMMIT in flight is never replayed",
            in_txn,
            lost(|l| {
                l.replayable = true;
                l.commit_in_flight = true;
            }),
            Lost { in_txn: true },
            vec![Fail(Outcome::Unknown)],
        ),
        (
            "a COMMIT in flight whose transaction id is known is resolved",
            in_txn,
            lost(|l| {
                l.replayable = true;
                l.commit_in_flight = true;
                l.commit_resolvable = true;
            }),
            Resolving,
            vec![Resolve],
        ),
        (
            "a COMMIT in flight and half a message sent is never resolved",
            in_txn,
            lost(|l| {
                l.replayable = true;
                l.commit_in_flight = true;
                l.commit_resolvable = true;
                l.mid_message = true;
            }),
            Idle,
            vec![Close(Ending::StateLost)],
        ),
        (
            "a COMMIT that committed is the client's success",
            Resolving,
            Event::Resolved(Resolution::Committed),
            Idle,
            vec![],
        ),
        (
            "a COMMIT that did not commit is replayed",
            Resolving,
            Event::Resolved(Resolution::NotCommitted),
            Replaying,
            vec![Replay],
        ),
        (
            "a COMMIT nobody can resolve is 08007",
            Resolving,
            Event::Resolved(Resolution::Unknown),
            Lost { in_txn: true },
            vec![Fail(Outcome::Unknown)],
        ),
        (
            "the replayed COMMIT in flight may have committed",
            Replaying,
            lost(|l| {
                l.replayable = true;
                l.commit_in_flight = true;
            }),
            Lost { in_txn: true },
            vec![Fail(Outcome::Unknown)],
        ),
        (
            "client gone while resolving",
            Resolving,
            Event::ClientGone,
            Idle,
            vec![],
        ),
        (
            "drain while resolving waits",
            Resolving,
            Event::Drain,
            Resolving,
            vec![],
        ),
        (
            "a failed transaction is never replayed",
            InTransaction { failed: true },
            lost(|l| l.replayable = true),
            Lost { in_txn: true },
            vec![Fail(Outcome::NotCommitted)],
        ),
        (
            "half a message sent is never replayed",
            in_txn,
            lost(|l| {
                l.replayable = true;
                l.mid_message = true;
            }),
            Idle,
            vec![Close(Ending::StateLost)],
        ),
        (
            "the replay's own server lost: replay again",
            Replaying,
            lost(|l| l.replayable = true),
            Replaying,
            vec![Replay],
        ),
        (
            "the replay's server lost past its time",
            Replaying,
            lost(|_| {}),
            Lost { in_txn: true },
            vec![Fail(Outcome::NotCommitted)],
        ),
        (
            "a replay that matched goes on in the transaction",
            Replaying,
            Event::Replayed,
            in_txn,
            vec![],
        ),
        (
            "a replay that differed fails as the lost transaction did",
            Replaying,
            Event::ReplayFailed,
            Lost { in_txn: true },
            vec![Fail(Outcome::NotCommitted)],
        ),
        (
            "replayed answers change nothing until the replay ends",
            Replaying,
            ready(Status::Idle, Owed::Nothing),
            Replaying,
            vec![],
        ),
        (
            "client gone while replaying",
            Replaying,
            Event::ClientGone,
            Idle,
            vec![Clean {
                rollback: true,
                reset: false,
            }],
        ),
        (
            "drain while replaying waits",
            Replaying,
            Event::Drain,
            Replaying,
            vec![],
        ),
    ]
}
