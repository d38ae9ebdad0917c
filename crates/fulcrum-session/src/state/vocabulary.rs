//! The engine's vocabulary: the events a front end feeds in (`Event`, with
//! what a lost server had in flight, `Loss`) and the actions that come out
//! (`Action`, `Actions`, the `Outcome` a failed unit is answered with and
//! why a session is ended, `Ending`).

use fulcrum_pool::Route;
use fulcrum_sql::PinReason;

use super::{Owed, Status};
use crate::route::Routing;

/// What was in flight when a server connection died.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Loss {
    /// A read on a replica outside a transaction whose answer has not
    /// started: it can be sent elsewhere.
    pub retryable: bool,
    /// A COMMIT, or a write outside a transaction, was in flight: it may
    /// have committed.
    pub commit_in_flight: bool,
    /// An extended-protocol batch is open (not synced): the client is
    /// answered as a failed batch up to its Sync.
    pub batch_open: bool,
    /// Part of a server message already went to the client: no clean answer
    /// can follow.
    pub mid_message: bool,
    /// The open transaction can be replayed on a new primary
    /// (`transaction_replay` is on and its statements were all kept, from
    /// the one that began it).
    pub replayable: bool,
    /// The COMMIT in flight has a known outcome source: its transaction's
    /// id was learnt ahead of it, and the new primary can say whether it
    /// committed (`Unit::commit_id`).
    pub commit_resolvable: bool,
}

/// What a new primary said of a transaction whose COMMIT was in flight
/// when its server died.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// It committed (or wrote nothing): the client gets its COMMIT's success.
    Committed,
    /// It did not commit (aborted by the crash, or never reached the new
    /// primary): it is replayed and committed there.
    NotCommitted,
    /// No answer: the client gets 08007, as without resolution.
    Unknown,
}

/// How a unit whose server died is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A read not answered (08006): retrying is safe.
    NotAnswered,
    /// The transaction was rolled back by the server's death (08006).
    NotCommitted,
    /// It may have committed (08007, transaction resolution unknown).
    Unknown,
}

impl Outcome {
    /// The SQLSTATE PostgreSQL clients expect for it (MySQL carries it too).
    pub fn sqlstate(self) -> &'static str {
        match self {
            Outcome::Unknown => "08007",
            Outcome::NotAnswered | Outcome::NotCommitted => "08006",
        }
    }

    /// What the client is told to do.
    pub fn advice(self) -> &'static str {
        match self {
            Outcome::NotAnswered => "the read was not answered: retry it",
            Outcome::NotCommitted => "the transaction was not committed: roll back and retry it",
            Outcome::Unknown => {
                "the transaction may or may not have committed: check before retrying it"
            }
        }
    }
}

/// Why a client session is ended by Fulcrum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Its server died and its state (pinned, session pooling, a message
    /// half sent) cannot be rebuilt elsewhere.
    StateLost,
    /// A drain reached the client at a transaction boundary.
    Drained,
}

/// Something that happened to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A unit arrived and `route::decide` placed it.
    Unit(Routing),
    /// Fulcrum answered `BEGIN` (or `SET TRANSACTION`) itself.
    Deferred { read_only: bool },
    /// Session state that cannot be replayed was set (LISTEN, a temporary
    /// table, SQL PREPARE, ...): the client keeps its connection.
    Pin(PinReason),
    /// The unit's connection was checked out, from a backend of this route
    /// (a `Replica` route may be served by the primary: `reads_on_primary`,
    /// or no replica available).
    Attached(Route),
    /// The deferred transaction ended before any statement ran.
    DeferredEnded,
    /// The server answered: its transaction status, and whether the
    /// connection still owes anything (pipelined work, Fulcrum's own query).
    Ready { status: Status, owed: Owed },
    /// The server connection died.
    ServerLost(Loss),
    /// The client ended its lost transaction.
    LostEnded,
    /// The replayed transaction's answers matched what the client had
    /// received: it goes on on the new connection.
    Replayed,
    /// The replay cannot finish: no primary in time, or an answer differed
    /// from what the client had received.
    ReplayFailed,
    /// The new primary said what became of the COMMIT in flight.
    Resolved(Resolution),
    /// The client's session state was reset (COM_RESET_CONNECTION, DISCARD
    /// ALL): a pin whose state is gone is lifted.
    Reset,
    /// SIGTERM: end the session at its next transaction boundary.
    Drain,
    /// The client went away.
    ClientGone,
}

/// What the front end must do. At most two per event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Check out a server connection of this route for the unit.
    Attach(Route),
    /// The next unit needs another connection: keep it buffered until the
    /// attached one has answered and gone back (no new wait: the server
    /// owes an answer).
    Hold,
    /// Return the server connection to the pool.
    Detach,
    /// Send the unit again to another backend (not the dead one).
    Retry,
    /// Send the open transaction's statements again, to the new primary.
    Replay,
    /// Ask the new primary whether the transaction whose COMMIT was in
    /// flight committed, then answer `Event::Resolved`.
    Resolve,
    /// Answer the work in flight with this outcome; the client stays.
    Fail(Outcome),
    /// End the session.
    Close(Ending),
    /// Before the connection goes back: roll back its transaction and/or
    /// reset its session (pinned state); a connection in the middle of a
    /// unit is closed instead (the server rolls back).
    Clean { rollback: bool, reset: bool },
}

/// A small list of actions, in order. Every action is carried out by the
/// front end: dropping the list unread is a compile error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[must_use = "the front end must carry out every action the engine returns"]
pub struct Actions(pub(super) [Option<Action>; 2]);

impl Actions {
    pub(super) fn none() -> Actions {
        Actions::default()
    }

    pub(super) fn one(a: Action) -> Actions {
        Actions([Some(a), None])
    }

    pub(super) fn two(a: Action, b: Action) -> Actions {
        Actions([Some(a), Some(b)])
    }

    /// Whether the event asked for nothing.
    pub fn is_empty(&self) -> bool {
        self.0[0].is_none()
    }

    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = Action> + '_ {
        self.0.iter().flatten().copied()
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, a: Action) -> bool {
        self.iter().any(|x| x == a)
    }
}

/// The actions in order, for the front end's executor to carry out each
/// (matching every variant).
impl IntoIterator for Actions {
    type Item = Action;
    type IntoIter = std::iter::Flatten<std::array::IntoIter<Option<Action>, 2>>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter().flatten()
    }
}
