//! From a decision and the client's session state to where the work runs.
//! Pure: the protocol front ends call it and do the I/O.

use crate::decision::Decision;

/// What the router knows about the client's session.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SessionState {
    /// The client is inside a transaction (server status 'T'/'E' or MySQL IN_TRANS).
    pub in_transaction: bool,
    /// The client is pinned to its server connection.
    pub pinned: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteTo {
    /// Stay on the server connection the client already has.
    Same,
    Primary,
    Replica,
}

/// Outside a transaction and unpinned: reads and read-only transactions may
/// use a replica, everything else the primary. Inside a transaction or when
/// pinned: the same server connection, whatever the statement.
pub fn route(decision: Decision, state: SessionState) -> RouteTo {
    if state.in_transaction || state.pinned {
        return RouteTo::Same;
    }
    if decision.needs_primary() {
        RouteTo::Primary
    } else {
        RouteTo::Replica
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_leave_the_primary_only_outside_transactions() {
        let idle = SessionState::default();
        assert_eq!(route(Decision::Read, idle), RouteTo::Replica);
        assert_eq!(
            route(Decision::Begin { read_only: true }, idle),
            RouteTo::Replica
        );
        assert_eq!(route(Decision::Write, idle), RouteTo::Primary);
        assert_eq!(route(Decision::Primary, idle), RouteTo::Primary);
        assert_eq!(route(Decision::Unknown, idle), RouteTo::Primary);
        let txn = SessionState {
            in_transaction: true,
            pinned: false,
        };
        assert_eq!(route(Decision::Read, txn), RouteTo::Same);
        let pinned = SessionState {
            in_transaction: false,
            pinned: true,
        };
        assert_eq!(route(Decision::Read, pinned), RouteTo::Same);
    }
}
