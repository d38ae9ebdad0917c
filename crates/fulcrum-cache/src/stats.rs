//! What `SHOW CACHE` and the metrics tell: per digest, the entries, bytes,
//! hits, misses and invalidations by source (bounded to `MAX_DIGESTS`,
//! the rest counted under one row), and the cluster's Prometheus counters.

use std::collections::HashMap;
use std::sync::Arc;

use prometheus::{IntCounter, IntGauge};

use crate::Source;

/// Digests counted one by one; later ones share the row of digest 0.
const MAX_DIGESTS: usize = 1000;

/// The counters the cache moves: `fulcrum_cache_hits_total`,
/// `fulcrum_cache_misses_total`, `fulcrum_cache_invalidations_total` by
/// source (indexed like [`Source::ALL`]) and `fulcrum_cache_bytes`.
/// `Default` gives unregistered ones (tests, a cluster without metrics).
#[derive(Clone)]
pub struct CacheMetrics {
    pub hits: IntCounter,
    pub misses: IntCounter,
    pub invalidations: [IntCounter; 5],
    pub bytes: IntGauge,
}

impl Default for CacheMetrics {
    fn default() -> CacheMetrics {
        let c = |n: &str| IntCounter::new(n, n).expect("a valid name");
        CacheMetrics {
            hits: c("hits"),
            misses: c("misses"),
            invalidations: Source::ALL.map(|s| c(s.label())),
            bytes: IntGauge::new("bytes", "bytes").expect("a valid name"),
        }
    }
}

/// One digest's line of `SHOW CACHE`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DigestRow {
    pub digest: u64,
    /// The normalised statement ("(other digests)" for the shared row).
    pub text: Arc<str>,
    pub entries: u64,
    pub bytes: u64,
    pub hits: u64,
    pub misses: u64,
    /// By source, indexed like [`Source::ALL`].
    pub invalidations: [u64; 5],
}

#[derive(Default)]
pub(crate) struct DigestStats {
    rows: HashMap<u64, DigestRow>,
}

impl DigestStats {
    fn row(&mut self, digest: u64, text: Option<&str>) -> &mut DigestRow {
        let digest = if self.rows.contains_key(&digest) || self.rows.len() < MAX_DIGESTS {
            digest
        } else {
            0
        };
        self.rows.entry(digest).or_insert_with(|| DigestRow {
            digest,
            text: Arc::from(match (digest, text) {
                (0, _) | (_, None) => "(other digests)",
                (_, Some(t)) => t,
            }),
            ..DigestRow::default()
        })
    }

    pub(crate) fn missed(&mut self, digest: u64, text: &str) {
        self.row(digest, Some(text)).misses += 1;
    }

    pub(crate) fn hit(&mut self, digest: u64) {
        self.row(digest, None).hits += 1;
    }

    pub(crate) fn stored(&mut self, digest: u64, bytes: u64) {
        let r = self.row(digest, None);
        r.entries += 1;
        r.bytes += bytes;
    }

    pub(crate) fn dropped(&mut self, digest: u64, bytes: u64) {
        let r = self.row(digest, None);
        r.entries = r.entries.saturating_sub(1);
        r.bytes = r.bytes.saturating_sub(bytes);
    }

    pub(crate) fn invalidated(&mut self, digest: u64, source: Source) {
        self.row(digest, None).invalidations[source as usize] += 1;
    }

    /// Busiest first (hits plus misses), then by digest.
    pub(crate) fn rows(&self) -> Vec<DigestRow> {
        let mut rows: Vec<DigestRow> = self.rows.values().cloned().collect();
        rows.sort_by_key(|r| (std::cmp::Reverse(r.hits + r.misses), r.digest));
        rows
    }
}
