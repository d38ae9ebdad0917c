//! A pool's idle list: what an idle connection holds, taking one for a
//! client (its own worker's first; expired and unusable ones closed on the
//! way), opening connections up to `min_size` ([`Pool::fill`]), and
//! closing idle ones (all after a backend failed, the oldest one when a
//! budget needs room).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::OwnedSemaphorePermit;

use super::{Inner, Pool, Poolable};
use crate::budget::IdleCloser;
use crate::servers::Entry;
use crate::{coarse, worker};

/// An idle connection and what it holds. The connection is boxed: it
/// moves between the idle list and a session on every unit of work, and
/// a pointer moves for free where a server connection's state would be
/// copied.
pub(super) struct Idle<C> {
    pub(super) conn: Box<C>,
    /// When it went idle ([`coarse::ms`]).
    pub(super) since_ms: u64,
    pub(super) born: Instant,
    /// When it was opened ([`coarse::ms`]), for `lifetime`.
    pub(super) born_ms: u64,
    /// The worker event loop that opened it (`crate::worker`).
    pub(super) worker: usize,
    /// One permit per budget over the pool.
    pub(super) budget: Vec<OwnedSemaphorePermit>,
    /// Its SHOW SERVERS entry.
    pub(super) entry: Arc<Entry>,
    /// The pool permit it went back with, parked while nobody waits
    /// (`permits.rs`); released to the semaphore when it is dropped.
    pub(super) permit: Option<OwnedSemaphorePermit>,
}

impl<C: Send> IdleCloser for Inner<C> {
    fn close_one_idle(&self) -> bool {
        let oldest = self.idle_list().pop_front();
        let closed = oldest.is_some();
        if closed {
            self.closed.fetch_add(1, Ordering::Relaxed);
        }
        closed
    }
}

impl<C: Poolable> Pool<C> {
    /// Opens connections until `min_size` are open (`min_pool_size`), as
    /// long as the pool and its budgets have room without waiting; returns
    /// how many it opened. A connect error stops it.
    pub async fn fill<E, F, Fut>(&self, connect: F) -> Result<usize, E>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<C, E>>,
    {
        let inner = &self.inner;
        let mut opened = 0;
        while self.open_count() < inner.settings.min_size as usize {
            // Held while connecting, so a client cannot open one beside it
            // past `size`.
            let Ok(permit) = self.try_permit() else {
                break;
            };
            let Ok(budget) = self.budget_permits::<E>(None).await else {
                break;
            };
            let conn = Box::new(connect().await?);
            inner.opened.fetch_add(1, Ordering::Relaxed);
            opened += 1;
            let (born, born_ms) = (Instant::now(), coarse::ms());
            let entry = self.track(&conn, born, born_ms);
            inner.idle_list().push_back(Idle {
                conn,
                since_ms: born_ms,
                born,
                born_ms,
                worker: worker::current(),
                budget,
                entry,
                permit: None,
            });
            inner.returned.notify_one();
            drop(permit);
        }
        Ok(opened)
    }

    /// Most recently used first (keeps few connections warm); expired and
    /// unusable ones are closed on the way. One the current worker opened
    /// comes first; another worker's only when opening a new one would
    /// take the pool past its size (or a budget governs the pool), since
    /// its socket's wake-ups go through that worker's thread.
    pub(super) fn take_idle(&self) -> Option<Idle<C>> {
        let now = coarse::ms();
        let inner = &self.inner;
        let settings = &inner.settings;
        let mut idle = inner.idle_list();
        self.expire_idle(&mut idle, now);
        let me = worker::current();
        loop {
            let own = idle.iter().rposition(|i| i.worker == me);
            let i = match own {
                Some(at) if at + 1 == idle.len() => idle.pop_back(),
                Some(at) => idle.remove(at),
                None => {
                    // Every permit held (this caller's included) may become
                    // an open connection beside the idle ones.
                    let held = (settings.size as usize).saturating_sub(inner.free_permits(&idle))
                        + settings.reserve_size as usize
                        - inner.reserve.available_permits();
                    let full = idle.len() + held > settings.size as usize;
                    if full || !inner.budgets.is_empty() {
                        idle.pop_back()
                    } else {
                        None
                    }
                }
            };
            let mut i = i?;
            if self.fit(&mut i, now) {
                return Some(i);
            }
            inner.closed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// [`take_idle`](Self::take_idle)'s usual case without the semaphore:
    /// the most recent idle connection is this worker's and holds a parked
    /// permit (`permits.rs`), so it is the one `take_idle` would choose,
    /// and its permit serves the checkout. `None` when that is not the
    /// case; the expired ones are closed first either way, and that one
    /// too when it is past its lifetime or unusable.
    pub(super) fn take_parked_idle(&self) -> Option<(Idle<C>, OwnedSemaphorePermit)> {
        let now = coarse::ms();
        let mut idle = self.inner.idle_list();
        self.expire_idle(&mut idle, now);
        let back = idle.back()?;
        if back.permit.is_none() || back.worker != worker::current() {
            return None;
        }
        let mut i = idle.pop_back()?;
        if !self.fit(&mut i, now) {
            self.inner.closed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let permit = i.permit.take()?;
        Some((i, permit))
    }

    /// Closes the connections idle past `server_idle_timeout` (the oldest,
    /// at the front of the list).
    fn expire_idle(&self, idle: &mut VecDeque<Idle<C>>, now: u64) {
        let idle_ms = self.inner.settings.idle_timeout.as_millis() as u64;
        while idle
            .front()
            .is_some_and(|i| now.saturating_sub(i.since_ms) > idle_ms)
        {
            idle.pop_front();
            self.inner.closed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// An idle connection may be handed out: within its lifetime and
    /// usable ([`Poolable::is_usable`]).
    fn fit(&self, i: &mut Idle<C>, now: u64) -> bool {
        let too_old = self
            .inner
            .settings
            .lifetime
            .is_some_and(|l| now.saturating_sub(i.born_ms) >= l.as_millis() as u64);
        !too_old && i.conn.is_usable()
    }

    /// Closes every idle connection (e.g. after the backend failed).
    pub fn clear_idle(&self) {
        let mut idle = self.inner.idle_list();
        let n = idle.len() as u64;
        idle.clear();
        self.inner.closed.fetch_add(n, Ordering::Relaxed);
    }
}
