//! Backend selection: a statement's route (primary or replica) goes in, a
//! backend index comes out. Replica reads are spread over the readers (the
//! backends that may serve reads now, plus the primary when
//! `reads_on_primary`) by the cluster's `Balance` policy; readers with weight
//! 0 get no reads; when no reader is left reads go to the primary.
//!
//! The health loop (`fulcrum-cluster`) publishes what it learns here: which
//! backend is the primary (none while a failover is under way) and which may
//! serve reads. Sessions report trouble back with `suspect`, which takes the
//! backend out of reads at once and wakes the health loop. Picking is atomics
//! only, except the short lock of smooth weighted round robin; it never waits
//! on health-check I/O.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use crate::balance::{ewma_update, Balance};

pub use pause::Admission;

/// Index of a backend in its cluster's configuration order.
pub type BackendId = usize;

/// Where a unit of work must run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// Writes, transactions, anything that must see the primary.
    Primary,
    /// Reads that a replica may serve.
    Replica,
}

const NO_PRIMARY: usize = usize::MAX;

#[derive(Debug)]
pub struct Router {
    /// The write target, or `NO_PRIMARY`.
    primary: AtomicUsize,
    /// The last write target there was (for error messages while there is none).
    last_primary: AtomicUsize,
    /// Until when (ms on the coarse clock's base) the primary takes writes
    /// without news from the coordinator; 0: no bound.
    primary_valid_ms: AtomicU64,
    backends: usize,
    reads_on_primary: bool,
    next: AtomicUsize,
    /// Per backend: banned until this `coarse::ms() + 1` (0 = not banned).
    banned_until: Vec<AtomicU64>,
    /// Per backend: may serve reads (health: up, not lagging, not fenced).
    readable: Vec<AtomicBool>,
    /// Per backend: a session saw it fail; the health loop will look.
    suspect: Vec<AtomicBool>,
    /// Per backend: taken out of reads by an operator (admin `DISABLE`).
    disabled: Vec<AtomicBool>,
    /// New units of work wait while true (admin `PAUSE`).
    paused: AtomicBool,
    /// The databases whose new units wait (admin `PAUSE db`), and how
    /// many there are (a unit reads only the count while it is 0).
    paused_databases: Mutex<Vec<Arc<str>>>,
    databases_paused: AtomicUsize,
    resumed: Notify,
    /// Units of work past the pause gate that have not checked out their
    /// server connection yet (see [`Router::admit`]).
    admitting: Arc<AtomicUsize>,
    /// Wakes the health loop when a backend becomes suspect.
    suspects_changed: Notify,
    /// Wakes sessions waiting for a primary.
    primary_changed: Notify,
    balance: Balance,
    /// Per backend: read weight.
    weights: Vec<u32>,
    /// Per backend: server connections checked out (shared with its pools).
    loads: Vec<Arc<AtomicUsize>>,
    /// Smooth weighted round robin state, per backend.
    current: Mutex<Vec<i64>>,
    /// Per backend: latency average of units of work, in microseconds (0: none yet).
    latency_us: Vec<AtomicU64>,
    /// Per backend: when `least_connections` last picked it (a pick
    /// counter): ties go to the one picked longest ago, so they alternate
    /// whatever the pattern of picks (a client whose units take two picks
    /// each would otherwise always land on the same reader).
    last_pick: Vec<AtomicU64>,
    /// Routers an earlier config made for the same backends (clients
    /// connected before a reload still route by them): they follow this
    /// one's health state, since only this one's health loop runs.
    followers: Mutex<Vec<Weak<Router>>>,
    /// The router this one follows, once a reload replaced it: sessions'
    /// suspect reports go on to it (its health loop is the one that looks).
    leader: Mutex<Weak<Router>>,
    /// The primary Fulcrum promoted and its first transaction id not
    /// taken when the promotion finished, read before any write went to
    /// it: an id below it is a transaction of the old primary's that the
    /// new one replayed; one at or above it never reached the new primary
    /// (see [`Router::commit_floor`]).
    commit_floor: Mutex<Option<(BackendId, u64)>>,
}

impl Router {
    /// `replicas` serve reads; `reads_on_primary` adds the primary to them.
    /// Every backend has weight 1 and reads go round robin.
    pub fn new(
        primary: BackendId,
        backends: usize,
        replicas: &[BackendId],
        reads_on_primary: bool,
    ) -> Router {
        Self::with_policy(
            primary,
            &vec![1; backends],
            replicas,
            reads_on_primary,
            Balance::RoundRobin,
        )
    }

    /// As `new`, with per-backend `weights` (one per backend) and a policy.
    /// Backends that are neither the primary nor in `replicas` start out
    /// not readable (the health loop may admit them).
    pub fn with_policy(
        primary: BackendId,
        weights: &[u32],
        replicas: &[BackendId],
        reads_on_primary: bool,
        balance: Balance,
    ) -> Router {
        let backends = weights.len();
        assert!(primary < backends, "primary index within the backend list");
        Router {
            primary: AtomicUsize::new(primary),
            last_primary: AtomicUsize::new(primary),
            primary_valid_ms: AtomicU64::new(0),
            backends,
            reads_on_primary,
            next: AtomicUsize::new(0),
            banned_until: (0..backends).map(|_| AtomicU64::new(0)).collect(),
            readable: (0..backends)
                .map(|b| AtomicBool::new(b == primary || replicas.contains(&b)))
                .collect(),
            suspect: (0..backends).map(|_| AtomicBool::new(false)).collect(),
            disabled: (0..backends).map(|_| AtomicBool::new(false)).collect(),
            paused: AtomicBool::new(false),
            paused_databases: Mutex::new(Vec::new()),
            databases_paused: AtomicUsize::new(0),
            admitting: Arc::new(AtomicUsize::new(0)),
            resumed: Notify::new(),
            suspects_changed: Notify::new(),
            primary_changed: Notify::new(),
            balance,
            weights: weights.to_vec(),
            loads: (0..backends)
                .map(|_| Arc::new(AtomicUsize::new(0)))
                .collect(),
            current: Mutex::new(vec![0; backends]),
            latency_us: (0..backends).map(|_| AtomicU64::new(0)).collect(),
            last_pick: (0..backends).map(|_| AtomicU64::new(0)).collect(),
            followers: Mutex::new(Vec::new()),
            leader: Mutex::new(Weak::new()),
            commit_floor: Mutex::new(None),
        }
    }

    /// Takes over from `earlier`, the router of the config before a reload:
    /// when both have the same backends, this one starts from its health
    /// state (write target, readable, disabled, paused) and `earlier` (with
    /// the routers it led) follows this one from now on. Different backends
    /// cannot follow: `false`.
    pub fn adopt(self: &Arc<Self>, earlier: &Arc<Router>) -> bool {
        if Arc::ptr_eq(self, earlier) || earlier.backends != self.backends {
            return false;
        }
        self.last_primary
            .store(earlier.last_primary(), Ordering::Release);
        self.set_primary_here(earlier.primary());
        for b in 0..self.backends {
            self.readable[b].store(earlier.is_readable(b), Ordering::Release);
            self.disabled[b].store(earlier.is_disabled(b), Ordering::Release);
        }
        self.paused.store(earlier.is_paused(), Ordering::SeqCst);
        for database in earlier.paused_databases() {
            self.set_database_paused(&database, true);
        }
        *self.commit_floor.lock().unwrap_or_else(|e| e.into_inner()) = *earlier
            .commit_floor
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut followers = self.followers.lock().unwrap_or_else(|e| e.into_inner());
        let theirs =
            std::mem::take(&mut *earlier.followers.lock().unwrap_or_else(|e| e.into_inner()));
        for f in theirs
            .iter()
            .filter_map(Weak::upgrade)
            .chain([earlier.clone()])
        {
            *f.leader.lock().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(self);
            followers.push(Arc::downgrade(&f));
        }
        true
    }

    /// Runs `apply` on every live follower (dropping the gone ones).
    fn each_follower(&self, apply: impl Fn(&Router)) {
        let mut followers = self.followers.lock().unwrap_or_else(|e| e.into_inner());
        followers.retain(|f| f.strong_count() > 0);
        for f in followers.iter().filter_map(Weak::upgrade) {
            apply(&f);
        }
    }

    /// The counter of checked-out connections to `backend`, for its pools.
    pub fn load_counter(&self, backend: BackendId) -> Arc<AtomicUsize> {
        self.loads[backend].clone()
    }

    /// Server connections to `backend` checked out now.
    pub fn load(&self, backend: BackendId) -> usize {
        self.loads
            .get(backend)
            .map_or(0, |l| l.load(Ordering::Relaxed))
    }

    pub fn balance(&self) -> Balance {
        self.balance
    }

    /// Records how long a unit of work took on `backend` (for `p2c`).
    pub fn record_latency(&self, backend: BackendId, took: Duration) {
        if let Some(slot) = self.latency_us.get(backend) {
            let sample = took.as_micros().min(u64::MAX as u128) as u64;
            let old = slot.load(Ordering::Relaxed);
            // A lost update under a race only drops one sample.
            slot.store(ewma_update(old, sample), Ordering::Relaxed);
        }
    }

    /// The latency average of `backend` in microseconds (0 before any sample).
    pub fn latency_us(&self, backend: BackendId) -> u64 {
        self.latency_us
            .get(backend)
            .map_or(0, |l| l.load(Ordering::Relaxed))
    }

    /// The write target now; `None` while the cluster has no usable primary
    /// (it is down, or a failover is under way).
    pub fn primary(&self) -> Option<BackendId> {
        match self.primary.load(Ordering::Acquire) {
            NO_PRIMARY => None,
            _ if self.primary_expired() => None,
            p => Some(p),
        }
    }

    /// The primary's validity ran out (`set_primary_valid_until`): this
    /// instance is cut off from its coordinator (the primary it last knew
    /// may be up, or replaced elsewhere); errors say so, not "down".
    pub fn primary_expired(&self) -> bool {
        match self.primary_valid_ms.load(Ordering::Acquire) {
            0 => false,
            until => crate::coarse::since_base_ms(std::time::Instant::now()) >= until,
        }
    }

    /// Bounds how long the primary takes writes without a word from the
    /// coordinator (`topology = "etcd"` / `"patroni"`, the health loop sets
    /// it each round); `None`: no bound. Past it, [`Router::primary`] is
    /// `None` and writes wait, even before the health loop runs again (a
    /// process resumed after a freeze never writes to a primary its lease
    /// no longer vouches for).
    pub fn set_primary_valid_until(&self, until: Option<tokio::time::Instant>) {
        let ms = until.map_or(0, |u| crate::coarse::since_base_ms(u.into_std()).max(1));
        self.primary_valid_ms.store(ms, Ordering::Release);
        self.each_follower(|f| f.primary_valid_ms.store(ms, Ordering::Release));
        self.primary_changed.notify_waiters();
    }

    /// The last backend that was the write target (the configured primary
    /// until the health loop decides otherwise).
    pub fn last_primary(&self) -> BackendId {
        self.last_primary.load(Ordering::Acquire)
    }

    /// Whether `backend` is the write target now.
    pub fn is_primary(&self, backend: BackendId) -> bool {
        self.primary.load(Ordering::Acquire) == backend
    }

    /// The route `backend` serves now: `Primary` if it is the write
    /// target, else `Replica` (what a unit attached to it is told).
    pub fn route_of(&self, backend: BackendId) -> Route {
        if self.is_primary(backend) {
            Route::Primary
        } else {
            Route::Replica
        }
    }

    /// Sets the write target (the health loop's decision) and wakes the
    /// sessions waiting for one.
    pub fn set_primary(&self, primary: Option<BackendId>) {
        self.set_primary_here(primary);
        self.each_follower(|f| f.set_primary_here(primary));
    }

    fn set_primary_here(&self, primary: Option<BackendId>) {
        let value = primary.filter(|&p| p < self.backends).unwrap_or(NO_PRIMARY);
        if value != NO_PRIMARY {
            self.last_primary.store(value, Ordering::Release);
        }
        let mut floor = self.commit_floor.lock().unwrap_or_else(|e| e.into_inner());
        if floor.is_some_and(|(b, _)| b != value) {
            // Another primary, or none (one that comes back restarted may
            // hand out again ids it had given before its crash): the
            // floor no longer tells anything.
            *floor = None;
        }
        drop(floor);
        if self.primary.swap(value, Ordering::AcqRel) != value {
            self.primary_changed.notify_waiters();
        }
    }

    /// Records `floor` for `primary`, just promoted by Fulcrum and not yet
    /// the write target (set before [`Router::set_primary`]).
    pub fn set_commit_floor(&self, primary: BackendId, floor: Option<u64>) {
        let value = floor.map(|f| (primary, f));
        *self.commit_floor.lock().unwrap_or_else(|e| e.into_inner()) = value;
        self.each_follower(|f| {
            *f.commit_floor.lock().unwrap_or_else(|e| e.into_inner()) = value;
        });
    }

    /// The commit floor of `primary`, if Fulcrum promoted it and read one:
    /// a transaction id below it was the old primary's (the new one's
    /// `pg_xact_status` speaks of that transaction); at or above it, the
    /// transaction never reached this primary. `None` (not promoted by
    /// Fulcrum, or the same primary restarted): ids cannot be told apart
    /// from ones the new primary handed out itself.
    pub fn commit_floor(&self, primary: BackendId) -> Option<u64> {
        self.commit_floor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .filter(|(b, _)| *b == primary)
            .map(|(_, f)| f)
    }

    /// Waits up to `timeout` for a primary other than `not` (the one that
    /// just failed, if any). Returns it, or `None` when time ran out.
    pub async fn wait_primary(
        &self,
        not: Option<BackendId>,
        timeout: Duration,
    ) -> Option<BackendId> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.primary_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.primary() {
                Some(p) if Some(p) != not => return Some(p),
                _ => {}
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.primary().filter(|&p| Some(p) != not);
            }
        }
    }

    /// Whether `backend` may serve reads now (health loop's view).
    pub fn set_readable(&self, backend: BackendId, readable: bool) {
        if let Some(r) = self.readable.get(backend) {
            r.store(readable, Ordering::Release);
        }
        self.each_follower(|f| {
            if let Some(r) = f.readable.get(backend) {
                r.store(readable, Ordering::Release);
            }
        });
    }

    pub fn is_readable(&self, backend: BackendId) -> bool {
        self.readable
            .get(backend)
            .is_some_and(|r| r.load(Ordering::Acquire))
    }

    /// The router this one forwards health reports to (a worker's follows
    /// the health loop's), if any.
    fn leader(&self) -> Option<Arc<Router>> {
        self.leader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .upgrade()
    }

    /// A session saw `backend` fail (connect error, connection lost): it
    /// serves no reads until the health loop has looked at it again.
    pub fn suspect(&self, backend: BackendId) {
        if let Some(leader) = self.leader() {
            leader.suspect(backend);
        }
        if let Some(s) = self.suspect.get(backend) {
            self.set_readable(backend, false);
            if !s.swap(true, Ordering::AcqRel) {
                self.suspects_changed.notify_one();
            }
        }
    }

    /// A session saw the write target refuse a write as read-only (it may
    /// have been demoted by someone else, e.g. Patroni): the health loop
    /// looks again now (and reads its coordinator again), taking nothing
    /// out of service. Many reports at once make one early round.
    pub fn recheck(&self) {
        if let Some(leader) = self.leader() {
            leader.recheck();
        }
        self.suspects_changed.notify_one();
    }

    /// Takes `backend` out of reads (or puts it back) by an operator's word;
    /// the health loop does not undo it.
    pub fn set_disabled(&self, backend: BackendId, disabled: bool) {
        if let Some(d) = self.disabled.get(backend) {
            d.store(disabled, Ordering::Release);
        }
        self.each_follower(|f| {
            if let Some(d) = f.disabled.get(backend) {
                d.store(disabled, Ordering::Release);
            }
        });
    }

    pub fn is_disabled(&self, backend: BackendId) -> bool {
        self.disabled
            .get(backend)
            .is_some_and(|d| d.load(Ordering::Acquire))
    }

    /// Server connections checked out now, over every backend.
    pub fn total_load(&self) -> usize {
        self.loads.iter().map(|l| l.load(Ordering::Relaxed)).sum()
    }

    /// The backends reported suspect since the last call (clears them).
    pub fn take_suspects(&self) -> Vec<BackendId> {
        (0..self.backends)
            .filter(|&b| self.suspect[b].swap(false, Ordering::AcqRel))
            .collect()
    }

    /// Resolves when a session reports a suspect backend.
    pub async fn suspects_reported(&self) {
        self.suspects_changed.notified().await
    }

    pub fn backend_count(&self) -> usize {
        self.backends
    }
}

mod pause;
mod pick;
#[cfg(test)]
mod tests;
