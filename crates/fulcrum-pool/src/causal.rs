//! Read-your-writes bookkeeping for one client session (consistency
//! `session`, `user` and `strong`, docs/consistency.md): the position the
//! client's reads must not be older than, and the replicas already seen past
//! it, so a replica is asked at most once per write; and, for `user`, the
//! newest position each (user, database) of a cluster committed at, shared by
//! all its sessions. Protocol-neutral: the position is a PostgreSQL LSN or a
//! MariaDB GTID, compared by the protocol's `newer`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

    /// The reads must see at least `position` (another session's commit of
    /// the same user, a causal token): kept when `newer` than what they
    /// must see already. An unknown position (reads on the primary) stays.
    pub fn at_least(&mut self, position: P, newer: impl Fn(&P, &P) -> bool) {
        let raise = match &self.need {
            Need::Nothing => true,
            Need::At(q) => newer(&position, q),
            Need::Unknown => false,
        };
        if raise {
            self.wrote(position);
        }
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

/// `consistency = "user"`: per (user, database), the newest commit position
/// any session of the user reported, and the writes whose position is being
/// learnt. A write's session marks it [`UserPositions::begin`] before its
/// answer reaches the client and settles it once the position is known, so
/// a read on another connection in between goes to the primary instead of
/// missing it. Keys are bounded by the users who can log in; one short lock
/// per write and per read of such a session.
#[derive(Debug)]
pub struct UserPositions<P> {
    map: Mutex<HashMap<UserKey, UserEntry<P>>>,
}

/// (user, database).
type UserKey = (Arc<str>, Arc<str>);

#[derive(Debug)]
struct UserEntry<P> {
    position: Option<P>,
    /// Writes answered whose position is not known yet.
    pending: u32,
    /// After this, pending writes are forgotten (a session lost before its
    /// position came).
    pending_until: Instant,
}

/// What a read of the user must respect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserNeed<P> {
    Nothing,
    At(P),
    /// A write's position is being learnt: read on the primary.
    Pending,
}

impl<P> Default for UserPositions<P> {
    fn default() -> Self {
        UserPositions {
            map: Mutex::new(HashMap::new()),
        }
    }
}

impl<P: Clone> UserPositions<P> {
    fn with<R>(
        &self,
        user: &Arc<str>,
        database: &Arc<str>,
        f: impl FnOnce(&mut UserEntry<P>) -> R,
    ) -> R {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let entry = map
            .entry((user.clone(), database.clone()))
            .or_insert_with(|| UserEntry {
                position: None,
                pending: 0,
                pending_until: Instant::now(),
            });
        f(entry)
    }

    /// A write of `user` on `database` is answered; its position comes
    /// within `within` (else it is forgotten).
    pub fn begin(&self, user: &Arc<str>, database: &Arc<str>, within: Duration) {
        self.with(user, database, |e| {
            e.pending += 1;
            e.pending_until = Instant::now() + within;
        });
    }

    /// A write of `user` on `database` committed at `position` (settling
    /// one begun write, if any).
    pub fn advance(
        &self,
        user: &Arc<str>,
        database: &Arc<str>,
        position: P,
        newer: impl Fn(&P, &P) -> bool,
    ) {
        self.with(user, database, |e| {
            e.pending = e.pending.saturating_sub(1);
            match &e.position {
                Some(old) if !newer(&position, old) => {}
                _ => e.position = Some(position),
            }
        });
    }

    /// A begun write's position could not be learnt.
    pub fn abandon(&self, user: &Arc<str>, database: &Arc<str>) {
        self.with(user, database, |e| e.pending = e.pending.saturating_sub(1));
    }

    /// What a read of `user` on `database` must respect now.
    pub fn get(&self, user: &Arc<str>, database: &Arc<str>) -> UserNeed<P> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&(user.clone(), database.clone())) {
            None => UserNeed::Nothing,
            Some(e) if e.pending > 0 && Instant::now() < e.pending_until => UserNeed::Pending,
            Some(e) => e.position.clone().map_or(UserNeed::Nothing, UserNeed::At),
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
    fn at_least_raises_the_need_only_forward() {
        let newer = |a: &u64, b: &u64| a > b;
        let mut c = Causal::<u64>::default();
        c.at_least(50, newer);
        assert_eq!(c.need(), &Need::At(50));
        c.verified(1);
        c.at_least(40, newer);
        assert!(c.satisfied_on(1), "an older position changes nothing");
        c.at_least(60, newer);
        assert_eq!(c.position_for(1), Some(&60), "a newer one is checked again");
        c.wrote_unknown();
        c.at_least(70, newer);
        assert_eq!(c.need(), &Need::Unknown, "unknown stays on the primary");
    }

    #[test]
    fn user_positions_keep_the_newest_and_hold_reads_while_a_write_settles() {
        let newer = |a: &u64, b: &u64| a > b;
        let p = UserPositions::<u64>::default();
        let (app, other, db) = (Arc::from("app"), Arc::from("other"), Arc::from("db"));
        assert_eq!(p.get(&app, &db), UserNeed::Nothing);
        p.begin(&app, &db, Duration::from_secs(5));
        assert_eq!(
            p.get(&app, &db),
            UserNeed::Pending,
            "answered, position not known yet"
        );
        p.advance(&app, &db, 10, newer);
        assert_eq!(p.get(&app, &db), UserNeed::At(10));
        p.advance(&app, &db, 7, newer);
        assert_eq!(
            p.get(&app, &db),
            UserNeed::At(10),
            "an older commit reported late"
        );
        p.begin(&app, &db, Duration::from_secs(5));
        p.abandon(&app, &db);
        assert_eq!(
            p.get(&app, &db),
            UserNeed::At(10),
            "an abandoned one settles too"
        );
        assert_eq!(p.get(&other, &db), UserNeed::Nothing, "per user");
        p.begin(&other, &db, Duration::ZERO);
        assert_eq!(
            p.get(&other, &db),
            UserNeed::Nothing,
            "a lost session's write is forgotten in time"
        );
    }

    #[test]
    fn behind_replica_waits_only_when_the_primary_is_full_in_auto() {
        assert_eq!(when_behind(None, 3, 20), WhenBehind::Primary);
        assert_eq!(when_behind(None, 20, 20), WhenBehind::Wait);
        assert_eq!(when_behind(Some(true), 0, 20), WhenBehind::Wait);
        assert_eq!(when_behind(Some(false), 99, 20), WhenBehind::Primary);
    }
}
