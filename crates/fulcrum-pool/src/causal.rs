//! Read-your-writes bookkeeping for one client session (consistency
//! `session` and `strong`, docs/consistency.md): the position the client's
//! reads must not be older than, and the replicas already seen past it, so a
//! replica is asked at most once per write. Protocol-neutral: the position is
//! a PostgreSQL LSN or a MariaDB GTID, compared by the protocol's session.

use crate::BackendId;

/// What a read must see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need<P> {
    /// Nothing: the client has not written (or reads eventually).
    Nothing,
    /// Everything up to this position.
    At(P),
    /// The client wrote but its position could not be learnt: its reads go
    /// to the primary until its next write tells one.
    Unknown,
}

/// One session's causal state.
#[derive(Debug, Clone)]
pub struct Causal<P> {
    need: Need<P>,
    /// Backends (bit per id, ids below 64) seen at or past `need`.
    verified: u64,
    /// The primary when `verified` was filled.
    primary: Option<BackendId>,
}

impl<P> Default for Causal<P> {
    fn default() -> Self {
        Causal {
            need: Need::Nothing,
            verified: 0,
            primary: None,
        }
    }
}

impl<P: Clone> Causal<P> {
    /// The client's write committed at `position`.
    pub fn wrote(&mut self, position: P) {
        self.need = Need::At(position);
        self.verified = 0;
    }

    /// The client wrote, at a position Fulcrum could not learn.
    pub fn wrote_unknown(&mut self) {
        self.need = Need::Unknown;
        self.verified = 0;
    }

    pub fn need(&self) -> &Need<P> {
        &self.need
    }

    /// Whether a read on `backend` needs no check: nothing to respect, or
    /// the replica was already seen past the position.
    pub fn satisfied_on(&self, backend: BackendId) -> bool {
        match self.need {
            Need::Nothing => true,
            Need::Unknown => false,
            Need::At(_) => backend < 64 && self.verified & (1 << backend) != 0,
        }
    }

    /// The position `backend` was seen at or past (a replica only moves forward).
    pub fn verified(&mut self, backend: BackendId) {
        if backend < 64 {
            self.verified |= 1 << backend;
        }
    }

    /// The position `backend` must reach, if it has not been seen there.
    pub fn position_for(&self, backend: BackendId) -> Option<&P> {
        match &self.need {
            Need::At(p) if !self.satisfied_on(backend) => Some(p),
            _ => None,
        }
    }

    /// Forgets the replicas seen past the position (a failover changed the
    /// cluster: a replica may now follow another primary).
    pub fn forget_replicas(&mut self) {
        self.verified = 0;
    }

    /// Called before a check with the router's current primary: a change
    /// since the replicas were seen (a failover) forgets them.
    pub fn note_primary(&mut self, primary: Option<BackendId>) {
        if self.primary != primary {
            self.primary = primary;
            self.forget_replicas();
        }
    }
}

/// What to do with a read whose replica is behind its position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenBehind {
    /// Wait on the replica (up to the causal timeout), then use the primary.
    Wait,
    /// Read on the primary now.
    Primary,
}

/// The per-read choice: with `wait_always` (or `never`) the operator has
/// decided; in `auto` a read waits only when the primary has no free server
/// connection (`primary_load >= pool_size`): a primary with room answers now,
/// while a replica that is behind answers after at least its lag.
pub fn when_behind(policy: Option<bool>, primary_load: usize, pool_size: usize) -> WhenBehind {
    match policy {
        Some(true) => WhenBehind::Wait,
        Some(false) => WhenBehind::Primary,
        None if primary_load >= pool_size => WhenBehind::Wait,
        None => WhenBehind::Primary,
    }
}

/// [`when_behind`] with the primary's load read from `router`.
pub fn when_behind_now(
    policy: Option<bool>,
    router: &crate::Router,
    pool_size: usize,
) -> WhenBehind {
    let primary_load = router.primary().map_or(0, |p| router.load(p));
    when_behind(policy, primary_load, pool_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_needs_every_replica_checked_once() {
        let mut c = Causal::<u64>::default();
        assert!(c.satisfied_on(1), "no write: any replica");
        c.wrote(100);
        assert_eq!(c.position_for(1), Some(&100));
        c.verified(1);
        assert!(c.satisfied_on(1));
        assert_eq!(c.position_for(1), None);
        assert_eq!(
            c.position_for(2),
            Some(&100),
            "another replica is not known"
        );
        c.wrote(200);
        assert!(!c.satisfied_on(1), "a new write asks again");
    }

    #[test]
    fn an_unknown_position_is_never_satisfied_on_a_replica() {
        let mut c = Causal::<u64>::default();
        c.wrote_unknown();
        c.verified(1);
        assert!(!c.satisfied_on(1));
        assert_eq!(c.position_for(1), None);
        assert_eq!(c.need(), &Need::Unknown);
    }

    #[test]
    fn failover_forgets_checked_replicas() {
        let mut c = Causal::<u64>::default();
        c.wrote(5);
        c.verified(0);
        c.forget_replicas();
        assert!(!c.satisfied_on(0));
    }

    #[test]
    fn a_new_primary_forgets_checked_replicas() {
        let mut c = Causal::<u64>::default();
        c.note_primary(Some(0));
        c.wrote(5);
        c.verified(1);
        c.note_primary(Some(0));
        assert!(c.satisfied_on(1), "same primary: still known");
        c.note_primary(Some(2));
        assert!(!c.satisfied_on(1), "a failover: asked again");
    }

    #[test]
    fn behind_replica_waits_only_when_the_primary_is_full_in_auto() {
        assert_eq!(when_behind(None, 3, 20), WhenBehind::Primary);
        assert_eq!(when_behind(None, 20, 20), WhenBehind::Wait);
        assert_eq!(when_behind(Some(true), 0, 20), WhenBehind::Wait);
        assert_eq!(when_behind(Some(false), 99, 20), WhenBehind::Primary);
    }
}
