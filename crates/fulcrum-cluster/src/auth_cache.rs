//! The secrets `auth_query` fetched, per user, for either protocol: kept for
//! `auth_cache_ttl`, an unknown user's "nobody" for just as long (so a
//! known and an unknown name take the same path, cached or fetched, at the
//! same times: the time to the answer does not tell them apart), bounded
//! in size, and what each user's client last proved, which the pools log in
//! to the servers with. It also bounds what a flood of logins can make the
//! primary do: one fetch per name at a time (single-flight), at most
//! `auth_max_connections` fetches at once over as many pooled `auth_user`
//! connections, and at most `auth_failed_lookups_per_minute` fetches that
//! found nobody per client address. The fetch itself (the query, the
//! driver) is the protocol crate's.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fulcrum_config::{Cluster, Role};
use fulcrum_pool::{BackendId, Router};
use thiserror::Error;
use tokio::sync::Semaphore;

/// Why `auth_query` could not answer (both protocols).
#[derive(Debug, Error)]
pub enum AuthQueryError {
    #[error("no primary to run auth_query on")]
    NoPrimary,
    #[error("auth_user cannot log in: {0}")]
    Login(String),
    #[error("auth_query failed: {0}")]
    Query(String),
}

/// Where `auth_query` runs: the primary the health loop knows, else the
/// configured one (a probe whose own login fails must not stop every
/// `auth_query` login).
pub fn auth_query_backend(router: &Router, config: &Cluster) -> Result<BackendId, AuthQueryError> {
    router
        .primary()
        .or_else(|| config.backends.iter().position(|b| b.role == Role::Primary))
        .ok_or(AuthQueryError::NoPrimary)
}

/// Users cached at most; a full cache drops its expired entries, then all.
const MAX_ENTRIES: usize = 10_000;
/// An idle `auth_user` connection older than this is closed, not reused.
const IDLE_MAX: Duration = Duration::from_secs(60);
/// The window `auth_failed_lookups_per_minute` counts in.
const MISS_WINDOW: Duration = Duration::from_secs(60);
/// Client addresses whose misses are counted at most (a full table drops
/// its finished windows, then all).
const MAX_ADDRESSES: usize = 10_000;

/// What bounds the fetches (`auth_max_connections`,
/// `auth_failed_lookups_per_minute`).
#[derive(Clone, Copy, Debug)]
pub struct AuthLimits {
    pub max_connections: usize,
    pub failed_per_minute: u32,
}

impl AuthLimits {
    /// The limits a cluster's config sets (the defaults without `auth_user`).
    pub fn of(config: &Cluster) -> AuthLimits {
        match &config.auth_query {
            Some(aq) => AuthLimits {
                max_connections: aq.max_connections,
                failed_per_minute: aq.failed_lookups_per_minute,
            },
            None => AuthLimits {
                max_connections: 1,
                failed_per_minute: 0,
            },
        }
    }
}

struct Entry<S> {
    secret: Option<S>,
    fetched: Instant,
}

/// How a lookup was answered (the `fulcrum_auth_query_lookups_total`
/// outcome): from the cache, by a fetch that found the user or not, or
/// refused without a fetch because the client's address found nobody too
/// often (`limited`, answered as an unknown user).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Cached,
    Found,
    Missing,
    Limited,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Cached => "cached",
            Outcome::Found => "found",
            Outcome::Missing => "missing",
            Outcome::Limited => "limited",
        }
    }
}

/// A secret and where it came from (a failed login drops a cached one, so
/// a changed password is fetched at the next attempt).
pub struct Looked<S> {
    pub secret: Option<S>,
    pub cached: bool,
    pub outcome: Outcome,
}

impl<S> Looked<S> {
    /// No secret: `auth_query` is not configured.
    pub fn none() -> Looked<S> {
        Looked {
            secret: None,
            cached: false,
            outcome: Outcome::Missing,
        }
    }

    /// No lookup: the client's address found nobody too often.
    fn limited() -> Looked<S> {
        Looked {
            secret: None,
            cached: false,
            outcome: Outcome::Limited,
        }
    }
}

/// `S`: what the server stores for a user; `P`: what a client proved;
/// `C`: an `auth_user` connection to a server.
pub struct AuthCache<S, P, C> {
    limits: AuthLimits,
    entries: Mutex<HashMap<String, Entry<S>>>,
    proven: Mutex<HashMap<String, P>>,
    /// One lock per name being fetched: a second login of the same name
    /// waits for the first fetch and reads its result from the cache.
    fetching: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// `auth_max_connections` permits: fetches (and connections) at once.
    permits: Semaphore,
    /// Idle `auth_user` connections, by the server they are logged in to.
    idle: Mutex<Vec<(BackendId, Instant, C)>>,
    /// Per client address: the start of its window and the fetches in it
    /// that found nobody.
    misses: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl<S, P, C> AuthCache<S, P, C> {
    pub fn new(limits: AuthLimits) -> Self {
        AuthCache {
            permits: Semaphore::new(limits.max_connections.max(1)),
            limits,
            entries: Mutex::new(HashMap::new()),
            proven: Mutex::new(HashMap::new()),
            fetching: Mutex::new(HashMap::new()),
            idle: Mutex::new(Vec::new()),
            misses: Mutex::new(HashMap::new()),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Room for one more entry in `map`, kept under `max`: when full, the
/// entries that are no longer `fresh` go, and if that is not enough, all.
fn make_room<K, V>(map: &mut HashMap<K, V>, max: usize, fresh: impl FnMut(&K, &mut V) -> bool) {
    if map.len() >= max {
        map.retain(fresh);
        if map.len() >= max {
            map.clear();
        }
    }
}

impl<S: Clone, P: Clone, C> AuthCache<S, P, C> {
    fn cached(&self, user: &str, ttl: Duration) -> Option<Looked<S>> {
        let entries = lock(&self.entries);
        let e = entries.get(user)?;
        // The same for "nobody": a shorter life would let a client tell an
        // unknown name (fetched again, slower) from a known one (cached).
        (e.fetched.elapsed() < ttl).then(|| Looked {
            secret: e.secret.clone(),
            cached: true,
            outcome: Outcome::Cached,
        })
    }

    /// Whether `peer` has used up its fetches that found nobody.
    fn limited(&self, peer: Option<IpAddr>) -> bool {
        let (Some(peer), limit) = (peer, self.limits.failed_per_minute) else {
            return false;
        };
        if limit == 0 {
            return false;
        }
        let misses = lock(&self.misses);
        misses
            .get(&peer)
            .is_some_and(|(since, n)| since.elapsed() < MISS_WINDOW && *n >= limit)
    }

    fn count_miss(&self, peer: Option<IpAddr>) {
        let Some(peer) = peer else { return };
        let mut misses = lock(&self.misses);
        if !misses.contains_key(&peer) {
            make_room(&mut misses, MAX_ADDRESSES, |_, (since, _)| {
                since.elapsed() < MISS_WINDOW
            });
        }
        let now = Instant::now();
        let slot = misses.entry(peer).or_insert((now, 0));
        if now.duration_since(slot.0) >= MISS_WINDOW {
            *slot = (now, 0);
        }
        slot.1 += 1;
    }

    /// `user`'s secret from the cache if fresh, else from `fetch`, given
    /// an idle `auth_user` connection to `backend` if there is one and
    /// giving back the connection to keep. `peer` is the client's address.
    pub async fn lookup<E, F, Fut>(
        &self,
        user: &str,
        ttl: Duration,
        peer: Option<IpAddr>,
        backend: BackendId,
        fetch: F,
    ) -> Result<Looked<S>, E>
    where
        F: FnOnce(Option<C>) -> Fut,
        Fut: Future<Output = (Result<Option<S>, E>, Option<C>)>,
    {
        if let Some(hit) = self.cached(user, ttl) {
            return Ok(hit);
        }
        if self.limited(peer) {
            return Ok(Looked::limited());
        }
        let name_lock = lock(&self.fetching)
            .entry(user.to_owned())
            .or_default()
            .clone();
        let result = {
            let _name = name_lock.lock().await;
            match self.cached(user, ttl) {
                Some(hit) => Ok(hit),
                None => self.fetch_one(user, ttl, peer, backend, fetch).await,
            }
        };
        // The last one out removes the name's lock.
        let mut fetching = lock(&self.fetching);
        if Arc::strong_count(&name_lock) == 2 {
            fetching.remove(user);
        }
        result
    }

    async fn fetch_one<E, F, Fut>(
        &self,
        user: &str,
        ttl: Duration,
        peer: Option<IpAddr>,
        backend: BackendId,
        fetch: F,
    ) -> Result<Looked<S>, E>
    where
        F: FnOnce(Option<C>) -> Fut,
        Fut: Future<Output = (Result<Option<S>, E>, Option<C>)>,
    {
        let _permit = self.permits.acquire().await.expect("never closed");
        // Checked again: a flood waiting for a permit may have used it up.
        if self.limited(peer) {
            return Ok(Looked::limited());
        }
        let conn = self.take_idle(backend);
        let (secret, conn) = fetch(conn).await;
        if let Some(conn) = conn {
            lock(&self.idle).push((backend, Instant::now(), conn));
        }
        let secret = secret?;
        if secret.is_none() {
            self.count_miss(peer);
        }
        let mut entries = lock(&self.entries);
        make_room(&mut entries, MAX_ENTRIES, |_, e| e.fetched.elapsed() < ttl);
        entries.insert(
            user.to_owned(),
            Entry {
                secret: secret.clone(),
                fetched: Instant::now(),
            },
        );
        let outcome = match secret {
            Some(_) => Outcome::Found,
            None => Outcome::Missing,
        };
        Ok(Looked {
            secret,
            cached: false,
            outcome,
        })
    }

    /// An idle connection to `backend` young enough to reuse; the others
    /// (another server after a failover, or too old) are dropped (closed).
    fn take_idle(&self, backend: BackendId) -> Option<C> {
        let mut idle = lock(&self.idle);
        idle.retain(|(b, since, _)| *b == backend && since.elapsed() < IDLE_MAX);
        idle.pop().map(|(_, _, c)| c)
    }

    /// Idle `auth_user` connections kept now.
    pub fn idle_connections(&self) -> usize {
        lock(&self.idle).len()
    }

    /// Drops `user`'s cached secret.
    pub fn forget(&self, user: &str) {
        lock(&self.entries).remove(user);
    }

    /// Keeps what `user`'s client proved, for server logins.
    pub fn remember_proof(&self, user: &str, proof: P) {
        lock(&self.proven).insert(user.to_owned(), proof);
    }

    /// What `user`'s clients last proved.
    pub fn proof(&self, user: &str) -> Option<P> {
        lock(&self.proven).get(user).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn run<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(f)
    }

    type Cache = AuthCache<String, u8, u32>;
    type Fetched = (Result<Option<String>, &'static str>, Option<u32>);

    /// A fetch answering `secret`, handing back the connection it was
    /// given (or a new one, numbered from `opened`).
    fn answer<'a>(
        secret: Result<Option<&'a str>, &'static str>,
        opened: &'a AtomicUsize,
    ) -> impl FnOnce(Option<u32>) -> std::future::Ready<Fetched> + 'a {
        move |conn| {
            let conn = conn.unwrap_or_else(|| opened.fetch_add(1, Ordering::SeqCst) as u32);
            std::future::ready((secret.map(|s| s.map(str::to_owned)), Some(conn)))
        }
    }

    /// Makes `user`'s entry look fetched `by` earlier.
    fn age(cache: &Cache, user: &str, by: Duration) {
        let mut entries = lock(&cache.entries);
        let e = entries.get_mut(user).unwrap();
        e.fetched = e.fetched.checked_sub(by).unwrap();
    }

    #[test]
    fn a_known_and_an_unknown_name_are_cached_alike() {
        let cache = Cache::new(AuthLimits {
            max_connections: 1,
            failed_per_minute: 0,
        });
        let opened = AtomicUsize::new(0);
        let ttl = Duration::from_secs(60);
        for (user, secret) in [("known", Some("s")), ("unknown", None)] {
            let first = run(cache.lookup(user, ttl, None, 0, answer(Ok(secret), &opened))).unwrap();
            assert!(!first.cached, "{user}");
            // Well past the old 5 s life of a miss, within the TTL: both
            // cached (no fetch, the same time to the answer).
            age(&cache, user, Duration::from_secs(30));
            let again = run(cache.lookup(user, ttl, None, 0, answer(Err("fetched"), &opened)));
            let again = again.unwrap_or_else(|e| panic!("{user}: {e}"));
            assert!(again.cached, "{user}");
            assert_eq!(again.outcome, Outcome::Cached, "{user}");
            // Past the TTL: both fetched again.
            age(&cache, user, ttl);
            let later = run(cache.lookup(user, ttl, None, 0, answer(Ok(secret), &opened))).unwrap();
            assert!(!later.cached, "{user}");
        }
    }

    #[test]
    fn fresh_entries_are_served_from_the_cache_and_misses_too() {
        let cache = Cache::new(AuthLimits {
            max_connections: 2,
            failed_per_minute: 0,
        });
        let opened = AtomicUsize::new(0);
        let ttl = Duration::from_secs(60);
        let first = run(cache.lookup("a", ttl, None, 0, answer(Ok(Some("s1")), &opened))).unwrap();
        assert_eq!(first.outcome, Outcome::Found);
        let again = run(cache.lookup("a", ttl, None, 0, answer(Ok(Some("s2")), &opened))).unwrap();
        assert!(again.cached);
        assert_eq!(again.secret.as_deref(), Some("s1"));
        cache.forget("a");
        let refetched =
            run(cache.lookup("a", ttl, None, 0, answer(Ok(Some("s2")), &opened))).unwrap();
        assert_eq!(refetched.secret.as_deref(), Some("s2"));
        // A miss is cached like a secret, for the TTL: zero means no
        // caching at all.
        let zero = Duration::ZERO;
        run(cache.lookup("nobody", zero, None, 0, answer(Ok(None), &opened))).unwrap();
        let second = run(cache.lookup("nobody", zero, None, 0, answer(Ok(None), &opened))).unwrap();
        assert_eq!(second.outcome, Outcome::Missing);
        // Errors are not cached.
        assert!(run(cache.lookup("x", ttl, None, 0, answer(Err("down"), &opened))).is_err());
        let after = run(cache.lookup("x", ttl, None, 0, answer(Ok(Some("ok")), &opened))).unwrap();
        assert!(!after.cached);
        cache.remember_proof("a", 7);
        assert_eq!(cache.proof("a"), Some(7));
        assert_eq!(cache.proof("b"), None);
        // Every fetch reused the one connection the first opened.
        assert_eq!(opened.load(Ordering::SeqCst), 1);
        assert_eq!(cache.idle_connections(), 1);
        // After a failover (another backend) the old one is closed.
        run(cache.lookup("y", ttl, None, 1, answer(Ok(None), &opened))).unwrap();
        assert_eq!(opened.load(Ordering::SeqCst), 2);
        assert_eq!(cache.idle_connections(), 1);
    }

    #[test]
    fn an_address_that_keeps_finding_nobody_is_refused_without_a_fetch() {
        let cache = Cache::new(AuthLimits {
            max_connections: 1,
            failed_per_minute: 3,
        });
        let opened = AtomicUsize::new(0);
        let ttl = Duration::from_secs(60);
        let flood: IpAddr = "10.0.0.9".parse().unwrap();
        let other: IpAddr = "10.0.0.10".parse().unwrap();
        for n in 0..3 {
            let l = run(cache.lookup(
                &format!("u{n}"),
                ttl,
                Some(flood),
                0,
                answer(Ok(None), &opened),
            ));
            assert_eq!(l.unwrap().outcome, Outcome::Missing);
        }
        let fetched = AtomicUsize::new(0);
        let l = run(cache.lookup("u9", ttl, Some(flood), 0, |c: Option<u32>| {
            fetched.fetch_add(1, Ordering::SeqCst);
            std::future::ready((Ok::<_, ()>(Some("s".to_owned())), c))
        }))
        .unwrap();
        assert_eq!(l.outcome, Outcome::Limited);
        assert!(l.secret.is_none());
        assert_eq!(
            fetched.load(Ordering::SeqCst),
            0,
            "no fetch for a limited address"
        );
        // Another address, and cached names, are not limited.
        let l = run(cache.lookup("u9", ttl, Some(other), 0, answer(Ok(Some("s")), &opened)));
        assert_eq!(l.unwrap().outcome, Outcome::Found);
        let l = run(cache.lookup("u9", ttl, Some(flood), 0, answer(Ok(None), &opened)));
        assert_eq!(l.unwrap().outcome, Outcome::Cached);
    }

    #[test]
    fn concurrent_logins_share_one_fetch_per_name_and_the_cap_bounds_fetches() {
        let cache = Arc::new(Cache::new(AuthLimits {
            max_connections: 2,
            failed_per_minute: 0,
        }));
        let at_once = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let fetches = Arc::new(AtomicUsize::new(0));
        run(async {
            let mut tasks = Vec::new();
            for n in 0..40 {
                let (cache, at_once, most, fetches) = (
                    cache.clone(),
                    at_once.clone(),
                    most.clone(),
                    fetches.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    // Ten names, four logins each.
                    let user = format!("u{}", n % 10);
                    cache
                        .lookup(
                            &user,
                            Duration::from_secs(60),
                            None,
                            0,
                            |c: Option<u32>| async move {
                                fetches.fetch_add(1, Ordering::SeqCst);
                                let now = at_once.fetch_add(1, Ordering::SeqCst) + 1;
                                most.fetch_max(now, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(5)).await;
                                at_once.fetch_sub(1, Ordering::SeqCst);
                                (Ok::<_, ()>(Some("s".to_owned())), Some(c.unwrap_or(0)))
                            },
                        )
                        .await
                        .unwrap()
                }));
            }
            for t in tasks {
                assert_eq!(t.await.unwrap().secret.as_deref(), Some("s"));
            }
        });
        assert_eq!(fetches.load(Ordering::SeqCst), 10, "one fetch per name");
        assert_eq!(
            most.load(Ordering::SeqCst),
            2,
            "at most auth_max_connections at once"
        );
        assert!(cache.idle_connections() <= 2);
        assert!(lock(&cache.fetching).is_empty(), "no name lock left behind");
    }
}
