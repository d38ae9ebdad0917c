//! The cap on connections still logging in (`max_pending_logins`): each
//! accepted connection holds a ticket until its login ends; at the cap the
//! oldest ticket is evicted (its holder is told and closes the connection),
//! so a flood of idle TCP connects can never lock out a client that logs in
//! promptly. Logged-in clients count against `max_client_connections`
//! instead, once they hold no ticket.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The connections of one listener still logging in.
#[derive(Debug)]
pub struct PendingLogins {
    cap: usize,
    inner: Mutex<Queue>,
}

#[derive(Debug, Default)]
struct Queue {
    next: u64,
    /// By admission order: the first entry is the oldest.
    waiting: BTreeMap<u64, Arc<Notify>>,
    evicted: u64,
}

/// One connection's place among those logging in; dropping it (the login
/// ended, either way) frees the place.
#[derive(Debug)]
pub struct PendingTicket {
    id: u64,
    evict: Arc<Notify>,
    owner: Arc<PendingLogins>,
}

impl PendingLogins {
    /// At most `cap` connections logging in at once (at least one).
    pub fn new(cap: usize) -> Arc<PendingLogins> {
        Arc::new(PendingLogins {
            cap: cap.max(1),
            inner: Mutex::new(Queue::default()),
        })
    }

    /// Admits a new connection, evicting the oldest one still logging in
    /// when the cap is reached.
    pub fn admit(self: &Arc<Self>) -> PendingTicket {
        let evict = Arc::new(Notify::new());
        let mut q = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        while q.waiting.len() >= self.cap {
            let Some((_, oldest)) = q.waiting.pop_first() else {
                break;
            };
            // A stored permit: the holder sees it even if not waiting yet.
            oldest.notify_one();
            q.evicted += 1;
        }
        let id = q.next;
        q.next += 1;
        q.waiting.insert(id, evict.clone());
        PendingTicket {
            id,
            evict,
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
}

impl PendingTicket {
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

    #[tokio::test]
    async fn the_oldest_is_evicted_at_the_cap() {
        let p = PendingLogins::new(3);
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
        let p = PendingLogins::new(2);
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
}
