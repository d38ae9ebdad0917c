//! The bounded decision cache: fingerprint -> classification (decision and
//! session effects), least recently used evicted first. One short lock per
//! lookup; a hit hands out the shared classification (a reference count),
//! not a copy.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use lru::LruCache;

use crate::classifier::Classified;

pub(crate) struct DecisionCache {
    inner: Option<Mutex<LruCache<u64, Arc<Classified>>>>,
}

impl DecisionCache {
    /// `size` 0 turns caching off.
    pub fn new(size: usize) -> DecisionCache {
        DecisionCache {
            inner: NonZeroUsize::new(size).map(|n| Mutex::new(LruCache::new(n))),
        }
    }

    pub fn get(&self, key: u64) -> Option<Arc<Classified>> {
        let m = self.inner.as_ref()?;
        m.lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned()
    }

    pub fn put(&self, key: u64, d: Arc<Classified>) {
        if let Some(m) = &self.inner {
            m.lock().unwrap_or_else(|e| e.into_inner()).put(key, d);
        }
    }

    pub fn len(&self) -> usize {
        self.inner
            .as_ref()
            .map_or(0, |m| m.lock().unwrap_or_else(|e| e.into_inner()).len())
    }
}
