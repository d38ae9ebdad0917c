//! A clock read with one atomic load, behind real time by at most
//! [`TICK`]: for deadlines counted in seconds, idle and lifetime checks and
//! the `SHOW CLIENTS` timestamps, which the data path reads several times
//! per unit of work. (A latency a metric reports reads the precise clock.)
//! A background thread advances it every [`TICK`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often the clock advances (and so how far behind it may be).
pub const TICK: Duration = Duration::from_millis(10);

struct Clock {
    start: Instant,
    /// The wall clock at `start`, in ms since the Unix epoch.
    start_unix_ms: u64,
    /// Milliseconds from `start` to the last tick.
    ms: AtomicU64,
}

fn clock() -> &'static Clock {
    static CLOCK: OnceLock<Clock> = OnceLock::new();
    CLOCK.get_or_init(|| {
        let ticker = std::thread::Builder::new()
            .name("fulcrum-clock".into())
            .spawn(|| {
                let c = clock();
                loop {
                    std::thread::sleep(TICK);
                    c.ms.store(c.start.elapsed().as_millis() as u64, Ordering::Relaxed);
                }
            });
        if let Err(e) = ticker {
            // Without its thread the clock would stand still: say so loudly.
            tracing::error!(error = %e, "cannot start the coarse clock's thread");
        }
        Clock {
            start: Instant::now(),
            start_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            ms: AtomicU64::new(0),
        }
    })
}

/// Now, to within [`TICK`] (never ahead of [`Instant::now`]).
pub fn now() -> Instant {
    let c = clock();
    c.start + Duration::from_millis(c.ms.load(Ordering::Relaxed))
}

/// Milliseconds from the clock's start to `at` (precise; 0 before it).
pub fn since_base_ms(at: Instant) -> u64 {
    at.saturating_duration_since(clock().start).as_millis() as u64
}

/// Milliseconds since the clock started, to within [`TICK`]: for
/// comparisons without `Instant` arithmetic.
pub fn ms() -> u64 {
    clock().ms.load(Ordering::Relaxed)
}

/// The wall clock, in ms since the Unix epoch, to within [`TICK`] (it
/// follows the monotonic clock from the first read: a step of the system
/// clock after that is not seen).
pub fn unix_ms() -> u64 {
    let c = clock();
    c.start_unix_ms + c.ms.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_follows_the_precise_clock_within_a_few_ticks() {
        let first = now();
        std::thread::sleep(TICK * 5);
        let later = now();
        let precise = Instant::now();
        assert!(later > first, "it advanced");
        assert!(later <= precise);
        assert!(
            precise - later < TICK * 4,
            "behind by {:?}",
            precise - later
        );
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(wall.abs_diff(unix_ms()) < 1_000);
    }
}
