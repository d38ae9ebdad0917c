//! A cap on open server connections shared by several pools of one backend:
//! PgBouncer's `max_db_connections` (one database, every user) and
//! `max_user_connections` (one user, every database). An open connection
//! holds one permit of each cap over its pool, idle or in use, and gives it
//! back when it is closed. A pool that needs a connection at the cap first
//! closes an idle connection of another pool under the same cap (PgBouncer
//! waits for `server_idle_timeout` there), then waits.

use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Semaphore;

/// Closes one idle connection of a pool (a member of a budget).
pub(crate) trait IdleCloser: Send + Sync {
    /// True when one was closed.
    fn close_one_idle(&self) -> bool;
}

pub struct Budget {
    /// What the cap is, for errors: `max_db_connections (4) for database "app"`.
    pub what: String,
    pub limit: u32,
    pub(crate) permits: Arc<Semaphore>,
    members: Mutex<Vec<Weak<dyn IdleCloser>>>,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget")
            .field("what", &self.what)
            .field("open", &self.open())
            .finish()
    }
}

impl Budget {
    pub fn new(limit: u32, what: impl Into<String>) -> Arc<Budget> {
        Arc::new(Budget {
            what: what.into(),
            limit,
            permits: Arc::new(Semaphore::new(limit as usize)),
            members: Mutex::new(Vec::new()),
        })
    }

    /// Connections open under the cap now.
    pub fn open(&self) -> usize {
        (self.limit as usize).saturating_sub(self.permits.available_permits())
    }

    pub(crate) fn join(&self, member: Weak<dyn IdleCloser>) {
        let mut members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        members.retain(|m| m.strong_count() > 0);
        members.push(member);
    }

    /// Closes an idle connection of a member other than `except`, making room.
    pub(crate) fn make_room(&self, except: usize) -> bool {
        let members: Vec<Arc<dyn IdleCloser>> = self
            .members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        members
            .iter()
            .filter(|m| Arc::as_ptr(m) as *const () as usize != except)
            .any(|m| m.close_one_idle())
    }
}

/// (backend, is it a database cap, the database or user name).
type BudgetKey = (usize, bool, Arc<str>);

/// The budgets of one cluster, made on first use: one per (backend,
/// database) under `max_db_connections`, one per (backend, user) under
/// that user's `max_user_connections` (0: that cap is off).
#[derive(Debug, Default)]
pub struct Budgets {
    max_db: u32,
    made: Mutex<std::collections::HashMap<BudgetKey, Arc<Budget>>>,
}

impl Budgets {
    pub fn new(max_db: u32) -> Budgets {
        Budgets {
            max_db,
            made: Mutex::default(),
        }
    }

    /// The budgets a new pool of (backend, user, database) is under
    /// (`database` `None`: connections not tied to one, as MySQL's), the
    /// user's cap being `max_user` (its own or the cluster's; the same for
    /// every pool of the user).
    pub fn for_pool(
        &self,
        backend: usize,
        user: &Arc<str>,
        database: Option<&Arc<str>>,
        max_user: u32,
    ) -> Vec<Arc<Budget>> {
        let mut out = Vec::new();
        if self.max_db == 0 && max_user == 0 {
            return out;
        }
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(db) = database.filter(|_| self.max_db > 0) {
            let max = self.max_db;
            out.push(
                made.entry((backend, true, db.clone()))
                    .or_insert_with(|| {
                        Budget::new(
                            max,
                            format!("max_db_connections ({max}) for database \"{db}\""),
                        )
                    })
                    .clone(),
            );
        }
        if max_user > 0 {
            let max = max_user;
            out.push(
                made.entry((backend, false, user.clone()))
                    .or_insert_with(|| {
                        Budget::new(
                            max,
                            format!("max_user_connections ({max}) for user \"{user}\""),
                        )
                    })
                    .clone(),
            );
        }
        out
    }
}
