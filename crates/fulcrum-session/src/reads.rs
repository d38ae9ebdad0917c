//! A client's read consistency (docs/consistency.md), written once for both
//! protocols: the session's mode (`SET fulcrum.consistency`), the unit's
//! hint, the position its reads must not be older than (its own writes, a
//! causal token, its user's writes under `user`), and the one check that
//! decides whether a replica may serve a read.
//!
//! The protocol gives only what is its own, through two small traits: how
//! a position reads and compares ([`Position`]: a PostgreSQL LSN, a MariaDB
//! GTID) and how a replica's connection is asked whether it has replayed
//! one ([`ReplicaProbe`]). Everything else, the order of the steps and the
//! metrics they count, is here.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fulcrum_config::{Cluster, Consistency};
use fulcrum_metrics::{CausalOutcome, ClusterMetrics};
use fulcrum_pool::{when_behind_now, BackendId, Causal, Need, Router, UserNeed, WhenBehind};
use fulcrum_sql::consistency::{hinted, hinted_after, SettingOp};

/// A protocol's commit positions: how one reads and how two compare.
pub trait Positions {
    /// A PostgreSQL LSN, a MariaDB GTID list.
    type P: Clone + PartialEq;
    /// Whether `a` is past `b`.
    fn newer(a: &Self::P, b: &Self::P) -> bool;
    /// Reads a position a client wrote (a hint, a causal token); `None`
    /// when it is not one.
    fn parse(text: &str) -> Option<Self::P>;
    /// Nothing committed yet: every replica has it.
    fn is_origin(_position: &Self::P) -> bool {
        false
    }
}

/// Asks a replica's connection about its replay position.
pub trait ReplicaProbe<P> {
    /// Whether the replica has replayed `position`, waiting up to `wait`
    /// for it (`Duration::ZERO`: answer now); `None` when it could not be
    /// asked (the read then goes to the primary).
    fn reached(&mut self, position: &P, wait: Duration) -> impl Future<Output = Option<bool>>;
}

/// Where a checked read runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// The replica may serve it.
    Serve,
    /// It is behind (or could not say): the read runs on the primary.
    Primary,
}

/// What a client's `SET/RESET/SHOW fulcrum.consistency` is answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingAnswer {
    Set,
    Reset,
    /// The current mode's name.
    Show(&'static str),
    /// Not a mode: the value the client gave, and the modes there are.
    Invalid {
        value: String,
        names: String,
    },
}

/// The cluster-wide parts a check reads: one per cluster, borrowed per call.
pub struct Shared<'a, P> {
    pub config: &'a Cluster,
    pub router: &'a Router,
    pub metrics: &'a ClusterMetrics,
    pub user_positions: &'a fulcrum_pool::UserPositions<P>,
    /// The client's user and database (MariaDB: schema), the key of its
    /// user's positions.
    pub user: &'a Arc<str>,
    pub database: &'a Arc<str>,
}

/// One client's read consistency, its positions read by `K`.
#[derive(Debug, Clone)]
pub struct Reads<K: Positions> {
    /// The cluster's mode, what `RESET` returns to.
    configured: Consistency,
    /// The session's mode.
    session: Consistency,
    /// The unit's own hint.
    unit: Option<Consistency>,
    causal: Causal<K::P>,
}

impl<K: Positions> Reads<K> {
    pub fn new(configured: Consistency) -> Reads<K> {
        Reads {
            configured,
            session: configured,
            unit: None,
            causal: Causal::default(),
        }
    }

    /// The session's mode.
    pub fn session(&self) -> Consistency {
        self.session
    }

    /// The unit's hint, if it has one.
    pub fn hint(&self) -> Option<Consistency> {
        self.unit
    }

    /// The mode the unit being routed reads with.
    pub fn for_unit(&self) -> Consistency {
        self.unit.unwrap_or(self.session)
    }

    /// The client wrote and its position could not be learnt: its reads
    /// need the primary.
    pub fn position_unknown(&self) -> bool {
        self.causal.need() == &Need::Unknown
    }

    /// What a binary upgrade carries of these reads to the new process:
    /// the session's mode and the position its reads respect.
    pub fn carried(&self) -> (Consistency, Need<K::P>) {
        (self.session, self.causal.need().clone())
    }

    /// Takes up what [`carried`](Self::carried) told, in the new process.
    pub fn resume(&mut self, session: Consistency, need: Need<K::P>) {
        self.session = session;
        match need {
            Need::At(p) => self.causal.at_least(p, K::newer),
            Need::Unknown => self.causal.wrote_unknown(),
            Need::Nothing => {}
        }
    }

    /// Notes the hints of the statement about to be routed:
    /// `fulcrum:consistency=...` for this unit, `fulcrum:after=...` for
    /// every read from now on.
    pub fn note_hint(&mut self, text: &[u8]) {
        self.unit = hinted(text).and_then(Consistency::from_name);
        if let Some(p) = hinted_after(text).and_then(K::parse) {
            self.causal.at_least(p, K::newer);
        }
    }

    /// Forgets the last unit's hint (a unit without statement text).
    pub fn clear_hint(&mut self) {
        self.unit = None;
    }

    /// `SET/RESET/SHOW fulcrum.consistency`.
    pub fn setting(&mut self, op: SettingOp<'_>) -> SettingAnswer {
        match op {
            SettingOp::Set(name) => match Consistency::from_name(name) {
                Some(c) => {
                    self.session = c;
                    SettingAnswer::Set
                }
                None => SettingAnswer::Invalid {
                    value: name.to_owned(),
                    names: Consistency::NAMES
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", "),
                },
            },
            SettingOp::Reset => {
                self.session = self.configured;
                SettingAnswer::Reset
            }
            SettingOp::Show => SettingAnswer::Show(self.session.name()),
        }
    }

    /// `SET fulcrum.min_position`: the reads respect `text` from now on;
    /// false when it is not a position.
    pub fn set_min_position(&mut self, text: &str) -> bool {
        match K::parse(text) {
            Some(p) => {
                self.causal.at_least(p, K::newer);
                true
            }
            None => false,
        }
    }

    /// The position this session's reads respect (the causal token), if it
    /// tracks one: its own writes', and under `user` its user's, whichever
    /// is newer. `None`: the caller answers the primary's current position.
    pub fn token(&self, shared: &Shared<'_, K::P>) -> Option<K::P> {
        let own = match self.causal.need() {
            Need::At(p) if self.session.tracks_writes() => Some(p.clone()),
            _ => None,
        };
        let user = match shared.user_positions.get(shared.user, shared.database) {
            UserNeed::At(p) if self.session == Consistency::User => Some(p),
            _ => None,
        };
        match (own, user) {
            (Some(a), Some(b)) => Some(if K::newer(&b, &a) { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    /// Whether a unit's commit position is worth learning after it wrote.
    pub fn tracks_writes(&self) -> bool {
        self.session.tracks_writes()
    }

    /// A write's answer is about to reach the client before its position
    /// is known: under `user`, the user's other connections read on the
    /// primary until it is.
    pub fn learning(&self, shared: &Shared<'_, K::P>) {
        if self.session == Consistency::User {
            shared
                .user_positions
                .begin(shared.user, shared.database, shared.config.causal_timeout);
        }
    }

    /// The position of the client's write, learnt (`None`: it could not
    /// be), settling what [`Reads::learning`] began.
    pub fn learnt(&mut self, shared: &Shared<'_, K::P>, position: Option<K::P>) {
        let user = self.session == Consistency::User;
        match position {
            Some(p) => {
                if user {
                    shared.user_positions.advance(
                        shared.user,
                        shared.database,
                        p.clone(),
                        K::newer,
                    );
                }
                self.causal.wrote(p);
            }
            None => {
                self.causal.wrote_unknown();
                if user {
                    shared.user_positions.abandon(shared.user, shared.database);
                }
            }
        }
    }

    /// A begun write turned out to have nothing new to learn (its position
    /// is the one the client already has).
    pub fn nothing_learnt(&self, shared: &Shared<'_, K::P>) {
        if self.session == Consistency::User {
            shared.user_positions.abandon(shared.user, shared.database);
        }
    }

    /// The position the client needs, if any (what it wrote last).
    pub fn need(&self) -> &Need<K::P> {
        self.causal.need()
    }

    /// [`Reads::check`]'s `Serve` when it asks no one: an eventual read,
    /// or a `session` one with no position `backend` must still be seen
    /// at (counted as `check` counts it). False, with nothing counted,
    /// when `check` must run (`user` and `strong` always: the shared
    /// positions, the primary's); what it notes on the way (the primary)
    /// is noted again the same by `check`.
    pub fn serves_at_once(&mut self, shared: &Shared<'_, K::P>, backend: BackendId) -> bool {
        self.causal.note_primary(shared.router.primary());
        let serve = match self.for_unit() {
            Consistency::Eventual => true,
            Consistency::Session => {
                self.causal.position_for(backend).is_none() && !self.position_unknown()
            }
            Consistency::User | Consistency::Strong => false,
        };
        if serve && matches!(self.causal.need(), Need::At(_)) {
            shared.metrics.causal(CausalOutcome::Replica);
        }
        serve
    }

    /// May the replica `backend`, reached through `probe`, serve the read
    /// being routed? `strong` fetches the primary's position now (once for
    /// all the reads asking at the same time; called only under `strong`).
    /// Counts the outcome.
    pub async fn check<R, F>(
        &mut self,
        shared: &Shared<'_, K::P>,
        backend: BackendId,
        probe: &mut R,
        strong: impl FnOnce() -> F,
    ) -> Check
    where
        R: ReplicaProbe<K::P>,
        F: Future<Output = Option<K::P>>,
    {
        self.causal.note_primary(shared.router.primary());
        let mode = self.for_unit();
        if mode == Consistency::User {
            // Any connection of the user may have written since.
            match shared.user_positions.get(shared.user, shared.database) {
                UserNeed::At(p) => self.causal.at_least(p, K::newer),
                UserNeed::Pending => {
                    shared.metrics.causal(CausalOutcome::Primary);
                    return Check::Primary;
                }
                UserNeed::Nothing => {}
            }
        }
        let position = match mode {
            Consistency::Eventual => return Check::Serve,
            Consistency::Session | Consistency::User => match self.causal.position_for(backend) {
                Some(p) => p.clone(),
                None if self.position_unknown() => return Check::Primary,
                None => {
                    if matches!(self.causal.need(), Need::At(_)) {
                        shared.metrics.causal(CausalOutcome::Replica);
                    }
                    return Check::Serve;
                }
            },
            Consistency::Strong => match strong().await {
                Some(p) if K::is_origin(&p) => return Check::Serve,
                Some(p) => p,
                None => return Check::Primary,
            },
        };
        let outcome = match probe.reached(&position, Duration::ZERO).await {
            None => return Check::Primary,
            Some(true) => Some(CausalOutcome::Replica),
            Some(false) => {
                let choice = when_behind_now(
                    shared.config.causal_wait.forced(),
                    shared.router,
                    shared.config.pool_size as usize,
                );
                match choice {
                    WhenBehind::Primary => None,
                    WhenBehind::Wait => {
                        match probe.reached(&position, shared.config.causal_timeout).await {
                            Some(true) => Some(CausalOutcome::Waited),
                            _ => None,
                        }
                    }
                }
            }
        };
        match outcome {
            Some(outcome) => {
                if mode.tracks_writes() {
                    self.causal.verified(backend);
                }
                shared.metrics.causal(outcome);
                Check::Serve
            }
            None => {
                shared.metrics.causal(CausalOutcome::Primary);
                Check::Primary
            }
        }
    }
}

#[cfg(test)]
#[path = "reads/tests.rs"]
mod tests;
