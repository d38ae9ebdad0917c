//! A bounded pool of server connections for one (backend, user, database).
//!
//! `size` permits bound the connections in use; a connection is only opened by
//! a permit holder when no idle one is left, so idle + in use never exceeds
//! `size`. Waiters queue fairly (tokio's semaphore is FIFO) up to `timeout`.
//! A connection given back while nobody waits keeps its permit on the idle
//! list (`permits.rs`), so the usual checkout does no semaphore work.
//! A checked-out connection that is dropped without `release` is closed, so a
//! dirty connection can never come back.
//!
//! PgBouncer's budgets on top: `reserve_size` more connections for a client
//! that has waited `reserve_timeout`; caps shared with other pools of the
//! backend (`budget.rs`), whose permits an open connection holds; and
//! `min_size` connections kept open by [`Pool::fill`].

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::budget::{Budget, IdleCloser};
use crate::servers::{self, Entries, Entry, ListServers, PoolLabels, ServerIdentity};
use crate::{coarse, worker};

pub use checkout::Checkout;
use idle::Idle;

/// A connection the pool can hold.
pub trait Poolable: Send + 'static {
    /// Cheap, non-blocking check that an idle connection is still usable
    /// (e.g. the peer has not closed it). Called before handing it out.
    fn is_usable(&mut self) -> bool;

    /// A round trip proving the server still answers, for a connection idle
    /// longer than `check_delay` (PgBouncer's `server_check_query`).
    fn check(&mut self) -> impl Future<Output = bool> + Send {
        async { true }
    }

    /// What the connection says about itself (addresses, the server's
    /// process id, TLS), for SHOW SERVERS; read once, when it opens.
    fn identity(&self) -> ServerIdentity {
        ServerIdentity::default()
    }
}

#[derive(Debug, Error)]
pub enum PoolError<E> {
    #[error("timed out after {0:?} waiting for a server connection (pool of {1} is busy)")]
    Timeout(Duration, u32),
    #[error("timed out after {0:?} waiting for a server connection: {1} reached")]
    Budget(Duration, String),
    #[error("pool is closed")]
    Closed,
    #[error(transparent)]
    Connect(E),
}

/// Counters a pool keeps (read by the admin console and metrics later).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    pub idle: usize,
    /// Of `idle`, the connections idle past `server_check_delay`, checked
    /// before their next use (PgBouncer's `used`).
    pub used: usize,
    pub in_use: usize,
    /// Of `in_use`, the connections taken from the reserve.
    pub reserve: usize,
    pub opened: u64,
    pub closed: u64,
    pub waits: u64,
}

/// How a pool is sized (one per (backend, user, database)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    pub size: u32,
    pub timeout: Duration,
    pub idle_timeout: Duration,
    /// A connection older than this is closed when it comes back
    /// (`server_lifetime`); `None`: kept while it works.
    pub lifetime: Option<Duration>,
    /// `min_pool_size`: what [`Pool::fill`] keeps open.
    pub min_size: u32,
    /// `reserve_pool_size` connections beyond `size`, for a client that
    /// waited `reserve_timeout`.
    pub reserve_size: u32,
    pub reserve_timeout: Duration,
    /// `server_check_delay`: an idle connection older than this gets a
    /// [`Poolable::check`] before it is handed out (zero: always; `None`:
    /// never).
    pub check_delay: Option<Duration>,
}

impl PoolSettings {
    pub fn new(size: u32, timeout: Duration, idle_timeout: Duration) -> PoolSettings {
        PoolSettings {
            size,
            timeout,
            idle_timeout,
            lifetime: None,
            min_size: 0,
            reserve_size: 0,
            reserve_timeout: Duration::from_secs(5),
            check_delay: None,
        }
    }
}

pub struct Pool<C> {
    inner: Arc<Inner<C>>,
}

impl<C> Clone for Pool<C> {
    fn clone(&self) -> Self {
        Pool {
            inner: self.inner.clone(),
        }
    }
}

/// Told the outcome of each `server_check_delay` check (true: it answered),
/// e.g. to count them in metrics.
pub type CheckHook = Arc<dyn Fn(bool) + Send + Sync>;

struct Inner<C> {
    settings: PoolSettings,
    permits: Arc<Semaphore>,
    reserve: Arc<Semaphore>,
    idle: Mutex<VecDeque<Idle<C>>>,
    /// Clients waiting for a permit (`permits.rs`); raised under the idle
    /// lock, read under it by a connection given back.
    waiting: AtomicUsize,
    /// A connection went idle: wakes a checkout waiting at a budget's cap,
    /// which takes it rather than a new one.
    returned: tokio::sync::Notify,
    budgets: Vec<Arc<Budget>>,
    opened: AtomicU64,
    closed: AtomicU64,
    waits: AtomicU64,
    /// Connections checked out of every pool of this backend (shared with the
    /// router for least-connections balancing).
    backend_load: Arc<AtomicUsize>,
    /// Admin `RECONNECT`: connections opened before this (ns after
    /// [`epoch`]; 0: never) are closed when they come back.
    retired_ns: AtomicU64,
    /// Of those, how many were in use at the RECONNECT and are not closed yet.
    retiring: AtomicUsize,
    /// Told each `server_check_delay` check's outcome.
    on_check: Option<CheckHook>,
    /// The open connections, for SHOW SERVERS.
    entries: Entries,
    /// Whom the connections serve; a labelled pool is listed by
    /// [`servers::snapshot`].
    labels: std::sync::OnceLock<PoolLabels>,
}

/// The clock `retired_ns` counts from.
fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl<C> Inner<C> {
    /// Opened before the last RECONNECT.
    fn is_retired(&self, born: Instant) -> bool {
        let at = self.retired_ns.load(Ordering::Acquire);
        at != 0 && (born.saturating_duration_since(epoch()).as_nanos() as u64) < at
    }

    /// Idle since `since_ms` and past `server_check_delay` at `now`
    /// (coarse ms): checked before its next use, PgBouncer's `used`.
    fn past_check_delay(&self, since_ms: u64, now: u64) -> bool {
        self.settings
            .check_delay
            .is_some_and(|d| now.saturating_sub(since_ms) >= d.as_millis() as u64)
    }
}

impl<C: Poolable> Pool<C> {
    pub fn new(size: u32, timeout: Duration, idle_timeout: Duration) -> Pool<C> {
        Self::with_load(size, timeout, idle_timeout, Arc::new(AtomicUsize::new(0)))
    }

    /// A pool whose checked-out connections are also counted in `backend_load`.
    pub fn with_load(
        size: u32,
        timeout: Duration,
        idle_timeout: Duration,
        backend_load: Arc<AtomicUsize>,
    ) -> Pool<C> {
        Self::configured(
            PoolSettings::new(size, timeout, idle_timeout),
            backend_load,
            Vec::new(),
            None,
        )
    }

    /// A pool with every setting, counted in `backend_load`, under `budgets`,
    /// telling `on_check` the outcome of each `server_check_delay` check.
    pub fn configured(
        settings: PoolSettings,
        backend_load: Arc<AtomicUsize>,
        budgets: Vec<Arc<Budget>>,
        on_check: Option<CheckHook>,
    ) -> Pool<C> {
        let inner = Arc::new(Inner {
            settings,
            permits: Arc::new(Semaphore::new(settings.size as usize)),
            reserve: Arc::new(Semaphore::new(settings.reserve_size as usize)),
            idle: Mutex::new(VecDeque::new()),
            waiting: AtomicUsize::new(0),
            returned: tokio::sync::Notify::new(),
            budgets,
            opened: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            backend_load,
            retired_ns: AtomicU64::new(0),
            retiring: AtomicUsize::new(0),
            on_check,
            entries: Entries::default(),
            labels: std::sync::OnceLock::new(),
        });
        for b in &inner.budgets {
            let weak: std::sync::Weak<dyn IdleCloser> =
                Arc::downgrade(&(inner.clone() as Arc<dyn IdleCloser>));
            b.join(weak);
        }
        Pool { inner }
    }

    /// Connections older than `lifetime` are closed instead of reused
    /// (`None`: kept as long as they work). For a pool just made.
    pub fn with_lifetime(mut self, lifetime: Option<Duration>) -> Pool<C> {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.settings.lifetime = lifetime;
        }
        self
    }

    pub fn settings(&self) -> &PoolSettings {
        &self.inner.settings
    }

    /// Names whom the pool serves and lists its connections in
    /// [`servers::snapshot`] (SHOW SERVERS). The first labels given stay.
    pub fn labelled(self, labels: PoolLabels) -> Pool<C> {
        if self.inner.labels.set(labels).is_ok() {
            let weak: std::sync::Weak<dyn ListServers> =
                Arc::downgrade(&(self.inner.clone() as Arc<dyn ListServers>));
            servers::register(weak);
        }
        self
    }

    /// A connection just opened: its entry, listed.
    fn track(&self, conn: &C, born: Instant, born_ms: u64) -> Arc<Entry> {
        let entry = Entry::new(conn.identity(), born, born_ms);
        self.inner.entries.opened(&entry);
        entry
    }

    /// An idle connection ready at once, or `None` (no permit free, none
    /// idle, or the one at hand is due its `server_check_delay` check):
    /// [`Pool::get`] without a future, for the common case of a unit that
    /// finds a connection waiting.
    pub fn try_get(&self) -> Option<Checkout<C>> {
        let (idle, permit) = match self.take_parked_idle() {
            Some(parked) => parked,
            None => {
                let permit = self.try_permit().ok()?;
                (self.take_idle()?, permit)
            }
        };
        if self.check_due(&idle) {
            // Checked by `get`: back where it was (the most recent end).
            self.inner
                .push_idle(self.inner.idle_list(), idle, Some(permit));
            return None;
        }
        Some(self.hand_out(idle, permit))
    }

    /// `idle` has been quiet for `server_check_delay`: checked before use.
    fn check_due(&self, idle: &Idle<C>) -> bool {
        self.inner
            .settings
            .check_delay
            .is_some_and(|d| Duration::from_millis(coarse::ms().saturating_sub(idle.since_ms)) >= d)
    }

    /// The checkout of idle connection `idle`, under `permit`.
    fn hand_out(&self, idle: Idle<C>, permit: OwnedSemaphorePermit) -> Checkout<C> {
        let inner = &self.inner;
        inner.backend_load.fetch_add(1, Ordering::Relaxed);
        idle.entry.requested();
        Checkout {
            conn: Some(idle.conn),
            born: idle.born,
            born_ms: idle.born_ms,
            worker: idle.worker,
            budget: idle.budget,
            entry: Some(idle.entry),
            pool: inner.clone(),
            permit: Some(permit),
        }
    }

    /// Takes an idle connection, or opens one with `connect` when none is idle.
    ///
    /// The waits (for a permit, a check, a new connection) are boxed: they
    /// are rare, and their futures' state would otherwise be part of every
    /// client session's task, idle or not (docs/architecture.md, "Memory
    /// per idle client"). A permit at hand and an idle connection that
    /// needs no check allocate nothing.
    pub async fn get<E, F, Fut>(&self, connect: F) -> Result<Checkout<C>, PoolError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<C, E>>,
    {
        let inner = &self.inner;
        let deadline = tokio::time::Instant::from_std(coarse::now()) + inner.settings.timeout;
        let permit = match self.try_permit() {
            Ok(p) => p,
            Err(_) => Box::pin(self.permit(deadline)).await?,
        };
        while let Some(mut idle) = self.take_idle() {
            let quiet_for = || Duration::from_millis(coarse::ms().saturating_sub(idle.since_ms));
            if self.check_due(&idle) {
                let answered = Box::pin(tokio::time::timeout_at(deadline, idle.conn.check())).await;
                let passed = matches!(answered, Ok(true));
                if let Some(hook) = &inner.on_check {
                    hook(passed);
                }
                if !passed {
                    // Gone quiet for good (a restarted server, a dropped
                    // NAT entry): closed, and the next one is tried.
                    tracing::debug!(
                        quiet_for = ?quiet_for(),
                        "server_check_delay: an idle server connection failed its check; closed"
                    );
                    inner.closed.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            return Ok(self.hand_out(idle, permit));
        }
        Box::pin(self.open(permit, deadline, connect)).await
    }

    /// [`get`](Self::get)'s new connection: the budgets' permits, then
    /// `connect`.
    async fn open<E, F, Fut>(
        &self,
        permit: OwnedSemaphorePermit,
        deadline: tokio::time::Instant,
        connect: F,
    ) -> Result<Checkout<C>, PoolError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<C, E>>,
    {
        let inner = &self.inner;
        // At a budget's cap, a connection of this pool given back
        // meanwhile serves this checkout: the budget's room is held by the
        // pool's own idle connections, so waiting for a permit alone
        // would wait until one of them closes.
        let budget = loop {
            tokio::select! {
                biased;
                b = self.budget_permits(Some(deadline)) => break b?,
                () = inner.returned.notified() => {
                    if let Some(idle) = self.take_idle() {
                        return Ok(self.hand_out(idle, permit));
                    }
                }
            }
        };
        let conn = Box::new(connect().await.map_err(PoolError::Connect)?);
        inner.opened.fetch_add(1, Ordering::Relaxed);
        inner.backend_load.fetch_add(1, Ordering::Relaxed);
        let (born, born_ms) = (Instant::now(), coarse::ms());
        let entry = self.track(&conn, born, born_ms);
        Ok(Checkout {
            conn: Some(conn),
            born,
            born_ms,
            worker: worker::current(),
            budget,
            entry: Some(entry),
            pool: inner.clone(),
            permit: Some(permit),
        })
    }

    /// A permit to use a connection: the pool's own, else after
    /// `reserve_timeout` one of the reserve's, until `deadline`.
    async fn permit<E>(
        &self,
        deadline: tokio::time::Instant,
    ) -> Result<OwnedSemaphorePermit, PoolError<E>> {
        let inner = &self.inner;
        match inner.permits.clone().try_acquire_owned() {
            Ok(p) => return Ok(p),
            Err(tokio::sync::TryAcquireError::Closed) => return Err(PoolError::Closed),
            Err(tokio::sync::TryAcquireError::NoPermits) => {}
        }
        // Registered until served or given up: meanwhile a connection
        // given back releases its permit to the semaphore, not the list.
        let _waiting = match self.parked_or_wait() {
            Ok(p) => return Ok(p),
            Err(waiting) => waiting,
        };
        inner.waits.fetch_add(1, Ordering::Relaxed);
        let timeout = || PoolError::Timeout(inner.settings.timeout, inner.settings.size);
        if inner.settings.reserve_size > 0 {
            let reserve_at = tokio::time::Instant::now() + inner.settings.reserve_timeout;
            if reserve_at < deadline {
                match tokio::time::timeout_at(reserve_at, inner.permits.clone().acquire_owned())
                    .await
                {
                    Ok(Ok(p)) => return Ok(p),
                    Ok(Err(_)) => return Err(PoolError::Closed),
                    Err(_) => {}
                }
                let either = async {
                    tokio::select! {
                        p = inner.permits.clone().acquire_owned() => p,
                        p = inner.reserve.clone().acquire_owned() => p,
                    }
                };
                return match tokio::time::timeout_at(deadline, either).await {
                    Ok(Ok(p)) => Ok(p),
                    Ok(Err(_)) => Err(PoolError::Closed),
                    Err(_) => Err(timeout()),
                };
            }
        }
        match tokio::time::timeout_at(deadline, inner.permits.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(_)) => Err(PoolError::Closed),
            Err(_) => Err(timeout()),
        }
    }

    /// One permit of each budget over the pool for a new connection. At a
    /// cap, for a client (`deadline` given), an idle connection of another
    /// pool under it is closed first, then it waits until `deadline`;
    /// `None` (warming up) takes only free room.
    async fn budget_permits<E>(
        &self,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Vec<OwnedSemaphorePermit>, PoolError<E>> {
        let me = Arc::as_ptr(&self.inner) as *const () as usize;
        let mut held = Vec::with_capacity(self.inner.budgets.len());
        for b in &self.inner.budgets {
            let mut permit = b.permits.clone().try_acquire_owned().ok();
            if permit.is_none() && deadline.is_some() && b.make_room(me) {
                permit = b.permits.clone().try_acquire_owned().ok();
            }
            let permit = match (permit, deadline) {
                (Some(p), _) => p,
                (None, Some(deadline)) => {
                    match tokio::time::timeout_at(deadline, b.permits.clone().acquire_owned()).await
                    {
                        Ok(Ok(p)) => p,
                        _ => {
                            return Err(PoolError::Budget(
                                self.inner.settings.timeout,
                                b.what.clone(),
                            ))
                        }
                    }
                }
                (None, None) => {
                    return Err(PoolError::Budget(Duration::ZERO, b.what.clone()));
                }
            };
            held.push(permit);
        }
        Ok(held)
    }

    /// Connections open now, idle or in use.
    pub fn open_count(&self) -> usize {
        let s = self.stats();
        s.idle + s.in_use
    }

    pub fn stats(&self) -> PoolStats {
        let s = &self.inner.settings;
        let (idle, used, free) = {
            let list = self.inner.idle_list();
            let now = coarse::ms();
            let used = list
                .iter()
                .filter(|i| self.inner.past_check_delay(i.since_ms, now))
                .count();
            (list.len(), used, self.inner.free_permits(&list))
        };
        let reserve = s.reserve_size as usize - self.inner.reserve.available_permits();
        PoolStats {
            idle,
            used,
            in_use: (s.size as usize).saturating_sub(free) + reserve,
            reserve,
            opened: self.inner.opened.load(Ordering::Relaxed),
            closed: self.inner.closed.load(Ordering::Relaxed),
            waits: self.inner.waits.load(Ordering::Relaxed),
        }
    }

    /// Admin `RECONNECT`: idle connections are closed now, the ones in use
    /// when they come back; new ones are opened as needed.
    pub fn retire(&self) {
        let inner = &self.inner;
        let mut idle = inner.idle_list();
        let now = Instant::now().saturating_duration_since(epoch()).as_nanos() as u64;
        inner.retired_ns.store(now.max(1), Ordering::Release);
        inner.closed.fetch_add(idle.len() as u64, Ordering::Relaxed);
        // Their parked permits go back to the semaphore here.
        idle.clear();
        // Checked out now: what the permits say (the idle lock is held).
        let s = &inner.settings;
        let in_use = s.size as usize - inner.permits.available_permits()
            + (s.reserve_size as usize - inner.reserve.available_permits());
        inner.retiring.store(in_use, Ordering::Release);
    }

    /// Connections a `RECONNECT` is still waiting to close (admin `WAIT_CLOSE`).
    pub fn retiring(&self) -> usize {
        self.inner.retiring.load(Ordering::Acquire)
    }
}

mod checkout;
mod idle;
mod listing;
mod permits;
#[cfg(test)]
mod tests;
