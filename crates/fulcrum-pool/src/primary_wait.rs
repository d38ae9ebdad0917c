//! Waiting for a primary to take a unit of work, written once for both
//! protocols: a unit that needs the primary (an attach, up to
//! `pool_timeout`; a transaction replay, up to `transaction_replay_timeout`)
//! takes the router's primary, or waits for the health loop to name one,
//! tries to check out a connection there, and when that primary cannot take
//! it (down, starting, in recovery) reports it suspect, so the health loop
//! looks at once, and tries again a moment later, until the deadline. The
//! client has sent nothing to any server yet, so nothing is lost by waiting.

use std::time::Duration;

use tokio::time::Instant;

use crate::{Admission, BackendId, Router};

/// How long to wait between tries: the health loop may still name the same
/// primary until it has looked.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// One wait for a primary: the caller loops over [`PrimaryWait::next`],
/// tries each primary it names, and reports a try that failed with
/// [`PrimaryWait::down`]; `next` answers `None` once the deadline passed.
pub struct PrimaryWait<'a> {
    router: &'a Router,
    deadline: Instant,
    admit: bool,
    tried: bool,
    why: Option<String>,
}

impl<'a> PrimaryWait<'a> {
    /// With `admit`, each try first passes the router's admission (a
    /// SWITCHOVER's pause holds it like any new unit); a caller that holds
    /// one already passes `false`.
    pub fn new(router: &'a Router, deadline: Instant, admit: bool) -> PrimaryWait<'a> {
        PrimaryWait {
            router,
            deadline,
            admit,
            tried: false,
            why: None,
        }
    }

    /// The primary to try now, and the admission to hold while trying it;
    /// `None` when the deadline passed first.
    pub async fn next(&mut self) -> Option<(BackendId, Option<Admission>)> {
        loop {
            // A first try reads the coarse clock (never ahead of the precise
            // one; the deadline is counted in milliseconds): a unit that finds
            // its primary at once reads no precise clock here. Retries, rare,
            // read the precise one.
            let now = if self.tried {
                Instant::now()
            } else {
                Instant::from_std(crate::coarse::now())
            };
            let left = self.deadline.saturating_duration_since(now);
            if left.is_zero() {
                return None;
            }
            if std::mem::take(&mut self.tried) {
                tokio::time::sleep(left.min(RETRY_PAUSE)).await;
                continue;
            }
            let admission = if self.admit {
                Some(tokio::time::timeout(left, self.router.admit()).await.ok()?)
            } else {
                None
            };
            let primary = match self.router.primary() {
                Some(p) => Some(p),
                None => self.router.wait_primary(None, left).await,
            };
            match primary {
                Some(p) => {
                    self.tried = true;
                    return Some((p, admission));
                }
                None => continue,
            }
        }
    }

    /// The try on `primary` failed (why): it is reported suspect, so the
    /// health loop looks at it at once, and the next try comes a moment
    /// later.
    pub fn down(&mut self, primary: BackendId, why: String) {
        self.router.suspect(primary);
        self.why = Some(why);
    }

    /// The last reason a primary could not take the unit, if one was tried.
    pub fn why(self) -> Option<String> {
        self.why
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_primary_that_comes_back_takes_the_unit() {
        let router = Router::new(0, 2, &[1], false);
        let mut wait = PrimaryWait::new(&router, Instant::now() + Duration::from_secs(5), true);
        let mut tries = 0;
        let started = Instant::now();
        while let Some((p, admission)) = wait.next().await {
            assert_eq!(p, 0);
            assert!(admission.is_some());
            tries += 1;
            if tries == 3 {
                break;
            }
            wait.down(p, format!("try {tries}"));
        }
        assert_eq!(tries, 3);
        assert_eq!(started.elapsed(), RETRY_PAUSE * 2, "a pause between tries");
    }

    #[tokio::test(start_paused = true)]
    async fn a_dead_primary_times_out_with_its_reason() {
        let router = Router::new(0, 2, &[1], false);
        let started = Instant::now();
        let mut wait = PrimaryWait::new(&router, Instant::now() + Duration::from_secs(1), false);
        while let Some((p, _)) = wait.next().await {
            wait.down(p, "connection refused".into());
        }
        assert_eq!(wait.why().as_deref(), Some("connection refused"));
        assert!(started.elapsed() >= Duration::from_secs(1));
    }
}
