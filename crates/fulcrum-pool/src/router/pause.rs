//! The pause gate (admin `PAUSE` / `RESUME`, of the cluster or of one
//! database): holding new units of work, waiting for the resume, and
//! counting the units admitted that do not yet hold a server connection
//! ([`Admission`]), so a pauser knows when none is between the gate and a
//! server. A unit pays for the per-database pause only while one is set
//! (one atomic load otherwise).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::Router;

/// A unit of work admitted past the pause gate ([`Router::admit`]); dropping
/// it says the unit now holds its server connection (or gave up).
#[derive(Debug)]
pub struct Admission(Arc<AtomicUsize>);

impl Drop for Admission {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Router {
    /// Holds (or releases) new units of work.
    pub fn set_paused(&self, paused: bool) {
        // SeqCst pairs with `admit`: a unit either sees the pause or is
        // counted in `admitting` before the pauser reads it.
        self.paused.store(paused, Ordering::SeqCst);
        if !paused {
            self.resumed.notify_waiters();
        }
        self.each_follower(|f| f.set_paused(paused));
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// Holds (or releases) the new units of work of `database` alone
    /// (admin `PAUSE db`), PgBouncer's per-database pause.
    pub fn set_database_paused(&self, database: &str, paused: bool) {
        {
            let mut list = self
                .paused_databases
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let at = list.iter().position(|d| **d == *database);
            match (paused, at) {
                (true, None) => list.push(database.into()),
                (false, Some(i)) => {
                    list.swap_remove(i);
                }
                _ => {}
            }
            // SeqCst pairs with `admit_to`, as `paused` with `admit`.
            self.databases_paused.store(list.len(), Ordering::SeqCst);
        }
        if !paused {
            self.resumed.notify_waiters();
        }
        self.each_follower(|f| f.set_database_paused(database, paused));
    }

    /// The databases paused one by one now.
    pub fn paused_databases(&self) -> Vec<Arc<str>> {
        self.paused_databases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether new units of `database` wait (the cluster's pause or the
    /// database's).
    pub fn is_database_paused(&self, database: &str) -> bool {
        self.paused.load(Ordering::SeqCst) || self.database_held(database)
    }

    fn database_held(&self, database: &str) -> bool {
        self.databases_paused.load(Ordering::SeqCst) != 0
            && self
                .paused_databases
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|d| **d == *database)
    }

    /// Waits while the cluster is paused (admin `PAUSE`); free when it is not.
    pub async fn wait_unpaused(&self) {
        self.wait_unpaused_for(None).await
    }

    /// Waits while the cluster, or `database` when given, is paused.
    async fn wait_unpaused_for(&self, database: Option<&str>) {
        loop {
            let resumed = self.resumed.notified();
            tokio::pin!(resumed);
            resumed.as_mut().enable();
            let held = match database {
                Some(d) => self.is_database_paused(d),
                None => self.is_paused(),
            };
            if !held {
                return;
            }
            resumed.await;
        }
    }

    /// [`Router::admit`] for a unit of `database`: held by the cluster's
    /// pause and by the database's own.
    pub async fn admit_to(&self, database: &str) -> Admission {
        loop {
            if let Some(a) = self.try_admit_to(database) {
                return a;
            }
            self.wait_unpaused_for(Some(database)).await;
        }
    }

    /// [`Router::try_admit`] for a unit of `database`.
    pub fn try_admit_to(&self, database: &str) -> Option<Admission> {
        let admission = self.try_admit()?;
        if self.database_held(database) {
            return None;
        }
        Some(admission)
    }

    /// Passes the pause gate for one unit of work. The unit is counted
    /// (in [`Router::admitting`]) from the moment it passes until the returned
    /// guard is dropped, which the session does once its server connection
    /// is checked out (and so counted in [`Router::load`]). A pauser that
    /// sees `admitting() == 0` after setting the pause therefore knows no
    /// unit is between the gate and a server: the window in which a unit
    /// could reach the old primary after a SWITCHOVER fenced it is closed.
    pub async fn admit(&self) -> Admission {
        loop {
            self.admitting.fetch_add(1, Ordering::SeqCst);
            if !self.paused.load(Ordering::SeqCst) {
                return Admission(self.admitting.clone());
            }
            self.admitting.fetch_sub(1, Ordering::SeqCst);
            self.wait_unpaused().await;
        }
    }

    /// [`Router::admit`] without waiting: `None` while paused.
    pub fn try_admit(&self) -> Option<Admission> {
        self.admitting.fetch_add(1, Ordering::SeqCst);
        if !self.paused.load(Ordering::SeqCst) {
            return Some(Admission(self.admitting.clone()));
        }
        self.admitting.fetch_sub(1, Ordering::SeqCst);
        None
    }

    /// Units of work admitted and not yet holding a server connection.
    pub fn admitting(&self) -> usize {
        self.admitting.load(Ordering::SeqCst)
    }
}
