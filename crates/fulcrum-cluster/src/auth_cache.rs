//! The secrets `auth_query` fetched, per user, for either protocol: kept for
//! `auth_cache_ttl` (an unknown user for [`NEGATIVE_TTL`] at most, so a flood
//! of made-up names does not reach the server), bounded in size, and what
//! each user's client last proved, which the pools log in to the servers
//! with. The fetch itself (the query, the driver) is the protocol crate's.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fulcrum_config::{Cluster, Role};
use fulcrum_pool::{BackendId, Router};
use thiserror::Error;

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

/// How long "no such user" is remembered (or the TTL, if shorter).
pub const NEGATIVE_TTL: Duration = Duration::from_secs(5);
/// Users cached at most; a full cache drops its expired entries, then all.
const MAX_ENTRIES: usize = 10_000;

struct Entry<S> {
    secret: Option<S>,
    fetched: Instant,
}

/// A secret and whether it came from the cache (a failed login then drops
/// it, so a changed password is fetched at the next attempt).
pub struct Looked<S> {
    pub secret: Option<S>,
    pub cached: bool,
}

/// `S`: what the server stores for a user; `P`: what a client proved.
pub struct AuthCache<S, P> {
    entries: Mutex<HashMap<String, Entry<S>>>,
    proven: Mutex<HashMap<String, P>>,
}

impl<S, P> Default for AuthCache<S, P> {
    fn default() -> Self {
        AuthCache {
            entries: Mutex::new(HashMap::new()),
            proven: Mutex::new(HashMap::new()),
        }
    }
}

impl<S: Clone, P: Clone> AuthCache<S, P> {
    /// `user`'s secret from the cache if fresh, else from `fetch`.
    pub async fn lookup<E>(
        &self,
        user: &str,
        ttl: Duration,
        fetch: impl Future<Output = Result<Option<S>, E>>,
    ) -> Result<Looked<S>, E> {
        {
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = entries.get(user) {
                let keep = match e.secret {
                    Some(_) => ttl,
                    None => NEGATIVE_TTL.min(ttl),
                };
                if e.fetched.elapsed() < keep {
                    return Ok(Looked {
                        secret: e.secret.clone(),
                        cached: true,
                    });
                }
            }
        }
        let secret = fetch.await?;
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= MAX_ENTRIES {
            entries.retain(|_, e| e.fetched.elapsed() < ttl);
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(
            user.to_owned(),
            Entry {
                secret: secret.clone(),
                fetched: Instant::now(),
            },
        );
        Ok(Looked {
            secret,
            cached: false,
        })
    }

    /// Drops `user`'s cached secret.
    pub fn forget(&self, user: &str) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(user);
    }

    /// Keeps what `user`'s client proved, for server logins.
    pub fn remember_proof(&self, user: &str, proof: P) {
        self.proven
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(user.to_owned(), proof);
    }

    /// What `user`'s clients last proved.
    pub fn proof(&self, user: &str) -> Option<P> {
        self.proven
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(user)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn fresh_entries_are_served_from_the_cache_and_misses_expire_sooner() {
        let cache: AuthCache<String, u8> = AuthCache::default();
        let ttl = Duration::from_secs(60);
        let first =
            run(cache.lookup("a", ttl, async { Ok::<_, ()>(Some("s1".to_string())) })).unwrap();
        assert!(!first.cached);
        let again =
            run(cache.lookup("a", ttl, async { Ok::<_, ()>(Some("s2".to_string())) })).unwrap();
        assert!(again.cached);
        assert_eq!(again.secret.as_deref(), Some("s1"));
        cache.forget("a");
        let refetched =
            run(cache.lookup("a", ttl, async { Ok::<_, ()>(Some("s2".to_string())) })).unwrap();
        assert_eq!(refetched.secret.as_deref(), Some("s2"));
        // A miss is cached, but for NEGATIVE_TTL at most: a TTL shorter
        // than that wins, and zero means no caching at all.
        let zero = Duration::ZERO;
        run(cache.lookup("nobody", zero, async { Ok::<_, ()>(None) })).unwrap();
        let second = run(cache.lookup("nobody", zero, async { Ok::<_, ()>(None) })).unwrap();
        assert!(!second.cached);
        // Errors are not cached.
        assert!(run(cache.lookup("x", ttl, async { Err::<Option<String>, _>("down") })).is_err());
        let after = run(cache.lookup("x", ttl, async { Ok::<_, ()>(Some("ok".into())) })).unwrap();
        assert!(!after.cached);
        cache.remember_proof("a", 7);
        assert_eq!(cache.proof("a"), Some(7));
        assert_eq!(cache.proof("b"), None);
    }
}
