//! The cap on connections still logging in (`max_pending_logins`): each
//! accepted connection holds a ticket until its login ends. At the cap one
//! is evicted (its holder is told and closes the connection): the oldest
//! that has sent nothing of its login for longer than `grace` (an idle
//! connect), else the oldest that has been logging in for longer than
//! `stall`; when there is none (a connection storm of real clients, each
//! just connected or busy logging in), the new one is admitted over the
//! cap rather than harm them. So a flood of
//! idle TCP connects can never lock out a client that logs in promptly.
//! Logged-in clients count against `max_client_connections` instead.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// The connections of one listener still logging in.
#[derive(Debug)]
pub struct PendingLogins {
    cap: usize,
    grace: Duration,
    stall: Duration,
    inner: Mutex<Queue>,
}

#[derive(Debug)]
struct Entry {
    evict: Arc<Notify>,
    started: Arc<AtomicBool>,
    since: Instant,
}

#[derive(Debug, Default)]
struct Queue {
    next: u64,
    /// By admission order: the first entry is the oldest.
    waiting: BTreeMap<u64, Entry>,
    evicted: u64,
    over_cap: u64,
}

/// One connection's place among those logging in; dropping it (the login
/// ended, either way) frees the place.
#[derive(Debug)]
pub struct PendingTicket {
    id: u64,
    evict: Arc<Notify>,
    started: Arc<AtomicBool>,
    owner: Arc<PendingLogins>,
}

impl PendingLogins {
    /// At most `cap` connections logging in at once (at least one); an idle
    /// connect is evicted once older than `grace`, a login in progress once
    /// older than `stall`.
    pub fn new(cap: usize, grace: Duration, stall: Duration) -> Arc<PendingLogins> {
        Arc::new(PendingLogins {
            cap: cap.max(1),
            grace,
            stall,
            inner: Mutex::new(Queue::default()),
        })
    }

    /// Admits a new connection, evicting one still logging in when the cap
    /// is reached (see the module's rule).
    pub fn admit(self: &Arc<Self>) -> PendingTicket {
        let evict = Arc::new(Notify::new());
        let started = Arc::new(AtomicBool::new(false));
        let now = Instant::now();
        let mut q = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        while q.waiting.len() >= self.cap {
            let idle = q
                .waiting
                .iter()
                .take_while(|(_, e)| now.duration_since(e.since) >= self.grace)
                .find(|(_, e)| !e.started.load(Ordering::Relaxed))
                .map(|(id, _)| *id);
            let stalled = || {
                q.waiting
                    .iter()
                    .next()
                    .filter(|(_, e)| now.duration_since(e.since) >= self.stall)
                    .map(|(id, _)| *id)
            };
            let Some(victim) = idle.or_else(stalled) else {
                q.over_cap += 1;
                break;
            };
            if let Some(e) = q.waiting.remove(&victim) {
                // A stored permit: the holder sees it even if not waiting yet.
                e.evict.notify_one();
                q.evicted += 1;
            }
        }
        let id = q.next;
        q.next += 1;
        q.waiting.insert(
            id,
            Entry {
                evict: evict.clone(),
                started: started.clone(),
                since: now,
            },
        );
        PendingTicket {
            id,
            evict,
            started,
            owner: self.clone(),
        }
    }

    /// Connections logging in now.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .waiting
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Connections closed so far to make room.
    pub fn evicted(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).evicted
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Connections admitted over the cap (every one logging in was a login
    /// in progress younger than `stall`).
    pub fn over_cap(&self) -> u64 {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .over_cap
    }
}

impl PendingTicket {
    /// The client sent its login message: it is a login in progress, not
    /// an idle connect.
    pub fn mark_started(&self) {
        self.started.store(true, Ordering::Relaxed);
    }

    /// Resolves when this connection was evicted to make room for a newer
    /// one: its login must end now.
    pub async fn evicted(&self) {
        self.evict.notified().await
    }
}

impl Drop for PendingTicket {
    fn drop(&mut self) {
        let mut q = self.owner.inner.lock().unwrap_or_else(|e| e.into_inner());
        q.waiting.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const STALL: Duration = Duration::from_secs(5);

    fn pending(cap: usize) -> Arc<PendingLogins> {
        PendingLogins::new(cap, Duration::ZERO, STALL)
    }

    #[tokio::test]
    async fn the_oldest_is_evicted_at_the_cap() {
        let p = pending(3);
        let first = p.admit();
        let second = p.admit();
        let third = p.admit();
        assert_eq!(p.len(), 3);
        let fourth = p.admit();
        assert_eq!(p.len(), 3);
        assert_eq!(p.evicted(), 1);
        tokio::time::timeout(Duration::from_secs(1), first.evicted())
            .await
            .expect("the oldest is told");
        for newer in [&second, &third, &fourth] {
            assert!(
                tokio::time::timeout(Duration::from_millis(20), newer.evicted())
                    .await
                    .is_err(),
                "only the oldest goes"
            );
        }
        drop(first);
        assert_eq!(p.len(), 3, "an evicted ticket's drop frees nothing twice");
    }

    #[tokio::test]
    async fn an_ended_login_frees_its_place() {
        let p = pending(2);
        let a = p.admit();
        let b = p.admit();
        drop(a);
        assert_eq!(p.len(), 1);
        let c = p.admit();
        assert_eq!(p.evicted(), 0, "room was made by the login that ended");
        assert!(tokio::time::timeout(Duration::from_millis(20), b.evicted())
            .await
            .is_err());
        drop((b, c));
        assert!(p.is_empty());
    }

    #[tokio::test]
    async fn idle_connects_go_before_logins_in_progress() {
        let p = pending(2);
        let busy = p.admit();
        busy.mark_started();
        let idle = p.admit();
        let _new = p.admit();
        tokio::time::timeout(Duration::from_secs(1), idle.evicted())
            .await
            .expect("the idle one goes, though younger");
        assert!(
            tokio::time::timeout(Duration::from_millis(20), busy.evicted())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn a_storm_of_real_logins_is_admitted_over_the_cap() {
        let p = pending(2);
        let a = p.admit();
        let b = p.admit();
        a.mark_started();
        b.mark_started();
        let c = p.admit();
        assert_eq!((p.len(), p.evicted(), p.over_cap()), (3, 0, 1));
        drop((a, b, c));
    }

    #[tokio::test]
    async fn a_stalled_login_goes_after_the_stall_time() {
        let p = PendingLogins::new(1, Duration::ZERO, Duration::from_millis(30));
        let slow = p.admit();
        slow.mark_started();
        tokio::time::sleep(Duration::from_millis(40)).await;
        let _new = p.admit();
        tokio::time::timeout(Duration::from_secs(1), slow.evicted())
            .await
            .expect("a login stalled longer than the stall time goes");
        assert_eq!(p.evicted(), 1);
    }

    #[tokio::test]
    async fn a_connection_just_made_gets_its_grace_time() {
        let p = PendingLogins::new(1, Duration::from_millis(50), STALL);
        let fresh = p.admit();
        let _next = p.admit();
        assert_eq!(
            (p.evicted(), p.over_cap()),
            (0, 1),
            "too young to be called idle"
        );
        tokio::time::sleep(Duration::from_millis(60)).await;
        let _later = p.admit();
        tokio::time::timeout(Duration::from_secs(1), fresh.evicted())
            .await
            .expect("idle past its grace time");
    }
}
