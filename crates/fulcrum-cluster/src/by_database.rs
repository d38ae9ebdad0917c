//! `by_database`: what the function and relation catalogs share, a
//! per-database answer read from the server in the background. It owns the
//! answers with when each was read (kept for a TTL, a stale one still used
//! while it is read again), the lookups asked for and not answered, the
//! failures and their back-off ([`RETRY_AFTER`]), the queue the protocol
//! context drains, the wait of a login for its database, and the
//! generation that lets DDL seen through Fulcrum discard a lookup it
//! overtook. What an answer means is the catalog's: `function_catalog`
//! (`ByDatabase<Functions>`) and `relation_catalog`
//! (`ByDatabase<Relations>`) add their questions on top.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// A lookup to run: a database's answer, and the login that reads it (the
/// user of the read that asked, with its protocol options: MySQL's
/// wire-format flags and character set; unused on PostgreSQL). An empty
/// user is the health user's login.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Wanted {
    pub user: Arc<str>,
    pub options: (u32, u8),
    pub database: Arc<str>,
}

/// How long after a failed lookup a database is asked again.
pub const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Most databases kept; the table is emptied when it fills.
const MAX_DATABASES: usize = 1_000;

/// A database's answer and when it was read.
type ReadAt<T> = (Arc<T>, Instant);

/// Per-database answers of one kind, and their lookups.
#[derive(Debug)]
pub struct ByDatabase<T> {
    /// What the answers are, for the log ("function catalog").
    what: &'static str,
    ttl: Duration,
    known: RwLock<HashMap<Arc<str>, ReadAt<T>>>,
    /// Databases asked for and not answered yet.
    pending: Mutex<HashSet<Arc<str>>>,
    /// Databases whose lookup failed, and when: not asked again before
    /// [`RETRY_AFTER`] (a login refused must not cost a query per read).
    failed: Mutex<HashMap<Arc<str>, Instant>>,
    queue: Mutex<Vec<Wanted>>,
    /// Bumped by [`Self::forget`]: a lookup begun before is discarded.
    generation: AtomicU64,
    wake: Notify,
    /// Woken when a lookup ends (learned, failed or discarded).
    settled: Notify,
}

/// A lock, taken even if a thread panicked holding it (the data are a
/// cache: the worst a torn update leaves is a lookup too many).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<T> ByDatabase<T> {
    /// Answers named `what` in the log, each kept for `ttl`.
    pub fn named(what: &'static str, ttl: Duration) -> ByDatabase<T> {
        ByDatabase {
            what,
            ttl,
            known: RwLock::default(),
            pending: Mutex::default(),
            failed: Mutex::default(),
            queue: Mutex::default(),
            generation: AtomicU64::new(0),
            wake: Notify::new(),
            settled: Notify::new(),
        }
    }

    /// Whether `database`'s answer is known (fresh or stale).
    pub fn knows(&self, database: &str) -> bool {
        self.known
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(database)
    }

    /// Asks for `database`'s answer (read with `user`'s login, or the
    /// health user's when `user` is empty), unless it is asked for already
    /// or its last lookup failed less than [`RETRY_AFTER`] ago.
    pub fn want(&self, user: &Arc<str>, options: (u32, u8), database: &str) {
        let backing_off = lock(&self.failed)
            .get(database)
            .is_some_and(|at| at.elapsed() < RETRY_AFTER);
        if backing_off {
            return;
        }
        let mut pending = lock(&self.pending);
        if !pending.contains(database) {
            let database: Arc<str> = database.into();
            pending.insert(database.clone());
            lock(&self.queue).push(Wanted {
                user: user.clone(),
                options,
                database,
            });
            self.wake.notify_one();
        }
    }

    /// Waits until `database`'s answer is known, its lookup ended, or
    /// `deadline` passed.
    async fn wait_known(&self, database: &str, deadline: tokio::time::Instant) {
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            let waiting = lock(&self.pending).contains(database);
            if self.knows(database) || !waiting {
                return;
            }
            if tokio::time::timeout_at(deadline, settled).await.is_err() {
                return;
            }
        }
    }

    /// A login of `user` (with its protocol `options`) to `database`: its
    /// answer asked for and waited for until `deadline`, unless known.
    /// Asked twice at most: a lookup already pending as the health user (at
    /// start) that could not log in is followed by one with this login's.
    pub async fn known_by(
        &self,
        user: &Arc<str>,
        options: (u32, u8),
        database: &str,
        deadline: tokio::time::Instant,
    ) {
        for _ in 0..2 {
            if self.knows(database) {
                return;
            }
            self.want(user, options, database);
            let past = tokio::time::Instant::now() >= deadline;
            self.wait_known(database, deadline).await;
            if past {
                return;
            }
        }
    }

    /// `test` of `database`'s answer, `None` while it is not known; asks
    /// for it when unknown or stale (a stale answer is still used).
    pub fn answer<R>(
        &self,
        user: &Arc<str>,
        options: (u32, u8),
        database: &str,
        test: impl FnOnce(&T) -> R,
    ) -> Option<R> {
        let (answer, ask) = {
            let known = self.known.read().unwrap_or_else(|e| e.into_inner());
            match known.get(database) {
                Some((answer, at)) => (Some(test(answer)), at.elapsed() >= self.ttl),
                None => (None, true),
            }
        };
        if ask {
            self.want(user, options, database);
        }
        answer
    }

    /// The lookups to run now (empty when none; wait with [`Self::requested`]).
    pub fn wanted(&self) -> Vec<Wanted> {
        std::mem::take(&mut *lock(&self.queue))
    }

    /// Resolves when lookups are queued.
    pub async fn requested(&self) {
        self.wake.notified().await
    }

    /// The count of [`Self::forget`]s so far: a lookup notes it before it
    /// reads and hands it to [`Self::settle`].
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Records the outcome of lookup `w`, begun at `generation` (`None`:
    /// it failed). A lookup that DDL may have overtaken is not kept (the
    /// next read asks again); a failure as the health user (at start,
    /// after a failover) holds nothing back (the next login asks with its
    /// own).
    pub fn settle(&self, cluster: &str, w: Wanted, found: Option<T>, generation: u64) {
        let what = self.what;
        match found {
            Some(_) if generation != self.generation() => {
                tracing::debug!(%cluster, database = %w.database, "{what}: read before DDL, not kept");
                self.unpend(&w.database);
            }
            Some(answer) => {
                tracing::debug!(%cluster, database = %w.database, "{what} read");
                self.learned(w.database, answer);
            }
            None if w.user.is_empty() => {
                tracing::debug!(%cluster, database = %w.database, "{what}: not read as the health user");
                self.unpend(&w.database);
            }
            None => self.failed(&w.database),
        }
    }

    /// `database` is no longer asked for; its waiters are woken.
    fn unpend(&self, database: &str) {
        lock(&self.pending).remove(database);
        self.settled.notify_waiters();
    }

    /// The server's answer for `database`.
    pub fn learned(&self, database: Arc<str>, answer: T) {
        lock(&self.failed).remove(&database);
        {
            let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
            if known.len() >= MAX_DATABASES {
                known.clear();
            }
            known.insert(database.clone(), (Arc::new(answer), Instant::now()));
        }
        self.unpend(&database);
    }

    /// A lookup failed: asked again by a read that needs it after
    /// [`RETRY_AFTER`] (the catalog's conservative answer meanwhile).
    pub fn failed(&self, database: &Arc<str>) {
        {
            let mut failed = lock(&self.failed);
            if failed.len() >= MAX_DATABASES {
                failed.clear();
            }
            failed.insert(database.clone(), Instant::now());
        }
        self.unpend(database);
    }

    /// The databases whose answers are known now.
    pub fn databases(&self) -> Vec<Arc<str>> {
        self.known
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// DDL went through Fulcrum: every database is read again, and lookups
    /// under way are not kept.
    pub fn forget(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.known
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Databases whose answers are known.
    pub fn len(&self) -> usize {
        self.known.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tests: `database`'s last failure moved back by [`RETRY_AFTER`].
    #[cfg(test)]
    pub(crate) fn failure_expired(&self, database: &Arc<str>) {
        lock(&self.failed).insert(database.clone(), Instant::now() - RETRY_AFTER);
    }
}

/// Runs `look_up` for each lookup `catalog` wants, and settles it, until
/// `stop` turns true (the context's health loop stopped: shutdown, or a
/// reload's next context took over). One at a time: lookups are rare
/// (once per database per TTL). `databases` are asked for at once, and
/// again (with every database known by then) whenever `primary` names
/// another server.
pub fn start_lookups<T, F, Fut, P>(
    catalog: Arc<ByDatabase<T>>,
    cluster: String,
    mut stop: tokio::sync::watch::Receiver<bool>,
    databases: Vec<Arc<str>>,
    primary: P,
    look_up: F,
) -> tokio::task::JoinHandle<()>
where
    T: Send + Sync + 'static,
    F: Fn(Wanted) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Option<T>> + Send,
    P: Fn() -> Option<usize> + Send + 'static,
{
    let by_health_user: Arc<str> = "".into();
    for database in &databases {
        catalog.want(&by_health_user, (0, 0), database);
    }
    tokio::spawn(async move {
        let mut last_primary = primary();
        loop {
            let now = primary();
            if now != last_primary && now.is_some() {
                // A failover: read everything again on the new primary.
                last_primary = now;
                let mut all = catalog.databases();
                all.extend(databases.iter().cloned());
                for database in all {
                    catalog.want(&by_health_user, (0, 0), &database);
                }
            }
            for w in catalog.wanted() {
                let generation = catalog.generation();
                let found = look_up(w.clone()).await;
                catalog.settle(&cluster, w, found, generation);
            }
            tokio::select! {
                _ = catalog.requested() => {}
                _ = stop.changed() => {}
                // Also picks up lookups queued while the last ones ran.
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            if *stop.borrow() {
                return;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Arc<str> {
        s.into()
    }

    /// What the lookup loop does with the next lookup: answers it.
    async fn next_lookup(c: &ByDatabase<u32>) -> Wanted {
        loop {
            if let Some(w) = c.wanted().pop() {
                return w;
            }
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_login_asks_again_after_the_health_users_lookup_failed() {
        let c = Arc::new(ByDatabase::<u32>::named("test", Duration::from_secs(60)));
        // At start: asked as the health user, still pending at the login.
        c.want(&n(""), (0, 0), "app");
        let login = {
            let c = c.clone();
            tokio::spawn(async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                c.known_by(&n("alice"), (0, 0), "app", deadline).await;
                c.knows("app")
            })
        };
        let first = next_lookup(&c).await;
        assert_eq!(first.user, n(""));
        c.settle("main", first, None, c.generation()); // the health user may not log in
        let second = next_lookup(&c).await;
        assert_eq!(second.user, n("alice"), "asked again with the login's user");
        c.settle("main", second, Some(7), c.generation());
        assert!(login.await.unwrap(), "the login waited for the answer");
        assert_eq!(c.answer(&n("alice"), (0, 0), "app", |v| *v), Some(7));
    }
}
