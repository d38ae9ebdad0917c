//! The life of a client between units of work, as one explicit state and
//! one transition function. The front ends feed it events (a unit placed by
//! `route::decide`, the server's transaction status, a lost server, the
//! client gone, a drain) and perform the actions it returns: attach,
//! detach, retry elsewhere, answer an error, close, clean a connection.
//! Pure: it knows no socket, no wire format and no SQL text.
//!
//! Every state that waits names what ends the wait: `Busy` and
//! `InTransaction` end with the server's answer or its loss; `Deferred` and
//! `Lost` are answered by Fulcrum itself; `Idle` waits for the client only.

use fulcrum_pool::Route;
use fulcrum_sql::{Decision, PinReason};

use crate::route::Target;
use crate::txn::{self, Deferral, DeferredTxn};

#[path = "state/unit_events.rs"]
mod unit_events;
#[path = "state/vocabulary.rs"]
mod vocabulary;
pub use vocabulary::{Action, Actions, Ending, Event, Loss, Outcome, Resolution};

/// Where the client is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No server connection, between units.
    Idle,
    /// `BEGIN` answered by Fulcrum; its first statement picks the server.
    Deferred { read_only: bool },
    /// A unit in flight outside a transaction, on a connection of `route`.
    Busy { route: Route },
    /// The client's unit is answered; only Fulcrum's own query (the commit
    /// position, for read-your-writes) is still owed on the primary.
    Settling,
    /// In a transaction on the attached connection (`failed`: aborted).
    InTransaction { failed: bool },
    /// Holds its server connection for the rest of the session.
    Pinned(PinReason),
    /// Its transaction (or batch) died with its server: Fulcrum answers it
    /// as a failed transaction until the client ends it.
    Lost { in_txn: bool },
    /// Its transaction died with its server before COMMIT was sent and is
    /// being sent again to a new primary (`transaction_replay`); the client
    /// sees nothing until the replayed answers match what it already got.
    Replaying,
    /// Its server died with its COMMIT in flight, the transaction's id
    /// known: the new primary is asked whether it committed (then the
    /// client gets the COMMIT's success, or the transaction is replayed).
    Resolving,
}

/// The transaction status a server reported with its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Idle,
    InTransaction,
    Failed,
}

/// What the server connection still owes after an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owed {
    Nothing,
    /// More of the client's pipelined work.
    Client,
    /// Only Fulcrum's own query.
    OwnQuery,
}

/// One client's engine: its phase, whether a drain is pending, and (for a
/// pinned client, which keeps its connection) whether that connection is
/// between transactions with nothing owed.
#[derive(Debug)]
pub struct Engine {
    phase: Phase,
    draining: bool,
    quiet: bool,
    /// In `Deferred`: the statements to send ahead of the transaction's
    /// first real one (`BEGIN ...; SET TRANSACTION ...`).
    begin: String,
    /// The unit in flight: may it write, did it on the primary, a COMMIT
    /// in flight, when it attached, its retry. Changed only through the
    /// events of `unit_events.rs`.
    unit: crate::unit::Unit,
    /// `transaction_replay`: the open transaction's client frames and the
    /// checksum of what the client received in it (disabled unless
    /// [`Engine::with_txn_log`] gave it a size).
    pub txn_log: crate::replay::TxnLog,
    /// The transaction status the client was last told: by the server's
    /// answer, or by Fulcrum answering in its place.
    status: Status,
}

impl Engine {
    /// A new client: idle (transaction pooling), or pinned for life
    /// (session pooling attaches at login).
    pub fn new(pinned: Option<PinReason>) -> Engine {
        Engine {
            phase: pinned.map_or(Phase::Idle, Phase::Pinned),
            draining: false,
            quiet: true,
            begin: String::new(),
            unit: crate::unit::Unit {
                may_write: true,
                ..Default::default()
            },
            txn_log: crate::replay::TxnLog::new(None, crate::replay::Framing::Whole),
            status: Status::Idle,
        }
    }

    /// The transaction status the client was last told.
    pub fn status(&self) -> Status {
        self.status
    }

    /// The client is told `status`: by an answer Fulcrum gives in the
    /// server's place, or by the server's own before the engine hears
    /// `Ready` (which also records it).
    pub fn told(&mut self, status: Status) {
        self.status = status;
    }

    /// The engine with `log` as its transaction log (`transaction_replay`).
    pub fn with_txn_log(mut self, log: crate::replay::TxnLog) -> Engine {
        self.txn_log = log;
        self
    }

    /// Fulcrum's answer to a lone transaction-control statement (`sql`,
    /// classified `decision`) from a client with no server connection;
    /// `None` when it must go to a server. Moves the phase to `Deferred`,
    /// keeps it there (the mode may change), or back to `Idle`.
    pub fn defer(&mut self, decision: Decision, sql: &str) -> Option<Deferral> {
        let mut current = match self.phase {
            Phase::Idle => None,
            Phase::Deferred { read_only } => Some(DeferredTxn {
                sql: std::mem::take(&mut self.begin),
                read_only,
            }),
            _ => return None,
        };
        let answer = txn::defer(decision, sql, current.as_mut());
        match (&answer, current) {
            (Some(Deferral::Opened(d)), _) => {
                self.begin = d.sql.clone();
                self.phase = Phase::Deferred {
                    read_only: d.read_only,
                };
            }
            (Some(Deferral::Ended(_)), _) => self.phase = Phase::Idle,
            (_, Some(d)) => {
                self.begin = d.sql;
                self.phase = Phase::Deferred {
                    read_only: d.read_only,
                };
            }
            (_, None) => {}
        }
        answer
    }

    /// The deferred `BEGIN ...` to send ahead of the unit just attached.
    pub fn take_begin(&mut self) -> Option<String> {
        (!self.begin.is_empty()).then(|| std::mem::take(&mut self.begin))
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The pin reason, if the client is pinned.
    pub fn pinned(&self) -> Option<PinReason> {
        match self.phase {
            Phase::Pinned(r) => Some(r),
            _ => None,
        }
    }

    /// A transaction Fulcrum answered BEGIN for, not yet on a server.
    pub fn deferred(&self) -> Option<bool> {
        match self.phase {
            Phase::Deferred { read_only } => Some(read_only),
            _ => None,
        }
    }

    pub fn is_lost(&self) -> bool {
        matches!(self.phase, Phase::Lost { .. })
    }

    pub fn draining(&self) -> bool {
        self.draining
    }

    /// Between transactions with no server work: where a drain may end the
    /// session (the front end adds: nothing of the client's buffered).
    pub fn at_boundary(&self) -> bool {
        match self.phase {
            Phase::Idle => true,
            Phase::Pinned(_) => self.quiet,
            _ => false,
        }
    }

    /// Applies `event`; returns what to do, in order.
    pub fn step(&mut self, event: Event) -> Actions {
        use Phase::*;
        match event {
            Event::Unit(_) => self.quiet = false,
            Event::Ready { status, owed } => {
                self.status = status;
                self.quiet = status == Status::Idle && owed == Owed::Nothing
            }
            _ => {}
        }
        let (next, actions) = match (self.phase, event) {
            (_, Event::Drain) => {
                self.draining = true;
                let close = self.at_boundary();
                (
                    self.phase,
                    if close {
                        Actions::one(Action::Close(Ending::Drained))
                    } else {
                        Actions::none()
                    },
                )
            }
            // A unit from a client without a server connection.
            (Idle | Deferred { .. }, Event::Unit(r)) => {
                let route = match r.target {
                    Target::Go(route) => route,
                    Target::Stay => Route::Primary,
                };
                let next = match r.pin {
                    Some(reason) => Pinned(reason),
                    None => Busy { route },
                };
                (next, Actions::one(Action::Attach(route)))
            }
            (Idle | Deferred { .. }, Event::Deferred { read_only }) => {
                (Deferred { read_only }, Actions::none())
            }
            (Deferred { .. }, Event::DeferredEnded) => {
                self.begin.clear();
                (Idle, self.boundary(Actions::none()))
            }
            // A unit pipelined behind one in flight outside a transaction.
            // Only the position is owed: a read waits for it (then goes to
            // a replica that has it); anything else rides along.
            (Settling, Event::Unit(r)) => match (r.target, r.pin) {
                (Target::Go(Route::Replica), _) => (self.phase, Actions::one(Action::Hold)),
                (_, Some(reason)) => (Pinned(reason), Actions::none()),
                _ => (
                    Busy {
                        route: Route::Primary,
                    },
                    Actions::none(),
                ),
            },
            (Busy { route }, Event::Unit(r)) => match (r.target, r.pin) {
                (_, Some(reason)) if route == Route::Primary => (Pinned(reason), Actions::none()),
                (Target::Go(Route::Primary), _) if route == Route::Replica => {
                    (self.phase, Actions::one(Action::Hold))
                }
                (_, Some(_)) => (self.phase, Actions::one(Action::Hold)),
                _ => (self.phase, Actions::none()),
            },
            (InTransaction { .. }, Event::Unit(r)) => match r.pin {
                Some(reason) => (Pinned(reason), Actions::none()),
                None => (self.phase, Actions::none()),
            },
            // A pinned client holds its connection (`Stay`); one pinned
            // before it had any (session pooling) attaches it now.
            (Pinned(_), Event::Unit(r)) => match r.target {
                Target::Go(route) => (self.phase, Actions::one(Action::Attach(route))),
                Target::Stay => (self.phase, Actions::none()),
            },
            (Busy { .. }, Event::Attached(route)) => (Busy { route }, Actions::none()),
            (Idle | Busy { .. } | Settling | InTransaction { .. }, Event::Pin(reason)) => {
                (Pinned(reason), Actions::none())
            }
            // The server's answers.
            (Busy { .. } | InTransaction { .. } | Settling, Event::Ready { status, owed }) => {
                match (status, owed) {
                    (Status::InTransaction, _) => {
                        (InTransaction { failed: false }, Actions::none())
                    }
                    (Status::Failed, _) => (InTransaction { failed: true }, Actions::none()),
                    (Status::Idle, Owed::Client) => (self.phase, Actions::none()),
                    (Status::Idle, Owed::OwnQuery) => (Settling, Actions::none()),
                    (Status::Idle, Owed::Nothing) => {
                        (Idle, self.boundary(Actions::one(Action::Detach)))
                    }
                }
            }
            (Pinned(_), Event::Ready { .. }) => {
                let boundary = if self.quiet {
                    self.boundary(Actions::none())
                } else {
                    Actions::none()
                };
                (self.phase, boundary)
            }
            (Pinned(_), Event::Reset) => (Idle, self.boundary(Actions::one(Action::Detach))),
            // A server lost under the client.
            (Busy { .. } | InTransaction { failed: false } | Replaying, Event::ServerLost(l))
                if l.replayable && !l.commit_in_flight && !l.mid_message =>
            {
                (Replaying, Actions::one(Action::Replay))
            }
            (Busy { .. } | InTransaction { failed: false }, Event::ServerLost(l))
                if l.replayable && l.commit_in_flight && l.commit_resolvable && !l.mid_message =>
            {
                (Resolving, Actions::one(Action::Resolve))
            }
            (Resolving, Event::Resolved(Resolution::Committed)) => {
                (Idle, self.boundary(Actions::none()))
            }
            (Resolving, Event::Resolved(Resolution::NotCommitted)) => {
                (Replaying, Actions::one(Action::Replay))
            }
            (Resolving, Event::Resolved(Resolution::Unknown)) => (
                Lost { in_txn: true },
                Actions::one(Action::Fail(Outcome::Unknown)),
            ),
            // The replayed COMMIT itself was in flight: it may have committed.
            (Replaying, Event::ServerLost(l)) if l.commit_in_flight => (
                Lost { in_txn: true },
                Actions::one(Action::Fail(Outcome::Unknown)),
            ),
            (Replaying, Event::ServerLost(_) | Event::ReplayFailed) => (
                Lost { in_txn: true },
                Actions::one(Action::Fail(Outcome::NotCommitted)),
            ),
            (Replaying, Event::Replayed) => (InTransaction { failed: false }, Actions::none()),
            (Replaying, Event::ClientGone) => (
                Idle,
                Actions::one(Action::Clean {
                    rollback: true,
                    reset: false,
                }),
            ),
            (Busy { .. }, Event::ServerLost(l)) => {
                if l.mid_message {
                    (Idle, Actions::one(Action::Close(Ending::StateLost)))
                } else if l.retryable {
                    (Idle, Actions::one(Action::Retry))
                } else {
                    let outcome = if l.commit_in_flight {
                        Outcome::Unknown
                    } else {
                        Outcome::NotAnswered
                    };
                    let next = if l.batch_open {
                        Lost { in_txn: false }
                    } else {
                        Idle
                    };
                    (next, Actions::one(Action::Fail(outcome)))
                }
            }
            (InTransaction { .. }, Event::ServerLost(l)) => {
                if l.mid_message {
                    (Idle, Actions::one(Action::Close(Ending::StateLost)))
                } else {
                    let outcome = if l.commit_in_flight {
                        Outcome::Unknown
                    } else {
                        Outcome::NotCommitted
                    };
                    (Lost { in_txn: true }, Actions::one(Action::Fail(outcome)))
                }
            }
            // Only Fulcrum's own query was in flight: the client is owed
            // nothing (its reads use the primary until it writes again).
            (Settling, Event::ServerLost(_)) => (Idle, self.boundary(Actions::none())),
            (Pinned(_), Event::ServerLost(_)) => {
                (Idle, Actions::one(Action::Close(Ending::StateLost)))
            }
            (Lost { .. }, Event::LostEnded) => (Idle, self.boundary(Actions::none())),
            // The client left: what its server connection needs first.
            (Busy { .. } | Settling, Event::ClientGone) => (
                Idle,
                Actions::one(Action::Clean {
                    rollback: false,
                    reset: false,
                }),
            ),
            (InTransaction { .. }, Event::ClientGone) => (
                Idle,
                Actions::one(Action::Clean {
                    rollback: true,
                    reset: false,
                }),
            ),
            (Pinned(_), Event::ClientGone) => (
                Idle,
                Actions::one(Action::Clean {
                    rollback: true,
                    reset: true,
                }),
            ),
            (Idle | Deferred { .. } | Lost { .. } | Resolving, Event::ClientGone) => {
                self.begin.clear();
                (Idle, Actions::none())
            }
            // Every other event changes nothing in the phase it arrives in
            // (e.g. a Ready for Fulcrum's own query after the client's unit
            // was already settled). Listed, not a wildcard: a new phase or
            // event does not compile until it is placed.
            (Lost { .. } | Replaying | Resolving, Event::Unit(_))
            | (
                Busy { .. }
                | Settling
                | InTransaction { .. }
                | Pinned(_)
                | Lost { .. }
                | Replaying
                | Resolving,
                Event::Deferred { .. },
            )
            | (
                Idle
                | Busy { .. }
                | Settling
                | InTransaction { .. }
                | Pinned(_)
                | Lost { .. }
                | Replaying
                | Resolving,
                Event::DeferredEnded,
            )
            | (
                Idle
                | Deferred { .. }
                | Settling
                | InTransaction { .. }
                | Pinned(_)
                | Lost { .. }
                | Replaying
                | Resolving,
                Event::Attached(_),
            )
            | (Deferred { .. } | Pinned(_) | Lost { .. } | Replaying | Resolving, Event::Pin(_))
            | (Idle | Deferred { .. } | Lost { .. } | Replaying | Resolving, Event::Ready { .. })
            | (
                Idle
                | Deferred { .. }
                | Busy { .. }
                | Settling
                | InTransaction { .. }
                | Lost { .. }
                | Replaying
                | Resolving,
                Event::Reset,
            )
            | (Idle | Deferred { .. } | Lost { .. } | Resolving, Event::ServerLost(_))
            | (
                Idle
                | Deferred { .. }
                | Busy { .. }
                | Settling
                | InTransaction { .. }
                | Pinned(_)
                | Replaying
                | Resolving,
                Event::LostEnded,
            )
            | (
                Idle
                | Deferred { .. }
                | Busy { .. }
                | Settling
                | InTransaction { .. }
                | Pinned(_)
                | Lost { .. }
                | Resolving,
                Event::Replayed | Event::ReplayFailed,
            )
            | (
                Idle
                | Deferred { .. }
                | Busy { .. }
                | Settling
                | InTransaction { .. }
                | Pinned(_)
                | Lost { .. }
                | Replaying,
                Event::Resolved(_),
            ) => (self.phase, Actions::none()),
        };
        self.phase = next;
        actions
    }

    /// Back at a boundary: a pending drain ends the session now.
    fn boundary(&self, actions: Actions) -> Actions {
        if !self.draining {
            return actions;
        }
        match actions.0[0] {
            Some(first) => Actions::two(first, Action::Close(Ending::Drained)),
            None => Actions::one(Action::Close(Ending::Drained)),
        }
    }
}

#[cfg(test)]
#[path = "state/tests.rs"]
mod tests;

#[cfg(test)]
#[path = "state/tests_span.rs"]
mod tests_span;

#[cfg(test)]
#[path = "state/tests_loss_rows.rs"]
mod tests_loss_rows;
