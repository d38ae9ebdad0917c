//! Shared fetches of a value that must be at least as new as the moment it is
//! asked for: `consistency = "strong"` needs the primary's position as of the
//! read's start. Concurrent callers share one fetch instead of each asking the
//! primary, but a caller never takes the result of a fetch that started
//! before it asked (that position could miss a write committed in between):
//! it waits for the next one, which starts as soon as the running one ends
//! and serves everyone who arrived meanwhile. So at most one fetch runs at a
//! time, and a burst of N callers costs at most two fetches instead of N.

use std::future::Future;
use std::sync::Mutex;

use tokio::sync::watch;

/// One value fetched for many callers; see the module comment.
pub struct Coalesced<T> {
    state: Mutex<State>,
    /// The last finished fetch: its number and result (`None`: it failed or
    /// its caller went away).
    done: watch::Sender<(u64, Option<T>)>,
}

#[derive(Default)]
struct State {
    /// Fetches started so far; fetch `n` is the `n`-th started.
    started: u64,
    running: bool,
}

impl<T: Clone> Default for Coalesced<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Clone> Coalesced<T> {
    pub fn new() -> Self {
        Coalesced {
            state: Mutex::new(State::default()),
            done: watch::channel((0, None)).0,
        }
    }

    /// A result from a fetch that started after this call: this caller runs
    /// `fetch()` itself when no fetch is running, and otherwise waits for
    /// the next one (`fetch` is then never called). `None` when the fetch
    /// that served it failed. (A closure, not the future: an `async fn`
    /// holds a future argument twice in its state, as the argument and as
    /// the future it awaits; a session's task carries that size.)
    pub async fn get<F, Fut>(&self, fetch: F) -> Option<T>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let mut rx = self.done.subscribe();
        // Fetches numbered `need` or later started after this point.
        let need = self.state.lock().unwrap_or_else(|p| p.into_inner()).started + 1;
        loop {
            {
                let last = rx.borrow_and_update();
                if last.0 >= need {
                    return last.1.clone();
                }
            }
            if let Some(number) = self.try_lead() {
                let mut guard = Leading {
                    owner: self,
                    number,
                    finished: false,
                };
                let result = fetch().await;
                guard.finish(result.clone());
                return result;
            }
            // A fetch is running: it ends with a send, which wakes us.
            if rx.changed().await.is_err() {
                return None;
            }
        }
    }

    /// Starts fetch number `started + 1` unless one is running.
    fn try_lead(&self) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.running {
            return None;
        }
        state.running = true;
        state.started += 1;
        Some(state.started)
    }

    /// Ends fetch `number` with `result` and wakes every waiter.
    fn end(&self, number: u64, result: Option<T>) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).running = false;
        self.done.send_replace((number, result));
    }

    /// Fetches started so far (for tests and diagnostics).
    pub fn fetches(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).started
    }
}

/// The running fetch's owner: if the caller leading it goes away mid-fetch
/// (its client disconnected), the fetch ends as failed, so waiters move on.
struct Leading<'a, T: Clone> {
    owner: &'a Coalesced<T>,
    number: u64,
    finished: bool,
}

impl<T: Clone> Leading<'_, T> {
    fn finish(&mut self, result: Option<T>) {
        self.finished = true;
        self.owner.end(self.number, result);
    }
}

impl<T: Clone> Drop for Leading<'_, T> {
    fn drop(&mut self) {
        if !self.finished {
            self.owner.end(self.number, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::sync::oneshot;

    use super::*;

    #[tokio::test]
    async fn a_lone_caller_fetches_every_time() {
        let c = Coalesced::new();
        assert_eq!(c.get(|| async { Some(7) }).await, Some(7));
        assert_eq!(
            c.get(|| async { Some(8) }).await,
            Some(8),
            "never a stale value"
        );
        assert_eq!(c.fetches(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_of_callers_shares_at_most_two_fetches() {
        let c = Arc::new(Coalesced::new());
        let counter = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (c, counter) = (c.clone(), counter.clone());
            tasks.push(tokio::spawn(async move {
                c.get(|| async move {
                    let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Some(n)
                })
                .await
            }));
        }
        for t in tasks {
            assert!(t.await.unwrap().is_some());
        }
        let fetches = counter.load(Ordering::SeqCst);
        assert_eq!(fetches, c.fetches());
        // Callers spawned over ~0 ms against 20 ms fetches: the first one
        // runs, everyone else arrives during it and shares the second.
        assert!(fetches <= 3, "{fetches} fetches for 50 callers");
    }

    #[tokio::test]
    async fn a_caller_never_takes_a_fetch_that_started_before_it_asked() {
        let c = Arc::new(Coalesced::new());
        let (release_first, first_gate) = oneshot::channel::<()>();
        let early = {
            let c = c.clone();
            tokio::spawn(async move {
                c.get(|| async move {
                    first_gate.await.ok();
                    Some("old")
                })
                .await
            })
        };
        // Let the early caller start its fetch, then ask while it runs.
        while c.fetches() == 0 {
            tokio::task::yield_now().await;
        }
        let late = {
            let c = c.clone();
            tokio::spawn(async move { c.get(|| async { Some("new") }).await })
        };
        tokio::task::yield_now().await;
        release_first.send(()).unwrap();
        assert_eq!(early.await.unwrap(), Some("old"));
        assert_eq!(
            late.await.unwrap(),
            Some("new"),
            "the late caller ran its own fetch"
        );
        assert_eq!(c.fetches(), 2);
    }

    #[tokio::test]
    async fn a_leader_that_goes_away_fails_its_fetch_and_the_next_one_runs() {
        let c = Arc::new(Coalesced::<u32>::new());
        let leader = {
            let c = c.clone();
            tokio::spawn(async move { c.get(std::future::pending).await })
        };
        while c.fetches() == 0 {
            tokio::task::yield_now().await;
        }
        let waiter = {
            let c = c.clone();
            tokio::spawn(async move { c.get(|| async { Some(5) }).await })
        };
        tokio::task::yield_now().await;
        leader.abort();
        assert!(leader.await.unwrap_err().is_cancelled());
        // The waiter asked while the abandoned fetch ran, so that fetch could
        // not serve it: it runs the next one itself.
        assert_eq!(waiter.await.unwrap(), Some(5));
        assert_eq!(
            c.get(|| async { Some(6) }).await,
            Some(6),
            "no fetch left stuck"
        );
    }

    #[tokio::test]
    async fn a_failed_fetch_gives_none_to_its_callers() {
        let c = Coalesced::<u32>::new();
        assert_eq!(c.get(|| async { None }).await, None);
        assert_eq!(c.get(|| async { Some(1) }).await, Some(1));
    }
}
