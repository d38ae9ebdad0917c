//! Deadlines the protocols share: one on opening a connection, the same for
//! every protocol's server connect (`connect_timeout`: the whole of it, TCP,
//! TLS and the login, within one timeout, and the protocol's own error past
//! it); and a session's timer (`SessionTimer`: an idle or query timeout),
//! made the first time it is armed and reset in place after.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// A session's timer: none until first armed (a session whose cluster sets
/// no timeout carries no tokio `Sleep`, 112 bytes, nor builds one per
/// wait), then one boxed `Sleep` reset in place.
#[derive(Default)]
pub struct SessionTimer(Option<Pin<Box<Sleep>>>);

impl SessionTimer {
    /// Sets the timer to go off at `deadline`, making it the first time.
    #[inline]
    pub fn arm(&mut self, deadline: Instant) {
        match &mut self.0 {
            Some(sleep) => sleep.as_mut().reset(deadline),
            None => self.0 = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
    }

    /// Whether it went off (never, when it was not made); registers the
    /// task's waker when not.
    #[inline]
    pub fn poll_fired(&mut self, cx: &mut Context<'_>) -> bool {
        self.0
            .as_mut()
            .is_some_and(|s| s.as_mut().poll(cx).is_ready())
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
