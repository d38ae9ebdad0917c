//! Pool permits parked with idle connections. A connection given back keeps
//! its permit on the idle list while no client waits for one, so the next
//! checkout that takes it does no semaphore work (issue 44: an acquire and
//! a release, which locks the semaphore's waiter list, per unit of work).
//!
//! A parked permit is as free as one in the semaphore: anyone needing a
//! permit takes one from the list when the semaphore has none, and every
//! count of free permits adds the parked ones. A client about to wait for a
//! permit takes a parked one, or registers as waiting, under the idle
//! list's lock; a connection given back reads that count under the same
//! lock and, while anyone waits, releases its permit to the semaphore
//! instead, which hands it to the first waiter (FIFO, as before).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, MutexGuard};

use tokio::sync::{OwnedSemaphorePermit, TryAcquireError};

use super::{Idle, Inner, Pool, Poolable};

/// A client registered as waiting for a permit; unregistered when dropped
/// (served, timed out, or its checkout abandoned).
pub(super) struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<C> Inner<C> {
    /// Locks the idle list.
    pub(super) fn idle_list(&self) -> MutexGuard<'_, VecDeque<Idle<C>>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Free permits of the pool's own (not the reserve's): the semaphore's
    /// and those parked on `idle` (the list locked by the caller).
    pub(super) fn free_permits(&self, idle: &VecDeque<Idle<C>>) -> usize {
        self.permits.available_permits() + idle.iter().filter(|i| i.permit.is_some()).count()
    }

    /// Whether `permit`, given back with its connection, may be parked on
    /// the idle list (the caller holds its lock): one of the pool's own
    /// (a reserve permit goes back to the reserve) while nobody waits.
    pub(super) fn may_park(&self, permit: &OwnedSemaphorePermit) -> bool {
        self.waiting.load(Ordering::Relaxed) == 0 && Arc::ptr_eq(permit.semaphore(), &self.permits)
    }

    /// Puts `idle` at the most recent end of `list` (locked by the caller,
    /// unlocked here), `permit` parked with it when [`Inner::may_park`]
    /// allows, else released once the connection is on the list (a waiter
    /// woken earlier would find no idle connection and open one beside it).
    pub(super) fn push_idle(
        &self,
        mut list: MutexGuard<'_, VecDeque<Idle<C>>>,
        mut idle: Idle<C>,
        permit: Option<OwnedSemaphorePermit>,
    ) {
        let release = match permit {
            Some(p) if self.may_park(&p) => {
                idle.permit = Some(p);
                None
            }
            other => other,
        };
        list.push_back(idle);
        drop(list);
        drop(release);
    }
}

/// A permit parked on `idle`, taken off its connection (most recent first).
pub(super) fn take_parked<C>(idle: &mut VecDeque<Idle<C>>) -> Option<OwnedSemaphorePermit> {
    idle.iter_mut().rev().find_map(|i| i.permit.take())
}

impl<C: Poolable> Pool<C> {
    /// A free permit without waiting: the semaphore's, else one parked on
    /// the idle list.
    pub(super) fn try_permit(&self) -> Result<OwnedSemaphorePermit, TryAcquireError> {
        match self.inner.permits.clone().try_acquire_owned() {
            Err(TryAcquireError::NoPermits) => {
                take_parked(&mut self.inner.idle_list()).ok_or(TryAcquireError::NoPermits)
            }
            got => got,
        }
    }

    /// A parked permit, or else this client registered as waiting, both
    /// under the idle list's lock: a connection given back after this sees
    /// the waiter and releases its permit to the semaphore.
    pub(super) fn parked_or_wait(&self) -> Result<OwnedSemaphorePermit, Waiting<'_>> {
        let mut idle = self.inner.idle_list();
        match take_parked(&mut idle) {
            Some(p) => Ok(p),
            None => {
                self.inner.waiting.fetch_add(1, Ordering::Relaxed);
                Err(Waiting(&self.inner.waiting))
            }
        }
    }
}
