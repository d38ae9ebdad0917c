//! A bounded pool of server connections for one (backend, user, database).
//!
//! `size` permits bound the connections in use; a connection is only opened by
//! a permit holder when no idle one is left, so idle + in use never exceeds
//! `size`. Waiters queue fairly (tokio's semaphore is FIFO) up to `timeout`.
//! A checked-out connection that is dropped without `release` is closed, so a
//! dirty connection can never come back.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A connection the pool can hold.
pub trait Poolable: Send + 'static {
    /// Cheap, non-blocking check that an idle connection is still usable
    /// (e.g. the peer has not closed it). Called before handing it out.
    fn is_usable(&mut self) -> bool;
}

#[derive(Debug, Error)]
pub enum PoolError<E> {
    #[error("timed out after {0:?} waiting for a server connection (pool of {1} is busy)")]
    Timeout(Duration, u32),
    #[error("pool is closed")]
    Closed,
    #[error(transparent)]
    Connect(E),
}

/// Counters a pool keeps (read by the admin console and metrics later).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    pub idle: usize,
    pub in_use: usize,
    pub opened: u64,
    pub closed: u64,
    pub waits: u64,
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

struct Inner<C> {
    size: u32,
    timeout: Duration,
    idle_timeout: Duration,
    /// A connection older than this is closed when it comes back (and not
    /// handed out again from idle): `server_lifetime`.
    lifetime: Option<Duration>,
    permits: Arc<Semaphore>,
    /// Idle connections: (connection, idle since, opened at).
    idle: Mutex<VecDeque<(C, Instant, Instant)>>,
    opened: AtomicU64,
    closed: AtomicU64,
    waits: AtomicU64,
    /// Connections checked out of every pool of this backend (shared with the
    /// router for least-connections balancing).
    backend_load: Arc<AtomicUsize>,
}

/// A connection checked out of a pool. Call `release` to give it back clean;
/// dropping it closes the connection instead.
pub struct Checkout<C> {
    conn: Option<C>,
    /// When the connection was opened.
    born: Instant,
    pool: Arc<Inner<C>>,
    _permit: OwnedSemaphorePermit,
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
        Pool {
            inner: Arc::new(Inner {
                size,
                timeout,
                idle_timeout,
                lifetime: None,
                permits: Arc::new(Semaphore::new(size as usize)),
                idle: Mutex::new(VecDeque::new()),
                opened: AtomicU64::new(0),
                closed: AtomicU64::new(0),
                waits: AtomicU64::new(0),
                backend_load,
            }),
        }
    }

    /// Connections older than `lifetime` are closed instead of reused
    /// (`None`: kept as long as they work). For a pool just made.
    pub fn with_lifetime(mut self, lifetime: Option<Duration>) -> Pool<C> {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.lifetime = lifetime;
        }
        self
    }

    /// Takes an idle connection, or opens one with `connect` when none is idle.
    pub async fn get<E, F, Fut>(&self, connect: F) -> Result<Checkout<C>, PoolError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<C, E>>,
    {
        let inner = &self.inner;
        let permit = match inner.permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(tokio::sync::TryAcquireError::Closed) => return Err(PoolError::Closed),
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                inner.waits.fetch_add(1, Ordering::Relaxed);
                match tokio::time::timeout(inner.timeout, inner.permits.clone().acquire_owned())
                    .await
                {
                    Ok(Ok(p)) => p,
                    Ok(Err(_)) => return Err(PoolError::Closed),
                    Err(_) => return Err(PoolError::Timeout(inner.timeout, inner.size)),
                }
            }
        };
        if let Some((conn, born)) = self.take_idle() {
            inner.backend_load.fetch_add(1, Ordering::Relaxed);
            return Ok(Checkout {
                conn: Some(conn),
                born,
                pool: inner.clone(),
                _permit: permit,
            });
        }
        let conn = connect().await.map_err(PoolError::Connect)?;
        inner.opened.fetch_add(1, Ordering::Relaxed);
        inner.backend_load.fetch_add(1, Ordering::Relaxed);
        Ok(Checkout {
            conn: Some(conn),
            born: Instant::now(),
            pool: inner.clone(),
            _permit: permit,
        })
    }

    /// Most recently used first (keeps few connections warm); expired and
    /// unusable ones are closed on the way.
    fn take_idle(&self) -> Option<(C, Instant)> {
        let now = Instant::now();
        let mut idle = self.inner.idle.lock().unwrap_or_else(|e| e.into_inner());
        while idle
            .front()
            .is_some_and(|(_, since, _)| now.duration_since(*since) > self.inner.idle_timeout)
        {
            idle.pop_front();
            self.inner.closed.fetch_add(1, Ordering::Relaxed);
        }
        while let Some((mut conn, _, born)) = idle.pop_back() {
            let too_old = self
                .inner
                .lifetime
                .is_some_and(|l| now.duration_since(born) >= l);
            if !too_old && conn.is_usable() {
                return Some((conn, born));
            }
            self.inner.closed.fetch_add(1, Ordering::Relaxed);
        }
        None
    }

    pub fn stats(&self) -> PoolStats {
        let idle = self
            .inner
            .idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        PoolStats {
            idle,
            in_use: self.inner.size as usize - self.inner.permits.available_permits(),
            opened: self.inner.opened.load(Ordering::Relaxed),
            closed: self.inner.closed.load(Ordering::Relaxed),
            waits: self.inner.waits.load(Ordering::Relaxed),
        }
    }

    /// Closes every idle connection (e.g. after the backend failed).
    pub fn clear_idle(&self) {
        let mut idle = self.inner.idle.lock().unwrap_or_else(|e| e.into_inner());
        let n = idle.len() as u64;
        idle.clear();
        self.inner.closed.fetch_add(n, Ordering::Relaxed);
    }
}

impl<C> Checkout<C> {
    /// Gives a clean connection back to the pool.
    pub fn release(mut self) {
        if let Some(conn) = self.conn.take() {
            let now = Instant::now();
            if self
                .pool
                .lifetime
                .is_some_and(|l| now.duration_since(self.born) >= l)
            {
                // Past `server_lifetime`: closed, a fresh one is opened
                // when needed.
                drop(conn);
                self.pool.closed.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let mut idle = self.pool.idle.lock().unwrap_or_else(|e| e.into_inner());
            idle.push_back((conn, now, self.born));
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

#[cfg(test)]
mod tests {
    use super::*;

    struct Conn {
        id: u32,
        usable: bool,
    }
    impl Poolable for Conn {
        fn is_usable(&mut self) -> bool {
            self.usable
        }
    }

    fn pool(size: u32, timeout_ms: u64) -> Pool<Conn> {
        Pool::new(
            size,
            Duration::from_millis(timeout_ms),
            Duration::from_secs(60),
        )
    }

    async fn open(id: u32) -> Result<Conn, String> {
        Ok(Conn { id, usable: true })
    }

    #[tokio::test]
    async fn released_connection_is_reused() {
        let p = pool(2, 100);
        let c = p.get(|| open(1)).await.unwrap();
        c.release();
        let c = p.get(|| open(2)).await.unwrap();
        assert_eq!(c.id, 1);
        assert_eq!(p.stats().opened, 1);
    }

    #[tokio::test]
    async fn connections_past_their_lifetime_are_closed_not_reused() {
        let p = pool(2, 100).with_lifetime(Some(Duration::from_millis(50)));
        let c = p.get(|| open(1)).await.unwrap();
        c.release();
        let c = p.get(|| open(2)).await.unwrap();
        assert_eq!(c.id, 1, "young enough: reused");
        tokio::time::sleep(Duration::from_millis(60)).await;
        c.release();
        assert_eq!(p.stats().closed, 1, "closed when it came back too old");
        let c = p.get(|| open(3)).await.unwrap();
        assert_eq!(c.id, 3);
        c.release();
        tokio::time::sleep(Duration::from_millis(60)).await;
        let c = p.get(|| open(4)).await.unwrap();
        assert_eq!(c.id, 4, "an idle one past its lifetime is not handed out");
        assert_eq!(p.stats().closed, 2);
        // No lifetime: kept.
        let q = pool(1, 100).with_lifetime(None);
        let c = q.get(|| open(5)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        c.release();
        assert_eq!(q.get(|| open(6)).await.unwrap().id, 5);
    }

    #[tokio::test]
    async fn dropped_connection_is_never_reused() {
        let p = pool(1, 100);
        let c = p.get(|| open(1)).await.unwrap();
        drop(c);
        let c = p.get(|| open(2)).await.unwrap();
        assert_eq!(c.id, 2);
        assert_eq!(p.stats().closed, 1);
    }

    #[tokio::test]
    async fn unusable_idle_connection_is_replaced() {
        let p = pool(1, 100);
        let mut c = p.get(|| open(1)).await.unwrap();
        c.usable = false;
        c.release();
        let c = p.get(|| open(2)).await.unwrap();
        assert_eq!(c.id, 2);
    }

    #[tokio::test]
    async fn waiter_times_out_with_clear_error() {
        let p = pool(1, 50);
        let _held = p.get(|| open(1)).await.unwrap();
        let err = p.get(|| open(2)).await.err().unwrap();
        assert!(matches!(err, PoolError::Timeout(_, 1)), "{err}");
        assert!(err.to_string().contains("waiting for a server connection"));
    }

    #[tokio::test]
    async fn waiter_gets_released_connection() {
        let p = pool(1, 2000);
        let held = p.get(|| open(1)).await.unwrap();
        let p2 = p.clone();
        let waiter = tokio::spawn(async move { p2.get(|| open(2)).await.map(|c| c.id) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        held.release();
        assert_eq!(waiter.await.unwrap().unwrap(), 1);
        assert_eq!(p.stats().opened, 1);
    }

    #[tokio::test]
    async fn connect_error_frees_the_permit() {
        let p = pool(1, 50);
        let r = p
            .get(|| async { Err::<Conn, _>("refused".to_string()) })
            .await;
        assert!(matches!(r, Err(PoolError::Connect(_))));
        assert!(p.get(|| open(3)).await.is_ok());
    }

    #[tokio::test]
    async fn backend_load_counts_checked_out_connections() {
        let load = Arc::new(AtomicUsize::new(0));
        let p: Pool<Conn> = Pool::with_load(
            3,
            Duration::from_millis(50),
            Duration::from_secs(60),
            load.clone(),
        );
        let a = p.get(|| open(1)).await.unwrap();
        let b = p.get(|| open(2)).await.unwrap();
        assert_eq!(load.load(Ordering::Relaxed), 2);
        a.release();
        b.discard();
        assert_eq!(load.load(Ordering::Relaxed), 0);
        let c = p.get(|| open(3)).await.unwrap();
        assert_eq!(load.load(Ordering::Relaxed), 1);
        drop(c);
        assert_eq!(load.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn never_more_than_size_connections() {
        let p = pool(3, 1000);
        let mut tasks = Vec::new();
        for i in 0..30 {
            let p = p.clone();
            tasks.push(tokio::spawn(async move {
                let c = p.get(|| open(i)).await.unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
                assert!(p.stats().in_use <= 3);
                c.release();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let s = p.stats();
        assert!(s.opened <= 3, "{s:?}");
        assert_eq!(s.idle as u64, s.opened);
    }
}
