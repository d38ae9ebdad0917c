//! LISTEN/NOTIFY without pinning (transaction pooling). The registry owns,
//! per (database, user), one `Hub`: the channels its clients listen to and
//! who listens to each. A hub's task keeps one server connection on the
//! primary listening to the union of those channels and fans each
//! NotificationResponse out, raw, to the clients subscribed to its channel.
//! A client's session holds only its `Subscription` (its id and its queue);
//! it delivers what is queued when it owes the client nothing. A client's
//! queue is bounded in count (`notify_queue`) and in bytes
//! (`max_client_notify_bytes`, kept by [`Queued`]); past either, the next
//! notifications for that client are dropped (counted).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::frontend::context::ClusterContext;

mod hub;
mod senders;

pub use hub::{Confirmation, Hub, Listing};
pub use senders::Senders;

/// The hubs of one cluster, by (database, user).
/// (database, user).
type HubKey = (Arc<str>, Arc<str>);

#[derive(Default)]
pub struct Registry {
    hubs: Mutex<HashMap<HubKey, Arc<Hub>>>,
    /// Who notified through which server connection.
    pub senders: Senders,
}

impl Registry {
    /// A new subscription of a client of `user` on `database`: it listens
    /// to nothing yet. The hub (and its task) is made on first use.
    pub fn subscribe(
        ctx: &Arc<ClusterContext>,
        user: &Arc<str>,
        database: &Arc<str>,
    ) -> Subscription {
        let hub = {
            let mut hubs = ctx
                .notifications
                .hubs
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            hubs.entry((database.clone(), user.clone()))
                .or_insert_with(|| Hub::start(ctx, user.clone(), database.clone()))
                .clone()
        };
        let (tx, rx) = mpsc::channel(ctx.config.notify_queue as usize);
        let max = usize::try_from(ctx.config.max_client_notify_bytes).unwrap_or(usize::MAX);
        let queued = Arc::new(Queued::new(max));
        let id = hub.join(tx, queued.clone());
        Subscription {
            hub,
            id,
            rx,
            queued,
        }
    }

    /// Channels listened to and subscribed clients, per (database, user)
    /// (`SHOW LISTENERS`).
    pub fn listing(&self) -> Vec<Listing> {
        let hubs = self.hubs.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = hubs.values().map(|h| h.listing()).collect();
        out.sort_by(|a, b| (&a.database, &a.user).cmp(&(&b.database, &b.user)));
        out
    }
}

/// The bytes of the notifications queued for one client, and their bound
/// (`max_client_notify_bytes`): the hub reserves a notification's bytes
/// before queueing it, the client's session gives them back as it takes it.
#[derive(Debug)]
pub struct Queued {
    bytes: AtomicUsize,
    max: usize,
}

impl Queued {
    pub fn new(max: usize) -> Queued {
        Queued {
            bytes: AtomicUsize::new(0),
            max,
        }
    }

    /// Reserves `n` bytes; false (nothing reserved) when they would take
    /// the queue past its bound.
    pub fn reserve(&self, n: usize) -> bool {
        self.bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(n).filter(|total| *total <= self.max)
            })
            .is_ok()
    }

    /// Gives back `n` bytes reserved before.
    pub fn release(&self, n: usize) {
        let _ = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held.saturating_sub(n))
            });
    }

    /// The bytes held now.
    pub fn held(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }
}

/// One client's part in its hub: what it listens to is the hub's record;
/// the client holds its queue. Dropped with the session: it listens no more.
pub struct Subscription {
    hub: Arc<Hub>,
    id: u64,
    rx: mpsc::Receiver<Bytes>,
    queued: Arc<Queued>,
}

impl Subscription {
    /// `LISTEN channel` (a channel already listened to stays as it is).
    /// `Some`: the server has yet to confirm the channel; the answer to the
    /// client waits for it, so a notification committed after the client's
    /// LISTEN completed reaches it.
    pub fn listen(&self, channel: String) -> Option<Confirmation> {
        self.hub.listen(self.id, channel)
    }

    /// The channels it listens to (a binary upgrade carries them).
    pub fn channels(&self) -> Vec<String> {
        self.hub.channels_of(self.id)
    }

    /// `UNLISTEN channel`.
    pub fn unlisten(&self, channel: &str) {
        self.hub.unlisten(self.id, channel);
    }

    /// `UNLISTEN *`.
    pub fn unlisten_all(&self) {
        self.hub.unlisten_all(self.id);
    }

    /// The next notification queued for the client, when one comes.
    pub fn poll_next(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Bytes>> {
        let next = self.rx.poll_recv(cx);
        if let std::task::Poll::Ready(Some(frame)) = &next {
            self.queued.release(frame.len());
        }
        next
    }

    /// A notification already queued, if any.
    pub fn try_next(&mut self) -> Option<Bytes> {
        let frame = self.rx.try_recv().ok()?;
        self.queued.release(frame.len());
        Some(frame)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.leave(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bytes_queued_are_bounded_and_given_back() {
        let q = Queued::new(100);
        assert!(q.reserve(60));
        assert!(!q.reserve(41), "past the bound: nothing reserved");
        assert_eq!(q.held(), 60);
        assert!(q.reserve(40), "up to the bound");
        assert!(!q.reserve(1));
        q.release(60);
        assert!(q.reserve(50));
        assert_eq!(q.held(), 90);
        assert!(!q.reserve(usize::MAX), "no overflow");
        q.release(1000);
        assert_eq!(q.held(), 0, "never below zero");
    }
}
