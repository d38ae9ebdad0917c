//! Mirroring's diff, per statement digest and per target: units sent to
//! the mirror, dropped (queue full, target down), and answered
//! differently (error, rows, checksum), with each side's latency
//! (`SHOW MIRROR`), and the counters `fulcrum_mirror_*_total`. Knows no
//! wire protocol: a unit's outcome is compared by the mirroring front end.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use prometheus::IntCounter;

use crate::Metrics;

/// Latency samples kept per digest and side (the newest).
const SAMPLES: usize = 256;

/// What one mirror target's diff has counted.
pub struct MirrorStats {
    pub target: String,
    max_digests: usize,
    digests: Mutex<HashMap<u64, DigestDiff>>,
    sent: IntCounter,
    dropped: IntCounter,
    differing: IntCounter,
    no_login: IntCounter,
}

#[derive(Default)]
struct DigestDiff {
    query: String,
    sent: u64,
    dropped: u64,
    differing: u64,
    primary_us: VecDeque<u64>,
    mirror_us: VecDeque<u64>,
}

/// One row of SHOW MIRROR.
#[derive(Debug, Clone, PartialEq)]
pub struct MirrorRow {
    pub digest: u64,
    pub query: String,
    pub sent: u64,
    pub dropped: u64,
    pub differing: u64,
    /// Milliseconds: (p50, p99) of the primary side, then of the mirror.
    pub primary_ms: (f64, f64),
    pub mirror_ms: (f64, f64),
}

fn push(samples: &mut VecDeque<u64>, v: u64) {
    if samples.len() == SAMPLES {
        samples.pop_front();
    }
    samples.push_back(v);
}

/// The `q` quantile of `samples`, in milliseconds (0 when empty).
fn quantile_ms(samples: &VecDeque<u64>, q: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut v: Vec<u64> = samples.iter().copied().collect();
    v.sort_unstable();
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i] as f64 / 1000.0
}

impl MirrorStats {
    /// The diff of `target`, mirrored from `cluster`, keeping at most
    /// `max_digests` digests (more are counted in the totals only).
    pub fn new(metrics: &Metrics, cluster: &str, target: &str, max_digests: usize) -> MirrorStats {
        let labels = [cluster, target];
        MirrorStats {
            target: target.to_owned(),
            max_digests,
            digests: Mutex::new(HashMap::new()),
            sent: metrics.mirror_sent.with_label_values(&labels),
            dropped: metrics.mirror_dropped.with_label_values(&labels),
            differing: metrics.mirror_differing.with_label_values(&labels),
            no_login: metrics
                .mirror_skipped_clients
                .with_label_values(&[cluster, target, "no_login"]),
        }
    }

    fn entry<'a>(
        &self,
        map: &'a mut HashMap<u64, DigestDiff>,
        digest: u64,
        query: &dyn Fn() -> String,
    ) -> Option<&'a mut DigestDiff> {
        if !map.contains_key(&digest) && map.len() >= self.max_digests {
            return None;
        }
        Some(map.entry(digest).or_insert_with(|| DigestDiff {
            query: query(),
            ..Default::default()
        }))
    }

    /// A client drawn for this target was not mirrored: the target lists
    /// no login for its user.
    pub fn skipped_no_login(&self) {
        self.no_login.inc();
    }

    /// A unit the mirror answered: `differs` when its outcome was not the
    /// primary's. True when it is the digest's first difference (to log).
    pub fn answered(
        &self,
        digest: u64,
        query: &dyn Fn() -> String,
        primary_us: u64,
        mirror_us: u64,
        differs: bool,
    ) -> bool {
        self.sent.inc();
        if differs {
            self.differing.inc();
        }
        let mut map = self.digests.lock().unwrap_or_else(|e| e.into_inner());
        let Some(d) = self.entry(&mut map, digest, query) else {
            return false;
        };
        d.sent += 1;
        push(&mut d.primary_us, primary_us);
        push(&mut d.mirror_us, mirror_us);
        if differs {
            d.differing += 1;
        }
        differs && d.differing == 1
    }

    /// `n` units of a digest not mirrored (queue full, target down).
    pub fn dropped(&self, digest: u64, query: &dyn Fn() -> String, n: u64) {
        self.dropped.inc_by(n);
        let mut map = self.digests.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = self.entry(&mut map, digest, query) {
            d.dropped += n;
        }
    }

    /// The target's totals: (sent, dropped, differing), every digest's.
    pub fn totals(&self) -> (u64, u64, u64) {
        (self.sent.get(), self.dropped.get(), self.differing.get())
    }

    /// SHOW MIRROR's rows, most sent first.
    pub fn rows(&self) -> Vec<MirrorRow> {
        let map = self.digests.lock().unwrap_or_else(|e| e.into_inner());
        let mut rows: Vec<MirrorRow> = map
            .iter()
            .map(|(k, d)| MirrorRow {
                digest: *k,
                query: d.query.clone(),
                sent: d.sent,
                dropped: d.dropped,
                differing: d.differing,
                primary_ms: (
                    quantile_ms(&d.primary_us, 0.5),
                    quantile_ms(&d.primary_us, 0.99),
                ),
                mirror_ms: (
                    quantile_ms(&d.mirror_us, 0.5),
                    quantile_ms(&d.mirror_us, 0.99),
                ),
            })
            .collect();
        rows.sort_by(|a, b| b.sent.cmp(&a.sent).then(a.digest.cmp(&b.digest)));
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_diff_counts_per_digest_and_reports_the_first_difference_once() {
        let m = Metrics::new();
        let s = MirrorStats::new(&m, "c", "t", 2);
        let q = || "SELECT ?".to_owned();
        assert!(!s.answered(1, &q, 1000, 3000, false));
        assert!(s.answered(1, &q, 1000, 3000, true), "first difference");
        assert!(!s.answered(1, &q, 2000, 1000, true), "logged once");
        s.dropped(2, &q, 3);
        s.dropped(3, &q, 1); // past max_digests: totals only
        let rows = s.rows();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].digest, rows[0].sent, rows[0].differing), (1, 3, 2));
        assert_eq!(rows[0].primary_ms.0, 1.0);
        assert_eq!(rows[0].mirror_ms.1, 3.0);
        assert_eq!((rows[1].digest, rows[1].dropped), (2, 3));
        assert_eq!(s.sent.get(), 3);
        assert_eq!(s.dropped.get(), 4);
        assert_eq!(s.differing.get(), 2);
    }
}
