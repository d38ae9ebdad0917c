//! The transition table behind [`Engine::step`]: one function per event
//! (in the order `step` lists them), each matching the phase the event
//! arrives in and returning the next phase with the actions to perform.
//! Every phase is listed in every function, not a wildcard: a new phase
//! does not compile until it is placed. A phase an event changes nothing
//! in is listed last (e.g. a Ready for Fulcrum's own query after the
//! client's unit was already settled).

use fulcrum_pool::Route;

use super::{Action, Actions, Ending, Engine, Loss, Outcome, Owed, Phase, Resolution, Status};
use crate::route::{Routing, Target};

/// The next phase and what to do, in order.
type Step = (Phase, Actions);

impl Engine {
    /// SIGTERM: the drain is noted; a client at a boundary is closed now.
    pub(super) fn on_drain(&mut self) -> Step {
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

    /// A unit placed by `route::decide`: attached, ridden along on the
    /// connection in flight, held behind it, or pinning the client.
    pub(super) fn on_unit(&self, r: Routing) -> Step {
        use Phase::*;
        match self.phase {
            // A unit from a client without a server connection.
            Idle | Deferred { .. } => {
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
            // A unit pipelined behind one in flight outside a transaction.
            // Only the position is owed: a read waits for it (then goes to
            // a replica that has it); anything else rides along.
            Settling => match (r.target, r.pin) {
                (Target::Go(Route::Replica), _) => (self.phase, Actions::one(Action::Hold)),
                (_, Some(reason)) => (Pinned(reason), Actions::none()),
                _ => (
                    Busy {
                        route: Route::Primary,
                    },
                    Actions::none(),
                ),
            },
            Busy { route } => match (r.target, r.pin) {
                (_, Some(reason)) if route == Route::Primary => (Pinned(reason), Actions::none()),
                (Target::Go(Route::Primary), _) if route == Route::Replica => {
                    (self.phase, Actions::one(Action::Hold))
                }
                (_, Some(_)) => (self.phase, Actions::one(Action::Hold)),
                _ => (self.phase, Actions::none()),
            },
            InTransaction { .. } => match r.pin {
                Some(reason) => (Pinned(reason), Actions::none()),
                None => (self.phase, Actions::none()),
            },
            // A pinned client holds its connection (`Stay`); one pinned
            // before it had any (session pooling) attaches it now.
            Pinned(_) => match r.target {
                Target::Go(route) => (self.phase, Actions::one(Action::Attach(route))),
                Target::Stay => (self.phase, Actions::none()),
            },
            Lost { .. } | Replaying | Resolving => (self.phase, Actions::none()),
        }
    }

    /// Fulcrum answered `BEGIN` (or `SET TRANSACTION`) itself.
    pub(super) fn on_deferred(&self, read_only: bool) -> Step {
        use Phase::*;
        match self.phase {
            Idle | Deferred { .. } => (Deferred { read_only }, Actions::none()),
            Busy { .. }
            | Settling
            | InTransaction { .. }
            | Pinned(_)
            | Lost { .. }
            | Replaying
            | Resolving => (self.phase, Actions::none()),
        }
    }

    /// The deferred transaction ended before any statement ran.
    pub(super) fn on_deferred_ended(&mut self) -> Step {
        use Phase::*;
        match self.phase {
            Deferred { .. } => {
                self.begin.clear();
                (Idle, self.boundary(Actions::none()))
            }
            Idle
            | Busy { .. }
            | Settling
            | InTransaction { .. }
            | Pinned(_)
            | Lost { .. }
            | Replaying
            | Resolving => (self.phase, Actions::none()),
        }
    }

    /// The unit's connection was checked out from a backend of `route`.
    pub(super) fn on_attached(&self, route: Route) -> Step {
        use Phase::*;
        match self.phase {
            Busy { .. } => (Busy { route }, Actions::none()),
            Idle
            | Deferred { .. }
            | Settling
            | InTransaction { .. }
            | Pinned(_)
            | Lost { .. }
            | Replaying
            | Resolving => (self.phase, Actions::none()),
        }
    }

    /// Session state that cannot be replayed was set: the client keeps
    /// its connection.
    pub(super) fn on_pin(&self, reason: fulcrum_sql::PinReason) -> Step {
        use Phase::*;
        match self.phase {
            Idle | Busy { .. } | Settling | InTransaction { .. } => {
                (Pinned(reason), Actions::none())
            }
            Deferred { .. } | Pinned(_) | Lost { .. } | Replaying | Resolving => {
                (self.phase, Actions::none())
            }
        }
    }

    /// The server answered, with its transaction status and what the
    /// connection still owes (`step` has recorded both already).
    pub(super) fn on_ready(&self, status: Status, owed: Owed) -> Step {
        use Phase::*;
        match self.phase {
            Busy { .. } | InTransaction { .. } | Settling => match (status, owed) {
                (Status::InTransaction, _) => (InTransaction { failed: false }, Actions::none()),
                (Status::Failed, _) => (InTransaction { failed: true }, Actions::none()),
                (Status::Idle, Owed::Client) => (self.phase, Actions::none()),
                (Status::Idle, Owed::OwnQuery) => (Settling, Actions::none()),
                (Status::Idle, Owed::Nothing) => {
                    (Idle, self.boundary(Actions::one(Action::Detach)))
                }
            },
            Pinned(_) => {
                let boundary = if self.quiet {
                    self.boundary(Actions::none())
                } else {
                    Actions::none()
                };
                (self.phase, boundary)
            }
            Idle | Deferred { .. } | Lost { .. } | Replaying | Resolving => {
                (self.phase, Actions::none())
            }
        }
    }

    /// The client's session state was reset: a pin whose state is gone is
    /// lifted and its connection goes back.
    pub(super) fn on_reset(&self) -> Step {
        use Phase::*;
        match self.phase {
            Pinned(_) => (Idle, self.boundary(Actions::one(Action::Detach))),
            Idle
            | Deferred { .. }
            | Busy { .. }
            | Settling
            | InTransaction { .. }
            | Lost { .. }
            | Replaying
            | Resolving => (self.phase, Actions::none()),
        }
    }

    /// A server lost under the client: replay, resolve, retry, answer a
    /// failure, or close, by what it had in flight (`l`).
    pub(super) fn on_loss(&self, l: Loss) -> Step {
        use Phase::*;
        match self.phase {
            Busy { .. } | InTransaction { failed: false } | Replaying
                if l.replayable && !l.commit_in_flight && !l.mid_message =>
            {
                (Replaying, Actions::one(Action::Replay))
            }
            Busy { .. } | InTransaction { failed: false }
                if l.replayable && l.commit_in_flight && l.commit_resolvable && !l.mid_message =>
            {
                (Resolving, Actions::one(Action::Resolve))
            }
            // The replayed COMMIT itself was in flight: it may have committed.
            Replaying if l.commit_in_flight => (
                Lost { in_txn: true },
                Actions::one(Action::Fail(Outcome::Unknown)),
            ),
            Replaying => (
                Lost { in_txn: true },
                Actions::one(Action::Fail(Outcome::NotCommitted)),
            ),
            Busy { .. } => {
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
            InTransaction { .. } => {
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
            Settling => (Idle, self.boundary(Actions::none())),
            Pinned(_) => (Idle, Actions::one(Action::Close(Ending::StateLost))),
            Idle | Deferred { .. } | Lost { .. } | Resolving => (self.phase, Actions::none()),
        }
    }

    /// The client ended its lost transaction.
    pub(super) fn on_lost_ended(&self) -> Step {
        use Phase::*;
        match self.phase {
            Lost { .. } => (Idle, self.boundary(Actions::none())),
            Idle
            | Deferred { .. }
            | Busy { .. }
            | Settling
            | InTransaction { .. }
            | Pinned(_)
            | Replaying
            | Resolving => (self.phase, Actions::none()),
        }
    }

    /// The replay's end: its answers matched (`failed` false: the
    /// transaction goes on on the new connection), or it cannot finish.
    pub(super) fn on_replay_end(&self, failed: bool) -> Step {
        use Phase::*;
        match self.phase {
            Replaying if failed => (
                Lost { in_txn: true },
                Actions::one(Action::Fail(Outcome::NotCommitted)),
            ),
            Replaying => (InTransaction { failed: false }, Actions::none()),
            Idle
            | Deferred { .. }
            | Busy { .. }
            | Settling
            | InTransaction { .. }
            | Pinned(_)
            | Lost { .. }
            | Resolving => (self.phase, Actions::none()),
        }
    }

    /// The new primary said what became of the COMMIT in flight.
    pub(super) fn on_resolved(&self, resolution: Resolution) -> Step {
        use Phase::*;
        match self.phase {
            Resolving => match resolution {
                Resolution::Committed => (Idle, self.boundary(Actions::none())),
                Resolution::NotCommitted => (Replaying, Actions::one(Action::Replay)),
                Resolution::Unknown => (
                    Lost { in_txn: true },
                    Actions::one(Action::Fail(Outcome::Unknown)),
                ),
            },
            Idle
            | Deferred { .. }
            | Busy { .. }
            | Settling
            | InTransaction { .. }
            | Pinned(_)
            | Lost { .. }
            | Replaying => (self.phase, Actions::none()),
        }
    }

    /// The client left: what its server connection needs first.
    pub(super) fn on_client_gone(&mut self) -> Step {
        use Phase::*;
        let clean = |rollback, reset| (Idle, Actions::one(Action::Clean { rollback, reset }));
        match self.phase {
            Replaying => clean(true, false),
            Busy { .. } | Settling => clean(false, false),
            InTransaction { .. } => clean(true, false),
            Pinned(_) => clean(true, true),
            Idle | Deferred { .. } | Lost { .. } | Resolving => {
                self.begin.clear();
                (Idle, Actions::none())
            }
        }
    }
}
