//! The console's SCRAM verifiers, derived once: a PBKDF2 derivation
//! (4096 rounds of HMAC-SHA-256) per login would let anyone who can reach
//! the console port burn a core with startup packets. A known user's
//! verifier is kept by (user, password, salt, iterations) — the password as
//! a SHA-256 digest, so the cache holds no cleartext and a reload that
//! changes a password derives anew; an unknown user gets
//! [`Verifier::unmatchable`], which costs no derivation either, so neither
//! the CPU spent nor the time to the answer depends on whether the name
//! exists (but for the first login of a known user after a start or a
//! password change). Bounded: past [`MAX_ENTRIES`] the cache starts over.

use std::collections::HashMap;
use std::sync::Mutex;

use fulcrum_postgres::auth::scram::Verifier;
use sha2::{Digest, Sha256};

/// Verifiers kept at most (the console's users are a handful).
pub const MAX_ENTRIES: usize = 256;

/// Derived verifiers by a digest of what they derive from.
#[derive(Default)]
pub struct Verifiers {
    kept: Mutex<HashMap<[u8; 32], Verifier>>,
}

impl Verifiers {
    /// The verifier for `password` with `salt` and `iterations`: the kept
    /// one, else `derive()`'s, kept.
    pub fn get(
        &self,
        user: &str,
        password: &str,
        salt: &[u8],
        iterations: u32,
        derive: impl FnOnce() -> Verifier,
    ) -> Verifier {
        let key: [u8; 32] = Sha256::new()
            .chain_update((user.len() as u64).to_be_bytes())
            .chain_update(user.as_bytes())
            .chain_update((password.len() as u64).to_be_bytes())
            .chain_update(password.as_bytes())
            .chain_update(salt)
            .chain_update(iterations.to_be_bytes())
            .finalize()
            .into();
        if let Some(v) = self.lock().get(&key) {
            return v.clone();
        }
        // Derived outside the lock: one slow login does not hold up others.
        let verifier = derive();
        let mut kept = self.lock();
        if kept.len() >= MAX_ENTRIES {
            kept.clear();
        }
        kept.insert(key, verifier.clone());
        verifier
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Verifier>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many are kept.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verifier_is_derived_once_per_user_password_and_salt() {
        let cache = Verifiers::default();
        let derived = std::cell::Cell::new(0);
        let get = |user: &str, password: &str, salt: &[u8]| {
            cache.get(user, password, salt, 4096, || {
                derived.set(derived.get() + 1);
                Verifier::new(password, salt, 4096)
            })
        };
        let first = get("ops", "secret", b"salt");
        assert_eq!(get("ops", "secret", b"salt"), first);
        assert_eq!(derived.get(), 1, "the second login derives nothing");
        let changed = get("ops", "other", b"salt");
        assert_ne!(changed, first, "a changed password derives anew");
        get("ops", "secret", b"salt2");
        // (user, password) split differently is another key.
        get("opss", "ecret", b"salt");
        assert_eq!(derived.get(), 4);
        assert_eq!(cache.len(), 4);
    }

    #[test]
    fn the_cache_is_bounded() {
        let cache = Verifiers::default();
        for i in 0..MAX_ENTRIES * 2 + 3 {
            cache.get(&format!("u{i}"), "p", b"s", 1, || {
                Verifier::new("p", b"s", 1)
            });
            assert!(cache.len() <= MAX_ENTRIES);
        }
    }
}
