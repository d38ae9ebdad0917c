//! Deadlines the protocols share: one on opening a connection, the same for
//! every protocol's server connect (`connect_timeout`: the whole of it, TCP,
//! TLS and the login, within one timeout, and the protocol's own error past
//! it); and a session's timer (`SessionTimer`: an idle or query timeout),
//! made the first time it is armed, its deadline a plain value after.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// A session's timer: none until first armed (a session whose cluster sets
/// no timeout carries no tokio `Sleep`, 112 bytes, nor builds one per
/// wait), then one boxed `Sleep` and the deadline wanted.
///
/// Arming is a store, not a timer operation, unless the deadline moves
/// earlier than the one the `Sleep` is set for (issue 44: no timer
/// operation per event). A session re-arms its idle timer at every turn
/// of its loop, each time a little later; the `Sleep` keeps its first
/// deadline, and when it goes off before the deadline now wanted it is
/// set once to that deadline and waited on again. So a busy client costs
/// one timer-wheel operation per timeout period, not one per wake-up.
#[derive(Default)]
pub struct SessionTimer(Option<(Pin<Box<Sleep>>, Instant)>);

impl SessionTimer {
    /// Sets the timer to go off at `deadline`, making it the first time.
    /// The `Sleep` is reset only when `deadline` is earlier than its own.
    #[inline]
    pub fn arm(&mut self, deadline: Instant) {
        match &mut self.0 {
            Some((sleep, wanted)) => {
                *wanted = deadline;
                if deadline < sleep.deadline() {
                    sleep.as_mut().reset(deadline);
                }
            }
            None => self.0 = Some((Box::pin(tokio::time::sleep_until(deadline)), deadline)),
        }
    }

    /// Whether it went off at the deadline last armed (never, when it was
    /// not made); registers the task's waker when not.
    #[inline]
    pub fn poll_fired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some((sleep, wanted)) = self.0.as_mut() else {
            return false;
        };
        loop {
            if sleep.as_mut().poll(cx).is_pending() {
                return false;
            }
            if *wanted <= sleep.deadline() {
                return true;
            }
            // Went off at an earlier deadline, since moved later: set
            // once to the one wanted, and polled so that it wakes the task.
            sleep.as_mut().reset(*wanted);
        }
    }

    /// Waits until it goes off (forever, when it was not made).
    pub async fn fired(&mut self) {
        std::future::poll_fn(|cx| match self.poll_fired(cx) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        })
        .await
    }
}

/// Runs `connecting` for at most `timeout`; past it, the error `timed_out`
/// makes (given the timeout).
pub async fn within<T, E>(
    timeout: Duration,
    connecting: impl Future<Output = Result<T, E>>,
    timed_out: impl FnOnce(Duration) -> E,
) -> Result<T, E> {
    match tokio::time::timeout(timeout, connecting).await {
        Ok(r) => r,
        Err(_) => Err(timed_out(timeout)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_session_timer_fires_only_once_armed_and_at_its_last_deadline() {
        let mut t = SessionTimer::default();
        let never = tokio::time::timeout(Duration::from_secs(60), t.fired()).await;
        assert!(never.is_err(), "not armed: never fires");
        t.arm(Instant::now() + Duration::from_secs(5));
        t.arm(Instant::now() + Duration::from_secs(10));
        let early = tokio::time::timeout(Duration::from_secs(9), t.fired()).await;
        assert!(early.is_err(), "re-armed later: not at the first deadline");
        let on_time = tokio::time::timeout(Duration::from_secs(2), t.fired()).await;
        assert!(on_time.is_ok(), "fires at the last deadline");
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_timer_re_armed_later_at_every_turn_fires_at_the_last_deadline() {
        let start = Instant::now();
        let mut t = SessionTimer::default();
        let mut sleep_at = Vec::new();
        // A busy client: re-armed 10 s ahead every second for 30 s. The
        // `Sleep` keeps its first deadline (10 s) meanwhile.
        for s in 0..30 {
            t.arm(start + Duration::from_secs(s + 10));
            let quiet = tokio::time::timeout(Duration::from_secs(1), t.fired()).await;
            assert!(quiet.is_err(), "moved later at {s} s: not fired");
            // No timer operation for a later deadline: the `Sleep` is reset
            // only when it goes off (at 10, 19 and 28 s).
            let set_for = t.0.as_ref().map(|(sleep, _)| sleep.deadline());
            if set_for != sleep_at.last().copied() {
                sleep_at.extend(set_for);
            }
        }
        let secs: Vec<u64> = sleep_at.iter().map(|d| (*d - start).as_secs()).collect();
        assert_eq!(secs, [10, 19, 28, 37], "set 4 times for 30 armings");
        // Then quiet: fires 10 s after the last arming (at 39 s), not before.
        let early = tokio::time::timeout(Duration::from_millis(8_900), t.fired()).await;
        assert!(early.is_err(), "not before the last deadline");
        tokio::time::timeout(Duration::from_millis(200), t.fired())
            .await
            .expect("fires at the last deadline");
        assert_eq!(Instant::now() - start, Duration::from_secs(39));
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_timer_moved_earlier_fires_at_the_earlier_deadline() {
        let start = Instant::now();
        let mut t = SessionTimer::default();
        t.arm(start + Duration::from_secs(60));
        t.arm(start + Duration::from_secs(5));
        tokio::time::timeout(Duration::from_secs(6), t.fired())
            .await
            .expect("fires at the earlier deadline");
        assert_eq!(Instant::now() - start, Duration::from_secs(5));
        // Fired stays fired until armed again.
        assert!(tokio::time::timeout(Duration::ZERO, t.fired())
            .await
            .is_ok());
        t.arm(Instant::now() + Duration::from_secs(3));
        let early = tokio::time::timeout(Duration::from_secs(2), t.fired()).await;
        assert!(early.is_err(), "armed again: waits for the new deadline");
    }

    #[tokio::test]
    async fn finishes_or_times_out() {
        let quick = within(Duration::from_secs(5), async { Ok::<_, String>(1) }, |_| {
            "late".to_owned()
        });
        assert_eq!(quick.await, Ok(1));
        let slow = within(
            Duration::from_millis(10),
            std::future::pending::<Result<u8, String>>(),
            |t| format!("timed out after {t:?}"),
        );
        assert_eq!(slow.await, Err("timed out after 10ms".to_owned()));
    }
}
