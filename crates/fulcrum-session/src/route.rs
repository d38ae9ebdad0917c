//! The one routing decision of a unit of work: from what the unit is (its
//! statements classified and combined, in one classifier pass), where the
//! client stands (transaction, pin, attached connection) and the read rules
//! (consistency, `default_route`), to where it runs. Both front ends call
//! `decide` and nothing else decides a route. Pure: no I/O.
//!
//! `reads_on_primary` is not an input: it widens the set of backends the
//! router picks a `Replica` route from, and does not change the route.

use fulcrum_config::{Consistency, DefaultRoute};
use fulcrum_pool::Route;
use fulcrum_sql::{Decision, PinReason};

/// The client's transaction, as routing sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Txn {
    /// Not in a transaction.
    None,
    /// `BEGIN` answered by Fulcrum, no server chosen yet: the unit picks it.
    /// `read_only` after `BEGIN READ ONLY` / `SET TRANSACTION READ ONLY`,
    /// cleared again by `READ WRITE` or `SERIALIZABLE`.
    Deferred { read_only: bool },
    /// Open on the attached server connection.
    Open,
}

/// Everything the decision depends on, for one unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// The unit's statements, classified and combined (hints applied).
    pub decision: Decision,
    /// The whole unit is buffered; a unit still arriving may write later.
    pub complete: bool,
    /// The unit runs something (a query, an Execute); a unit that only
    /// prepares or describes writes nothing.
    pub executes: bool,
    pub txn: Txn,
    /// The client is pinned to its server connection already.
    pub pinned: bool,
    /// The client holds a server connection now.
    pub attached: bool,
    /// The unit's own `fulcrum:consistency` hint.
    pub hint: Option<Consistency>,
    /// The session's read consistency (`SET fulcrum.consistency`, else the cluster's).
    pub session: Consistency,
    /// The client wrote and its commit position could not be learnt.
    pub position_unknown: bool,
    pub default_route: DefaultRoute,
    /// The unit fills a result-cache entry: it reads on the primary, the
    /// one server sure to have every write the cache's table versions
    /// count (a replica may still lack one).
    pub cache_fill: bool,
}

impl Facts {
    /// A complete, executing unit of `decision` from an idle, unpinned
    /// client under session consistency: the common case, for building on.
    pub fn idle(decision: Decision) -> Facts {
        Facts {
            decision,
            complete: true,
            executes: true,
            txn: Txn::None,
            pinned: false,
            attached: false,
            hint: None,
            session: Consistency::Session,
            position_unknown: false,
            default_route: DefaultRoute::Primary,
            cache_fill: false,
        }
    }
}

/// Where the unit runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// On the server connection the client holds (in a transaction, pinned).
    Stay,
    /// On a connection of this route (the router picks the backend).
    Go(Route),
}

/// The decision for one unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Routing {
    pub target: Target,
    /// The unit pins the client from now on (state that cannot be replayed).
    pub pin: Option<PinReason>,
    /// The unit may write: on the primary, its commit position is learnt
    /// afterwards for read-your-writes.
    pub may_write: bool,
    /// What a replica serving the read must have seen.
    pub consistency: Consistency,
}

/// The effective classification: an unfinished unit counts as a write,
/// and an unparsable one goes where `default_route` says.
fn effective(f: &Facts) -> Decision {
    match f.decision {
        _ if !f.complete => Decision::Write,
        Decision::Unknown if f.default_route == DefaultRoute::Replica => Decision::Read,
        d => d,
    }
}

/// Statements a standby runs inside a read-only transaction.
fn standby_safe(d: Decision) -> bool {
    matches!(
        d,
        Decision::Read
            | Decision::Set
            | Decision::Txn
            | Decision::TxnReadOnly
            | Decision::End
            | Decision::Begin { .. }
    )
}

/// Decides where a unit runs. See docs/routing.md, "One decision per unit".
pub fn decide(f: &Facts) -> Routing {
    let decision = effective(f);
    let pin = match decision {
        Decision::Pin(reason) if !f.pinned => Some(reason),
        _ => None,
    };
    let consistency = f.hint.unwrap_or(f.session);
    let may_write = f.executes
        && match f.txn {
            Txn::Deferred { read_only: true } => !standby_safe(decision),
            Txn::Deferred { read_only: false } => true,
            _ => decision != Decision::Read,
        };
    let target = if f.attached && (f.pinned || f.txn == Txn::Open) {
        Target::Stay
    } else if f.pinned || pin.is_some() {
        Target::Go(Route::Primary)
    } else {
        let replica = match f.txn {
            Txn::Deferred { read_only } => read_only && standby_safe(decision),
            Txn::None => !decision.needs_primary(),
            // Open but not attached: it can only continue on the primary.
            Txn::Open => false,
        };
        // A read that must see the client's write, at a position not known:
        // only the primary is sure to have it.
        let blind = consistency.tracks_writes() && f.position_unknown;
        if replica && !blind && !f.cache_fill {
            Target::Go(Route::Replica)
        } else {
            Target::Go(Route::Primary)
        }
    };
    Routing {
        target,
        pin,
        may_write,
        consistency,
    }
}

#[cfg(test)]
#[path = "route/tests.rs"]
mod tests;
