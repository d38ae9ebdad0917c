//! LISTEN/NOTIFY without pinning (transaction pooling). The registry owns,
//! per (database, user), one `Hub`: the channels its clients listen to and
//! who listens to each. A hub's task keeps one server connection on the
//! primary listening to the union of those channels and fans each
//! NotificationResponse out, raw, to the clients subscribed to its channel.
//! A client's session holds only its `Subscription` (its id and its queue);
//! it delivers what is queued when it owes the client nothing.

use std::collections::HashMap;
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
        let id = hub.join(tx);
        Subscription { hub, id, rx }
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

/// One client's part in its hub: what it listens to is the hub's record;
/// the client holds its queue. Dropped with the session: it listens no more.
pub struct Subscription {
    hub: Arc<Hub>,
    id: u64,
    rx: mpsc::Receiver<Bytes>,
}

impl Subscription {
    /// `LISTEN channel` (a channel already listened to stays as it is).
    /// `Some`: the server has yet to confirm the channel; the answer to the
    /// client waits for it, so a notification committed after the client's
    /// LISTEN completed reaches it.
    pub fn listen(&self, channel: String) -> Option<Confirmation> {
        self.hub.listen(self.id, channel)
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
        self.rx.poll_recv(cx)
    }

    /// A notification already queued, if any.
    pub fn try_next(&mut self) -> Option<Bytes> {
        self.rx.try_recv().ok()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.leave(self.id);
    }
}
