//! Backend selection: a statement's route (primary or replica) goes in, a
//! backend index comes out. Replica reads go round robin over the readers
//! (the replicas, plus the primary when `reads_on_primary`); a reader that
//! just failed to connect is skipped for a short ban, and when no reader is
//! left reads go to the primary. Lock-free: one atomic counter and one atomic
//! deadline per backend. Health checks and the other policies plug in here.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

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
}

impl Router {
    /// `replicas` serve reads; `reads_on_primary` adds the primary to them.
    pub fn new(
        primary: BackendId,
        backends: usize,
        replicas: &[BackendId],
        reads_on_primary: bool,
    ) -> Router {
        assert!(primary < backends, "primary index within the backend list");
        let mut readers: Vec<BackendId> = replicas
            .iter()
            .copied()
            .filter(|&r| r < backends && r != primary)
            .collect();
        if reads_on_primary {
            readers.push(primary);
        }
        Router {
            primary,
            backends,
            readers,
            next: AtomicUsize::new(0),
            banned_until: (0..backends).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
        }
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
                (0..n)
                    .map(|i| self.readers[(start + i) % n])
                    .find(|&b| !self.is_banned(b, now))
                    .unwrap_or(self.primary)
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
