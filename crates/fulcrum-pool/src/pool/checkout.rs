//! A connection checked out of a pool: giving it back clean (to the idle
//! list, unless past `server_lifetime` or a RECONNECT), discarding it, and
//! what its drop settles (the backend's load, a RECONNECT's count).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::OwnedSemaphorePermit;

use super::{Idle, Inner};
use crate::coarse;
use crate::servers::Entry;

/// A connection checked out of a pool. Call `release` to give it back clean;
/// dropping it closes the connection instead.
pub struct Checkout<C> {
    pub(super) conn: Option<Box<C>>,
    /// When the connection was opened (precise, for a RECONNECT's cut;
    /// coarse, for `lifetime`).
    pub(super) born: Instant,
    pub(super) born_ms: u64,
    /// The worker event loop that opened it.
    pub(super) worker: usize,
    pub(super) budget: Vec<OwnedSemaphorePermit>,
    /// Its SHOW SERVERS entry (moves to the idle list on `release`).
    pub(super) entry: Option<Arc<Entry>>,
    pub(super) pool: Arc<Inner<C>>,
    /// The pool's permit (or the reserve's) it is used under; parked
    /// with it on the idle list when it goes back (`permits.rs`).
    pub(super) permit: Option<OwnedSemaphorePermit>,
}

impl<C> Checkout<C> {
    /// Says which client (its registry id) the connection now serves:
    /// SHOW SERVERS' `link` while it is checked out.
    pub fn link(&self, client: u64) {
        if let Some(e) = &self.entry {
            e.link(client);
        }
    }

    /// The server reported `application_name` = `name` (SHOW SERVERS
    /// follows it).
    pub fn application_name_reported(&self, name: &str) {
        if let Some(e) = &self.entry {
            e.application_name_reported(name);
        }
    }

    /// Gives a clean connection back to the pool.
    pub fn release(mut self) {
        if let Some(conn) = self.conn.take() {
            let now = coarse::ms();
            let idle = self.pool.idle_list();
            if self.pool.is_retired(self.born)
                || self
                    .pool
                    .settings
                    .lifetime
                    .is_some_and(|l| now.saturating_sub(self.born_ms) >= l.as_millis() as u64)
            {
                drop(idle);
                // Past `server_lifetime`: closed, a fresh one is opened
                // when needed.
                drop(conn);
                self.pool.closed.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let budget = std::mem::take(&mut self.budget);
            let Some(entry) = self.entry.take() else {
                // Every checkout is made with its entry: not reached.
                self.pool.closed.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let back = Idle {
                conn,
                since_ms: now,
                born: self.born,
                born_ms: self.born_ms,
                worker: self.worker,
                budget,
                entry,
                permit: None,
            };
            // Its permit parked with it, or released once it is listed.
            self.pool.push_idle(idle, back, self.permit.take());
            // Only a checkout waiting at a budget's cap listens.
            if !self.pool.budgets.is_empty() {
                self.pool.returned.notify_one();
            }
        }
    }

    /// Closes the connection instead of returning it.
    pub fn discard(mut self) {
        self.conn.take();
        self.pool.closed.fetch_add(1, Ordering::Relaxed);
    }
}

impl<C> Drop for Checkout<C> {
    fn drop(&mut self) {
        // Runs once per checkout, after release and discard too.
        self.pool.backend_load.fetch_sub(1, Ordering::Relaxed);
        if self.pool.is_retired(self.born) {
            let _ = self
                .pool
                .retiring
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        }
        if self.conn.take().is_some() {
            self.pool.closed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl<C> std::ops::Deref for Checkout<C> {
    type Target = C;
    fn deref(&self) -> &C {
        self.conn
            .as_ref()
            .expect("connection present until release")
    }
}

impl<C> std::ops::DerefMut for Checkout<C> {
    fn deref_mut(&mut self) -> &mut C {
        self.conn
            .as_mut()
            .expect("connection present until release")
    }
}
