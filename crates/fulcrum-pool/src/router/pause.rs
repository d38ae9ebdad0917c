//! The pause gate (admin `PAUSE` / `RESUME`): holding new units of work,
//! waiting for the resume, and counting the units admitted that do not yet
//! hold a server connection ([`Admission`]), so a pauser knows when none is
//! between the gate and a server.

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

    /// Waits while the cluster is paused (admin `PAUSE`); free when it is not.
    pub async fn wait_unpaused(&self) {
        loop {
            let resumed = self.resumed.notified();
            tokio::pin!(resumed);
            resumed.as_mut().enable();
            if !self.is_paused() {
                return;
            }
            resumed.await;
        }
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
