//! Backend selection: a statement's route (primary or replica) goes in, a
//! backend index comes out. Replica reads are spread over the readers (the
//! replicas, plus the primary when `reads_on_primary`) by the cluster's
//! `Balance` policy; readers with weight 0 get no reads; a reader that just
//! failed to connect is skipped for a short ban, and when no reader is left
//! reads go to the primary. Atomics only, except the short lock of smooth
//! weighted round robin. Health checks plug in here.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::balance::{ewma_update, least_loaded, p2c_choose, smooth_weighted, Balance};

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

#[derive(Debug)]
pub struct Router {
    primary: BackendId,
    backends: usize,
    readers: Vec<BackendId>,
    next: AtomicUsize,
    /// Per backend: banned until this many ms after `epoch` (0 = not banned).
    banned_until: Vec<AtomicU64>,
    epoch: Instant,
    balance: Balance,
    /// Per backend: read weight.
    weights: Vec<u32>,
    /// Per backend: server connections checked out (shared with its pools).
    loads: Vec<Arc<AtomicUsize>>,
    /// Smooth weighted round robin state, per reader.
    current: Mutex<Vec<i64>>,
    /// Per backend: latency average of units of work, in microseconds (0: none yet).
    latency_us: Vec<AtomicU64>,
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
    pub fn with_policy(
        primary: BackendId,
        weights: &[u32],
        replicas: &[BackendId],
        reads_on_primary: bool,
        balance: Balance,
    ) -> Router {
        let backends = weights.len();
        assert!(primary < backends, "primary index within the backend list");
        let mut readers: Vec<BackendId> = replicas
            .iter()
            .copied()
            .filter(|&r| r < backends && r != primary)
            .collect();
        if reads_on_primary {
            readers.push(primary);
        }
        readers.retain(|&r| weights[r] > 0);
        Router {
            primary,
            backends,
            next: AtomicUsize::new(0),
            banned_until: (0..backends).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
            balance,
            weights: weights.to_vec(),
            loads: (0..backends)
                .map(|_| Arc::new(AtomicUsize::new(0)))
                .collect(),
            current: Mutex::new(vec![0; readers.len()]),
            latency_us: (0..backends).map(|_| AtomicU64::new(0)).collect(),
            readers,
        }
    }

    /// The counter of checked-out connections to `backend`, for its pools.
    pub fn load_counter(&self, backend: BackendId) -> Arc<AtomicUsize> {
        self.loads[backend].clone()
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

    pub fn primary(&self) -> BackendId {
        self.primary
    }

    pub fn backend_count(&self) -> usize {
        self.backends
    }

    pub fn readers(&self) -> &[BackendId] {
        &self.readers
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    fn is_banned(&self, b: BackendId, now: u64) -> bool {
        self.banned_until[b].load(Ordering::Relaxed) > now
    }

    /// The backend for `route`.
    pub fn pick(&self, route: Route) -> BackendId {
        match route {
            Route::Primary => self.primary,
            Route::Replica => {
                let n = self.readers.len();
                if n == 0 {
                    return self.primary;
                }
                let now = self.now_ms();
                let start = self.next.fetch_add(1, Ordering::Relaxed);
                let open = |i: usize| !self.is_banned(self.readers[i], now);
                let chosen = match self.balance {
                    Balance::RoundRobin => (0..n).map(|i| (start + i) % n).find(|&i| open(i)),
                    Balance::Random => {
                        let r = rand::random_range(0..n);
                        (0..n).map(|i| (r + i) % n).find(|&i| open(i))
                    }
                    Balance::LeastConnections => {
                        let loads: Vec<usize> = (0..n)
                            .map(|i| {
                                if open(i) {
                                    self.loads[self.readers[i]].load(Ordering::Relaxed)
                                } else {
                                    usize::MAX
                                }
                            })
                            .collect();
                        least_loaded(&loads, start % n).filter(|&i| open(i))
                    }
                    Balance::P2c => {
                        let open: Vec<usize> = (0..n).filter(|&i| open(i)).collect();
                        match open.len() {
                            0 => None,
                            1 => Some(open[0]),
                            m => {
                                let x = rand::random_range(0..m);
                                let y = (x + 1 + rand::random_range(0..m - 1)) % m;
                                let stat = |i: usize| {
                                    let b = self.readers[open[i]];
                                    (self.latency_us(b), self.loads[b].load(Ordering::Relaxed))
                                };
                                Some(if p2c_choose(stat(x), stat(y)) {
                                    open[x]
                                } else {
                                    open[y]
                                })
                            }
                        }
                    }
                    Balance::Weighted => {
                        let weights: Vec<u32> = (0..n)
                            .map(|i| {
                                if open(i) {
                                    self.weights[self.readers[i]]
                                } else {
                                    0
                                }
                            })
                            .collect();
                        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
                        smooth_weighted(&mut current, &weights)
                    }
                };
                chosen.map_or(self.primary, |i| self.readers[i])
            }
        }
    }

    /// Skips `backend` for reads for `period` (it failed to connect).
    pub fn ban(&self, backend: BackendId, period: Duration) {
        if backend < self.backends {
            let until = self.now_ms() + period.as_millis() as u64;
            self.banned_until[backend].store(until, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_go_to_the_primary_reads_round_robin() {
        let r = Router::new(0, 3, &[1, 2], false);
        assert_eq!(r.pick(Route::Primary), 0);
        let picks: Vec<_> = (0..6).map(|_| r.pick(Route::Replica)).collect();
        assert_eq!(picks.iter().filter(|&&b| b == 1).count(), 3);
        assert_eq!(picks.iter().filter(|&&b| b == 2).count(), 3);
        assert!(!picks.contains(&0));
    }

    #[test]
    fn no_replica_means_reads_on_the_primary() {
        let r = Router::new(0, 1, &[], false);
        assert_eq!(r.pick(Route::Replica), 0);
    }

    #[test]
    fn reads_on_primary_adds_it_to_the_rotation() {
        let r = Router::new(0, 2, &[1], true);
        let picks: Vec<_> = (0..4).map(|_| r.pick(Route::Replica)).collect();
        assert_eq!(picks.iter().filter(|&&b| b == 0).count(), 2);
    }

    #[test]
    fn weighted_policy_follows_the_weights() {
        let r = Router::with_policy(0, &[1, 1, 3], &[1, 2], false, Balance::Weighted);
        let picks: Vec<_> = (0..400).map(|_| r.pick(Route::Replica)).collect();
        assert_eq!(picks.iter().filter(|&&b| b == 1).count(), 100);
        assert_eq!(picks.iter().filter(|&&b| b == 2).count(), 300);
    }

    #[test]
    fn weight_zero_readers_get_no_reads() {
        for balance in [
            Balance::RoundRobin,
            Balance::Weighted,
            Balance::Random,
            Balance::LeastConnections,
        ] {
            let r = Router::with_policy(0, &[1, 0, 1], &[1, 2], false, balance);
            assert!((0..50).all(|_| r.pick(Route::Replica) == 2), "{balance:?}");
        }
    }

    #[test]
    fn least_connections_avoids_the_busy_reader() {
        let r = Router::with_policy(0, &[1, 1, 1], &[1, 2], false, Balance::LeastConnections);
        r.load_counter(1).store(5, Ordering::Relaxed);
        assert!((0..20).all(|_| r.pick(Route::Replica) == 2));
        r.load_counter(2).store(5, Ordering::Relaxed);
        let picks: Vec<_> = (0..20).map(|_| r.pick(Route::Replica)).collect();
        assert!(
            picks.contains(&1) && picks.contains(&2),
            "ties rotate: {picks:?}"
        );
    }

    #[test]
    fn p2c_steers_away_from_a_slow_reader() {
        let r = Router::with_policy(0, &[1, 1, 1], &[1, 2], false, Balance::P2c);
        for _ in 0..10 {
            r.record_latency(1, Duration::from_millis(50));
            r.record_latency(2, Duration::from_micros(500));
        }
        let picks: Vec<_> = (0..100).map(|_| r.pick(Route::Replica)).collect();
        assert!(
            picks.iter().all(|&b| b == 2),
            "the slow reader lost every pair"
        );
    }

    #[test]
    fn random_policy_uses_every_reader() {
        let r = Router::with_policy(0, &[1, 1, 1], &[1, 2], false, Balance::Random);
        let picks: Vec<_> = (0..200).map(|_| r.pick(Route::Replica)).collect();
        let ones = picks.iter().filter(|&&b| b == 1).count();
        assert!((50..=150).contains(&ones), "{ones} of 200");
        assert!(!picks.contains(&0));
    }

    #[test]
    fn banned_readers_are_skipped_until_the_ban_ends() {
        let r = Router::new(0, 3, &[1, 2], false);
        r.ban(1, Duration::from_millis(50));
        assert!((0..6).all(|_| r.pick(Route::Replica) == 2));
        r.ban(2, Duration::from_millis(50));
        assert_eq!(r.pick(Route::Replica), 0, "all readers banned: the primary");
        std::thread::sleep(Duration::from_millis(60));
        let picks: Vec<_> = (0..4).map(|_| r.pick(Route::Replica)).collect();
        assert!(picks.contains(&1) && picks.contains(&2));
    }
}
