//! The life of a client between units of work, as one explicit state and
//! one transition function. The front ends feed it events (a unit placed by
//! `route::decide`, the server's transaction status, a lost server, the
//! client gone, a drain) and perform the actions it returns: attach,
//! detach, retry elsewhere, answer an error, close, clean a connection.
//! The one other way the phase moves is `Engine::defer` (a lone BEGIN,
//! SET TRANSACTION or empty COMMIT Fulcrum answers itself, `Idle` to
//! `Deferred` and back). Pure: it knows no socket and no wire format, and
//! SQL text only as `defer` hands it to `txn`.
//!
//! Every state that waits names what ends the wait: `Busy` and
//! `InTransaction` end with the server's answer or its loss; `Deferred` and
//! `Lost` are answered by Fulcrum itself; `Idle` waits for the client only.

use fulcrum_pool::Route;
use fulcrum_sql::{Decision, PinReason};

use crate::txn::{self, Deferral, DeferredTxn};

#[path = "state/log_events.rs"]
mod log_events;
#[path = "state/transitions.rs"]
mod transitions;
#[path = "state/unit_events.rs"]
mod unit_events;
#[path = "state/vocabulary.rs"]
mod vocabulary;
pub use vocabulary::{Action, Actions, Ending, Event, Loss, Outcome, Resolution};

/// The pin of a session-pooled client, from its login on: no state it
/// left (`Engine::state_left` does not record it).
pub const SESSION_POOL: PinReason = "session pool mode";

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
    /// [`Engine::with_txn_log`] gave it a size). Changed only through the
    /// events of `log_events.rs`.
    txn_log: crate::replay::TxnLog,
    /// The transaction status the client was last told: by the server's
    /// answer, or by Fulcrum answering in its place.
    status: Status,
    /// The first state the client left on its server connection that
    /// Fulcrum cannot replay (a pin's reason): also for a client pinned
    /// from the start (session pooling), whose phase it does not change.
    state_left: Option<PinReason>,
    /// The attached connection stays for the next command only (MySQL:
    /// an insert's id may be asked next, `LAST_INSERT_ID()`); `Ready`
    /// then counts it as owed to the client.
    keep_next: bool,
    /// The server connection of a client idle in its transaction went
    /// away and was let go; the client's next command meets the loss.
    let_go: bool,
    /// Why Fulcrum gave the server connection up, when it did (a malformed
    /// or oversized message, a failed replay): words for the error that
    /// tells the client of the loss, said once.
    lost_because: Option<Box<str>>,
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
            state_left: None,
            keep_next: false,
            let_go: false,
            lost_because: None,
        }
    }

    /// The server connection of a client idle in its transaction went away
    /// and was given up at once (a SWITCHOVER waits for none): the client's
    /// next command handles the loss (a replay, or the error without one).
    pub fn server_let_go(&mut self) {
        self.let_go = true;
    }

    /// Whether the connection was let go under the client since its last
    /// command; the next command takes the news.
    pub fn take_let_go(&mut self) -> bool {
        std::mem::take(&mut self.let_go)
    }

    /// Fulcrum gives the server connection up, for `why` (its words for the
    /// error that tells the client of the loss).
    pub fn server_lost_because(&mut self, why: String) {
        self.lost_because = Some(why.into_boxed_str());
    }

    /// Why Fulcrum gave the server connection up, if it did; said once.
    pub fn take_lost_because(&mut self) -> Option<Box<str>> {
        self.lost_because.take()
    }

    /// The reason is moot: the unit goes again elsewhere (a retry, a
    /// replay), so no error will tell it.
    pub fn forget_lost_because(&mut self) {
        self.lost_because = None;
    }

    /// Whether a connection let go waits for the client's next command.
    pub fn was_let_go(&self) -> bool {
        self.let_go
    }

    /// A command goes to the attached connection: true when the last
    /// answer kept the connection for it ([`Engine::answer_keeps`]); the
    /// keep is used up.
    pub fn command_sent(&mut self) -> bool {
        std::mem::take(&mut self.keep_next)
    }

    /// The answer to a command says the next one may need this same
    /// connection (`keep`): it stays for that one command, unless this
    /// command was itself one kept for (`kept_for_this`), so a run of
    /// inserts cannot hold a connection for good.
    pub fn answer_keeps(&mut self, keep: bool, kept_for_this: bool) {
        self.keep_next = keep && !kept_for_this;
    }

    /// Whether the connection is kept for the next command only.
    pub fn kept_for_next(&self) -> bool {
        self.keep_next
    }

    /// The keep is dropped: the connection went away, was reset, or the
    /// command it was kept for has another way to its answer.
    pub fn drop_keep(&mut self) {
        self.keep_next = false;
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

    /// Fulcrum's answer to a lone transaction-control statement (`sql`,
    /// classified `decision`) from a client with no server connection;
    /// `None` when it must go to a server. The phase moves through the
    /// engine's own events (`Deferred` to open or keep the deferred
    /// transaction, its mode perhaps changed; `DeferredEnded` back to
    /// `Idle`), and what they ask (a pending drain's close at the
    /// boundary) is returned for the front end to carry out.
    pub fn defer(&mut self, decision: Decision, sql: &str) -> (Option<Deferral>, Actions) {
        let mut current = match self.phase {
            Phase::Idle => None,
            Phase::Deferred { read_only } => Some(DeferredTxn {
                sql: std::mem::take(&mut self.begin),
                read_only,
            }),
            _ => return (None, Actions::none()),
        };
        let answer = txn::defer(decision, sql, current.as_mut());
        let actions = match (&answer, current) {
            (Some(Deferral::Opened(d)), _) => {
                self.begin = d.sql.clone();
                self.step(Event::Deferred {
                    read_only: d.read_only,
                })
            }
            (Some(Deferral::Ended(_)), _) => self.step(Event::DeferredEnded),
            (_, Some(d)) => {
                self.begin = d.sql;
                self.step(Event::Deferred {
                    read_only: d.read_only,
                })
            }
            (_, None) => Actions::none(),
        };
        (answer, actions)
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

    /// The first state the client left on its server connection that
    /// Fulcrum cannot replay, if any (a pin's reason; for a session-pooled
    /// client, any pin after its login's).
    pub fn state_left(&self) -> Option<PinReason> {
        self.state_left
    }

    /// The statements a deferred transaction opened with (`BEGIN ...;
    /// SET TRANSACTION ...`), while it is deferred.
    pub fn deferred_begin(&self) -> Option<&str> {
        match self.phase {
            Phase::Deferred { .. } => Some(&self.begin),
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

    /// Applies `event`; returns what to do, in order. The transition
    /// table is in `transitions.rs`, one function per event.
    pub fn step(&mut self, event: Event) -> Actions {
        let (next, actions) = match event {
            Event::Drain => self.on_drain(),
            Event::Unit(r) => {
                self.quiet = false;
                if r.pin.is_some() {
                    self.state_left = self.state_left.or(r.pin);
                }
                self.on_unit(r)
            }
            Event::Deferred { read_only } => self.on_deferred(read_only),
            Event::DeferredEnded => self.on_deferred_ended(),
            Event::Attached(route) => self.on_attached(route),
            Event::Pin(reason) => {
                if reason != SESSION_POOL {
                    self.state_left = self.state_left.or(Some(reason));
                }
                self.on_pin(reason)
            }
            Event::Ready { status, owed } => {
                let owed = if self.keep_next && owed == Owed::Nothing {
                    Owed::Client
                } else {
                    owed
                };
                self.status = status;
                self.quiet = status == Status::Idle && owed == Owed::Nothing;
                self.on_ready(status, owed)
            }
            Event::Reset => {
                // What a reset clears, it clears for the cache's word too.
                self.state_left = None;
                self.on_reset()
            }
            Event::ServerLost(l) => self.on_loss(l),
            Event::LostEnded => self.on_lost_ended(),
            Event::Replayed => self.on_replay_end(false),
            Event::ReplayFailed => self.on_replay_end(true),
            Event::Resolved(resolution) => self.on_resolved(resolution),
            Event::ClientGone => self.on_client_gone(),
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
