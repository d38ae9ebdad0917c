//! Picking a backend for a route: which backends take reads now (weight,
//! health, operator, bans, `reads_on_primary`), the balancing policies that
//! spread reads over them, and the short bans of a backend that failed to
//! connect.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{BackendId, Route, Router};
use crate::balance::{p2c_choose, smooth_weighted, Balance};

impl Router {
    /// The backends that would take reads now, in configuration order.
    pub fn readers(&self) -> Vec<BackendId> {
        let now = self.now_ms();
        (0..self.backends)
            .filter(|&b| self.is_reader(b, now))
            .collect()
    }

    fn now_ms(&self) -> u64 {
        crate::coarse::ms() + 1
    }

    fn is_banned(&self, b: BackendId, now: u64) -> bool {
        self.banned_until[b].load(Ordering::Relaxed) > now
    }

    fn is_reader(&self, b: BackendId, now: u64) -> bool {
        self.weights[b] > 0
            && self.readable[b].load(Ordering::Relaxed)
            && !self.disabled[b].load(Ordering::Relaxed)
            && !self.is_banned(b, now)
            && (self.reads_on_primary || !self.is_primary(b))
    }

    /// The backend for `route`; `None` when it needs a primary and there is
    /// none now. Reads with no reader left go to the primary.
    pub fn pick(&self, route: Route) -> Option<BackendId> {
        match route {
            Route::Primary => self.primary(),
            Route::Replica => self.pick_reader().or_else(|| self.primary()),
        }
    }

    fn pick_reader(&self) -> Option<BackendId> {
        let n = self.backends;
        let now = self.now_ms();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let open = |b: usize| self.is_reader(b, now);
        // The k-th open reader, so the rotation is even whatever is closed.
        let nth_open = |k: usize| {
            let m = (0..n).filter(|&b| open(b)).count();
            (m > 0).then(|| (0..n).filter(|&b| open(b)).nth(k % m))?
        };
        match self.balance {
            Balance::RoundRobin => nth_open(start),
            Balance::Random => nth_open(rand::random_range(0..n.max(1) * 64)),
            Balance::LeastConnections => {
                // Fewest connections checked out; among those, the reader
                // picked longest ago.
                let mut best: Option<(BackendId, usize, u64)> = None;
                for b in (0..n).filter(|&b| open(b)) {
                    let load = self.loads[b].load(Ordering::Relaxed);
                    let last = self.last_pick[b].load(Ordering::Relaxed);
                    if best.is_none_or(|(_, l, t)| load < l || (load == l && last < t)) {
                        best = Some((b, load, last));
                    }
                }
                let (b, _, _) = best?;
                self.last_pick[b].store(start as u64 + 1, Ordering::Relaxed);
                Some(b)
            }
            Balance::P2c => {
                let open: Vec<usize> = (0..n).filter(|&b| open(b)).collect();
                match open.len() {
                    0 => None,
                    1 => Some(open[0]),
                    m => {
                        let x = rand::random_range(0..m);
                        let y = (x + 1 + rand::random_range(0..m - 1)) % m;
                        let stat = |i: usize| {
                            let b = open[i];
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
                    .map(|b| if open(b) { self.weights[b] } else { 0 })
                    .collect();
                let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
                smooth_weighted(&mut current, &weights)
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
