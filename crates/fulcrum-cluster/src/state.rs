//! A backend's health as the health loop sees it, and the reachability
//! tracker behind it: consecutive failed probes before `Down`, one success to
//! come back, and a growing back-off for a node that flaps (goes down again
//! soon after coming back). Pure: time is passed in.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What a backend may be used for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendState {
    /// Reachable; serves its role.
    Up,
    /// A replica too far behind (`max_lag`): no reads until it catches up.
    Lagging,
    /// Unreachable (or back too recently after flapping): no traffic.
    Down,
    /// A former primary that came back writable while another node is the
    /// primary: fenced, no traffic, until an operator re-joins it as a replica.
    Stale,
}

impl BackendState {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendState::Up => "up",
            BackendState::Lagging => "lagging",
            BackendState::Down => "down",
            BackendState::Stale => "stale",
        }
    }
}

impl std::fmt::Display for BackendState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Downs within this window count towards the flapping back-off.
const FLAP_WINDOW: Duration = Duration::from_secs(60);
/// The longest a flapping node is kept out after it answers again.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Reachability of one backend over successive probes.
#[derive(Debug, Clone)]
pub struct Tracker {
    reachable: bool,
    failures: u32,
    /// When it went down (None while reachable).
    down_since: Option<Instant>,
    /// While down and answering again: when it may count as up.
    recover_at: Option<Instant>,
    /// Recent transitions to down, for the back-off.
    downs: VecDeque<Instant>,
}

/// A change of reachability worth logging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    WentDown,
    CameBack,
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker::new()
    }
}

impl Tracker {
    /// A backend not probed yet counts as reachable, so the daemon serves
    /// from its first second; the first probe round corrects it.
    pub fn new() -> Tracker {
        Tracker {
            reachable: true,
            failures: 0,
            down_since: None,
            recover_at: None,
            downs: VecDeque::new(),
        }
    }

    pub fn reachable(&self) -> bool {
        self.reachable
    }

    /// Failed probes in a row.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// How long it has been down (None while reachable).
    pub fn down_for(&self, now: Instant) -> Option<Duration> {
        self.down_since.map(|t| now.saturating_duration_since(t))
    }

    /// A probe failed; `threshold` failures in a row take it down.
    pub fn on_failure(&mut self, now: Instant, threshold: u32) -> Option<Change> {
        self.failures = self.failures.saturating_add(1);
        self.recover_at = None;
        if self.reachable && self.failures >= threshold.max(1) {
            self.reachable = false;
            self.down_since = Some(now);
            self.downs.push_back(now);
            self.trim(now);
            return Some(Change::WentDown);
        }
        None
    }

    /// A probe succeeded. A node that was down comes back at once, unless it
    /// went down more than once in the last minute: then it must keep
    /// answering for `interval × 2^(downs-1)` (at most 30 s) first.
    pub fn on_success(&mut self, now: Instant, interval: Duration) -> Option<Change> {
        self.failures = 0;
        if self.reachable {
            return None;
        }
        self.trim(now);
        let at = *self
            .recover_at
            .get_or_insert_with(|| now + backoff(self.downs.len(), interval));
        if now >= at {
            self.reachable = true;
            self.down_since = None;
            self.recover_at = None;
            return Some(Change::CameBack);
        }
        None
    }

    fn trim(&mut self, now: Instant) {
        while self
            .downs
            .front()
            .is_some_and(|&t| now.saturating_duration_since(t) > FLAP_WINDOW)
        {
            self.downs.pop_front();
        }
    }
}

/// How long a node that went down `downs` times recently must answer before
/// it is trusted again.
pub fn backoff(downs: usize, interval: Duration) -> Duration {
    if downs <= 1 {
        return Duration::ZERO;
    }
    let factor = 1u32 << (downs - 1).min(16) as u32;
    interval.saturating_mul(factor).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn down_after_the_configured_failures_in_a_row() {
        let t0 = Instant::now();
        let mut t = Tracker::new();
        assert_eq!(t.on_failure(t0, 2), None);
        assert!(t.reachable(), "one failure is not enough");
        assert_eq!(t.on_success(t0, SEC), None);
        assert_eq!(t.on_failure(t0, 2), None, "a success resets the count");
        assert_eq!(t.on_failure(t0 + SEC, 2), Some(Change::WentDown));
        assert!(!t.reachable());
        assert_eq!(t.down_for(t0 + 3 * SEC), Some(2 * SEC));
    }

    #[test]
    fn a_node_that_went_down_once_comes_back_at_its_first_success() {
        let t0 = Instant::now();
        let mut t = Tracker::new();
        t.on_failure(t0, 1);
        assert_eq!(t.on_success(t0 + SEC, SEC), Some(Change::CameBack));
        assert!(t.reachable());
        assert_eq!(t.down_for(t0 + SEC), None);
    }

    #[test]
    fn a_flapping_node_waits_longer_each_time() {
        let t0 = Instant::now();
        let mut t = Tracker::new();
        t.on_failure(t0, 1);
        assert_eq!(t.on_success(t0 + SEC, SEC), Some(Change::CameBack));
        t.on_failure(t0 + 2 * SEC, 1);
        // Second down within a minute: 2 s of answering first.
        assert_eq!(t.on_success(t0 + 3 * SEC, SEC), None);
        assert!(!t.reachable());
        assert_eq!(t.on_success(t0 + 4 * SEC, SEC), None);
        assert_eq!(t.on_success(t0 + 5 * SEC, SEC), Some(Change::CameBack));
        // A failure while waiting restarts the wait.
        t.on_failure(t0 + 6 * SEC, 1);
        assert_eq!(t.on_success(t0 + 7 * SEC, SEC), None);
        t.on_failure(t0 + 8 * SEC, 1);
        assert_eq!(t.on_success(t0 + 9 * SEC, SEC), None);
        assert_eq!(t.on_success(t0 + 12 * SEC, SEC), None, "third down: 4 s");
        assert_eq!(t.on_success(t0 + 13 * SEC, SEC), Some(Change::CameBack));
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(0, SEC), Duration::ZERO);
        assert_eq!(backoff(1, SEC), Duration::ZERO);
        assert_eq!(backoff(2, SEC), 2 * SEC);
        assert_eq!(backoff(3, SEC), 4 * SEC);
        assert_eq!(backoff(10, SEC), 30 * SEC);
        assert_eq!(backoff(100, SEC), 30 * SEC);
    }
}
