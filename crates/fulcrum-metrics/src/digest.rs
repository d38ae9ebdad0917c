//! Per-statement digest statistics, ProxySQL's `stats_mysql_query_digest`
//! for both protocols: a bounded table per cluster of fingerprint ->
//! normalised text, calls, errors, rows, total time, a latency histogram
//! (p50 / p99) and the primary / replica split.
//!
//! The table's lock is taken to find (or add) a statement's entry, but not
//! when the session's [`DigestMemo`] holds it already (the same statement
//! as the session's last, the usual case: an application runs the same
//! statements over and over): the entry is then known to be listed by an
//! atomic flag. The statement's outcome is recorded on the entry with
//! atomic adds, no lock. When the table is full, the least recently used tenth of it is
//! evicted in one pass, so a stream of new digests costs one sort per
//! `max / 10` of them, not a scan each.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Latency buckets: bucket `2k` holds [2^k, 2^k·√2) µs, `2k + 1` holds
/// [2^k·√2, 2^(k+1)) µs; the last one everything above ~50 minutes.
const BUCKETS: usize = 64;

/// One digest: the normalised statement and what its executions did.
#[derive(Debug)]
pub struct Digest {
    /// The fingerprint: the table's key, keyed per process (the
    /// classifier's, `fulcrum_sql::scan`).
    pub key: u64,
    /// What it is shown by: the same in every process and release
    /// (`fulcrum_sql::stable_id` of the text before any cut).
    pub id: u64,
    /// The normalised text (literals as `?`).
    pub text: Box<str>,
    calls: AtomicU64,
    errors: AtomicU64,
    rows: AtomicU64,
    total_us: AtomicU64,
    max_us: AtomicU64,
    on_primary: AtomicU64,
    /// Milliseconds after the table's epoch.
    first_seen_ms: u64,
    last_seen_ms: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
    /// In its table still (cleared when evicted or reset).
    listed: AtomicBool,
}

/// The entry of the last statement a session looked up, kept by the
/// session: the next execution of the same fingerprint finds it without the
/// table's lock, while the entry is listed.
#[derive(Debug, Default)]
pub struct DigestMemo(Option<Arc<Digest>>);

/// One execution under way: its digest, when it was sent and where.
#[derive(Debug, Clone)]
pub struct Stamp {
    pub digest: Arc<Digest>,
    pub at: Instant,
    pub primary: bool,
}

impl PartialEq for Stamp {
    fn eq(&self, other: &Stamp) -> bool {
        Arc::ptr_eq(&self.digest, &other.digest)
            && self.at == other.at
            && self.primary == other.primary
    }
}

impl Eq for Stamp {}

impl Stamp {
    /// An execution of `digest` starting `at`, on the primary or a replica.
    pub fn new(digest: Arc<Digest>, at: Instant, primary: bool) -> Stamp {
        Stamp {
            digest,
            at,
            primary,
        }
    }

    /// The execution ended at `now`: `rows` returned or affected, or an
    /// error.
    pub fn finish(&self, rows: u64, error: bool, now: Instant) {
        self.finish_after(now.saturating_duration_since(self.at), rows, error);
    }

    /// When the execution started.
    pub fn at(&self) -> Instant {
        self.at
    }

    /// `finish`, the execution having taken `took` (measured from
    /// [`at`](Self::at) by the caller, who may have it already).
    pub fn finish_after(&self, took: Duration, rows: u64, error: bool) {
        self.digest.record(took, rows, error, self.primary);
    }
}

impl Digest {
    fn new(key: u64, (id, text): (u64, String), now_ms: u64) -> Digest {
        Digest {
            key,
            id,
            text: text.into_boxed_str(),
            calls: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            rows: AtomicU64::new(0),
            total_us: AtomicU64::new(0),
            max_us: AtomicU64::new(0),
            on_primary: AtomicU64::new(0),
            first_seen_ms: now_ms,
            last_seen_ms: AtomicU64::new(now_ms),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            listed: AtomicBool::new(true),
        }
    }

    /// Records one execution.
    pub fn record(&self, took: Duration, rows: u64, error: bool, primary: bool) {
        let us = took.as_micros().min(u64::MAX as u128) as u64;
        self.calls.fetch_add(1, Ordering::Relaxed);
        if error {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        if rows > 0 {
            self.rows.fetch_add(rows, Ordering::Relaxed);
        }
        if primary {
            self.on_primary.fetch_add(1, Ordering::Relaxed);
        }
        self.total_us.fetch_add(us, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
        self.buckets[bucket(us)].fetch_add(1, Ordering::Relaxed);
    }
}

/// The bucket of a latency in µs.
fn bucket(us: u64) -> usize {
    let x = us.max(1);
    let k = 63 - x.leading_zeros() as usize;
    // In the upper half of [2^k, 2^(k+1)) when x² ≥ 2·4^k.
    let upper = (x as u128) * (x as u128) >= 2u128 << (2 * k);
    (2 * k + usize::from(upper)).min(BUCKETS - 1)
}

/// The upper edge of bucket `i` in µs (what a quantile in it reports).
fn bucket_edge(i: usize) -> u64 {
    let k = (i / 2) as u32;
    if i.is_multiple_of(2) {
        // 2^k · √2, rounded up.
        ((1u64 << k) as f64 * std::f64::consts::SQRT_2).ceil() as u64
    } else {
        1u64 << (k + 1).min(63)
    }
}

/// A digest's figures at one moment (SHOW QUERIES, Prometheus).
#[derive(Debug, Clone, PartialEq)]
pub struct DigestRow {
    pub key: u64,
    /// The id it is shown by (`Digest::id`).
    pub id: u64,
    pub text: String,
    pub calls: u64,
    pub errors: u64,
    pub rows: u64,
    pub total_us: u64,
    pub max_us: u64,
    /// Quantiles from the histogram: the upper edge of the bucket they fall
    /// in (at most √2 above the true value).
    pub p50_us: u64,
    pub p99_us: u64,
    pub on_primary: u64,
    pub on_replica: u64,
    /// Seconds since the digest was first and last seen.
    pub first_seen_s: u64,
    pub last_seen_s: u64,
}

impl DigestRow {
    pub fn avg_us(&self) -> u64 {
        self.total_us.checked_div(self.calls).unwrap_or(0)
    }
}

/// Digests by fingerprint. Looked up on every statement: foldhash
/// (randomly seeded per process) instead of SipHash.
type DigestMap = HashMap<u64, Arc<Digest>, foldhash::fast::RandomState>;

/// The digests of one cluster, at most `max` of them.
#[derive(Debug)]
pub struct DigestTable {
    max: usize,
    epoch: Instant,
    map: Mutex<DigestMap>,
    evicted: AtomicU64,
}

impl DigestTable {
    /// `max` = 0 turns digest statistics off.
    pub fn new(max: usize) -> DigestTable {
        DigestTable {
            max,
            epoch: Instant::now(),
            map: Mutex::new(DigestMap::default()),
            evicted: AtomicU64::new(0),
        }
    }

    pub fn max_entries(&self) -> usize {
        self.max
    }

    pub fn enabled(&self) -> bool {
        self.max > 0
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn ms_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// The entry of fingerprint `key`, added (with `text()`) when new; `None`
    /// when digests are off.
    pub fn get(&self, key: u64, text: impl FnOnce() -> (u64, String)) -> Option<Arc<Digest>> {
        self.get_at(key, Instant::now(), text)
    }

    /// `get`, seen at `at` (one clock read serves the entry and its stamp).
    fn get_at(
        &self,
        key: u64,
        at: Instant,
        text: impl FnOnce() -> (u64, String),
    ) -> Option<Arc<Digest>> {
        if self.max == 0 {
            return None;
        }
        let now = self.ms_at(at);
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = map.get(&key) {
            d.last_seen_ms.store(now, Ordering::Relaxed);
            return Some(d.clone());
        }
        if map.len() >= self.max {
            self.evict(&mut map);
        }
        let d = Arc::new(Digest::new(key, text(), now));
        map.insert(key, d.clone());
        Some(d)
    }

    /// The entry of fingerprint `key`, seen at `at`: the one `memo` holds
    /// when it is `key`'s and still listed (no lock), else looked up (or
    /// added, with `text()`) and kept in `memo`. `None` when digests are off.
    pub fn remembered(
        &self,
        memo: &mut DigestMemo,
        key: u64,
        at: Instant,
        text: impl FnOnce() -> (u64, String),
    ) -> Option<Arc<Digest>> {
        if self.max == 0 {
            return None;
        }
        if let Some(d) = &memo.0 {
            if d.key == key && d.listed.load(Ordering::Relaxed) {
                d.last_seen_ms.store(self.ms_at(at), Ordering::Relaxed);
                return Some(d.clone());
            }
        }
        let d = self.get_at(key, at, text)?;
        memo.0 = Some(d.clone());
        Some(d)
    }

    /// A stamp for one execution of `key` starting `at` (one clock read
    /// serves the entry and its stamp).
    pub fn stamp(
        &self,
        key: u64,
        text: impl FnOnce() -> (u64, String),
        primary: bool,
        at: Instant,
    ) -> Option<Stamp> {
        self.get_at(key, at, text).map(|digest| Stamp {
            digest,
            at,
            primary,
        })
    }

    /// Drops the least recently used tenth (at least one).
    fn evict(&self, map: &mut DigestMap) {
        let mut ages: Vec<(u64, u64)> = map
            .values()
            .map(|d| (d.last_seen_ms.load(Ordering::Relaxed), d.key))
            .collect();
        let n = (self.max / 10).max(1).min(ages.len());
        ages.select_nth_unstable(n - 1);
        for (_, key) in &ages[..n] {
            if let Some(d) = map.remove(key) {
                d.listed.store(false, Ordering::Relaxed);
            }
        }
        self.evicted.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Forgets every digest (`SHOW QUERIES RESET`); executions under way
    /// record on entries no longer listed.
    pub fn reset(&self) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        for d in map.values() {
            d.listed.store(false, Ordering::Relaxed);
        }
        map.clear();
    }

    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the entries take, roughly: each entry and its text.
    pub fn approx_bytes(&self) -> usize {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.values()
            .map(|d| std::mem::size_of::<Digest>() + d.text.len() + 32)
            .sum()
    }

    /// Digests evicted to make room since start.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Every digest with at least one finished execution, by total time,
    /// largest first.
    pub fn rows(&self) -> Vec<DigestRow> {
        let list: Vec<Arc<Digest>> = self
            .map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        let now = self.now_ms();
        let mut rows: Vec<DigestRow> = list
            .iter()
            .map(|d| row(d, now))
            .filter(|r| r.calls > 0)
            .collect();
        rows.sort_by(|a, b| b.total_us.cmp(&a.total_us).then(a.key.cmp(&b.key)));
        rows
    }

    /// The `n` digests with the most total time.
    pub fn top(&self, n: usize) -> Vec<DigestRow> {
        let mut rows = self.rows();
        rows.truncate(n);
        rows
    }
}

fn row(d: &Digest, now_ms: u64) -> DigestRow {
    let counts: Vec<u64> = d
        .buckets
        .iter()
        .map(|b| b.load(Ordering::Relaxed))
        .collect();
    let calls = d.calls.load(Ordering::Relaxed);
    let on_primary = d.on_primary.load(Ordering::Relaxed);
    DigestRow {
        key: d.key,
        id: d.id,
        text: d.text.to_string(),
        calls,
        errors: d.errors.load(Ordering::Relaxed),
        rows: d.rows.load(Ordering::Relaxed),
        total_us: d.total_us.load(Ordering::Relaxed),
        max_us: d.max_us.load(Ordering::Relaxed),
        p50_us: quantile(&counts, 0.50),
        p99_us: quantile(&counts, 0.99),
        on_primary,
        on_replica: calls.saturating_sub(on_primary),
        first_seen_s: now_ms.saturating_sub(d.first_seen_ms) / 1000,
        last_seen_s: now_ms.saturating_sub(d.last_seen_ms.load(Ordering::Relaxed)) / 1000,
    }
}

/// The upper edge of the bucket holding quantile `q` (0 with no samples).
fn quantile(counts: &[u64], q: f64) -> u64 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0;
    }
    let rank = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return bucket_edge(i);
        }
    }
    bucket_edge(counts.len() - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn buckets_are_half_powers_of_two() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 0);
        assert_eq!(bucket(2), 2);
        assert_eq!(bucket(3), 3, "3 ≥ 2·√2");
        assert_eq!(bucket(1000), 19, "1000 is in [512·√2, 1024)");
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        for v in [1u64, 7, 100, 1000, 12345, 10_000_000] {
            let edge = bucket_edge(bucket(v));
            assert!(
                edge >= v && (edge as f64) <= (v as f64) * 1.5 + 1.0,
                "{v} -> {edge}"
            );
        }
    }

    #[test]
    fn a_memo_finds_its_entry_until_it_leaves_the_table() {
        let t = DigestTable::new(10);
        let mut memo = DigestMemo::default();
        let at = Instant::now();
        let a = t.remembered(&mut memo, 1, at, || (0, "a".into())).unwrap();
        let again = t.remembered(&mut memo, 1, at, || unreachable!()).unwrap();
        assert!(Arc::ptr_eq(&a, &again), "the memo's entry, no lookup");
        let b = t.remembered(&mut memo, 2, at, || (0, "b".into())).unwrap();
        assert_eq!(b.key, 2, "another fingerprint is looked up");
        // Reset: the memo's entry is no longer listed; a new one is made
        // and listed, so executions are seen again.
        t.reset();
        let b2 = t.remembered(&mut memo, 2, at, || (0, "b".into())).unwrap();
        assert!(!Arc::ptr_eq(&b, &b2));
        assert_eq!(t.len(), 1);
        // Eviction unlists too: fill the table past its size.
        for k in 10..21 {
            t.get(k, || (0, "x".into()));
        }
        let b3 = t.remembered(&mut memo, 2, at, || (0, "b".into())).unwrap();
        assert!(!Arc::ptr_eq(&b2, &b3), "evicted, made again");
        assert_eq!(
            t.remembered(&mut DigestMemo::default(), 2, at, || (0, "b".into()))
                .map(|d| d.key),
            Some(2)
        );
        assert!(
            DigestTable::new(0)
                .remembered(&mut memo, 2, at, || (0, "b".into()))
                .is_none(),
            "digests off"
        );
    }

    #[test]
    fn executions_add_up_and_quantiles_come_from_the_histogram() {
        let t = DigestTable::new(10);
        let d = t.get(1, || (0, "select ?".into())).unwrap();
        for _ in 0..98 {
            d.record(us(100), 1, false, false);
        }
        d.record(us(10_000), 0, true, true);
        d.record(us(10_000), 0, true, true);
        let rows = t.rows();
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!((r.calls, r.errors, r.rows), (100, 2, 98));
        assert_eq!((r.on_primary, r.on_replica), (2, 98));
        assert_eq!(r.total_us, 98 * 100 + 20_000);
        assert_eq!(r.avg_us(), 298);
        assert_eq!(r.max_us, 10_000);
        assert!((100..=142).contains(&r.p50_us), "{}", r.p50_us);
        assert!((10_000..=14_143).contains(&r.p99_us), "{}", r.p99_us);
        assert_eq!(r.text, "select ?");
    }

    #[test]
    fn the_same_key_is_one_entry_and_text_is_made_once() {
        let t = DigestTable::new(10);
        let a = t.get(7, || (0, "a".into())).unwrap();
        let b = t.get(7, || panic!("text made again")).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_full_table_evicts_the_least_recently_used() {
        let t = DigestTable::new(20);
        for k in 0..20u64 {
            t.get(k, || (0, format!("q{k}"))).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
        // 0 and 1 used again: the oldest are now 2 and 3.
        t.get(0, || (0, String::new()));
        t.get(1, || (0, String::new()));
        t.get(100, || (0, "new".into())).unwrap();
        assert_eq!(t.len(), 19, "a tenth (2) evicted, one added");
        assert_eq!(t.evicted(), 2);
        let map = t.map.lock().unwrap();
        assert!(map.contains_key(&0) && map.contains_key(&1) && map.contains_key(&100));
        assert!(!map.contains_key(&2) && !map.contains_key(&3));
    }

    #[test]
    fn off_means_no_entries_and_reset_forgets() {
        let off = DigestTable::new(0);
        assert!(off.get(1, || (0, "x".into())).is_none());
        assert!(!off.enabled());
        let t = DigestTable::new(5);
        let s = t
            .stamp(3, || (0, "x".into()), true, Instant::now())
            .unwrap();
        s.finish(4, false, Instant::now());
        assert_eq!(t.rows()[0].rows, 4);
        t.reset();
        assert!(t.rows().is_empty());
        s.finish(1, false, Instant::now());
        assert!(
            t.rows().is_empty(),
            "a finished stamp of a reset entry is not listed"
        );
    }

    #[test]
    fn unfinished_digests_are_not_listed_and_order_is_by_total_time() {
        let t = DigestTable::new(5);
        t.get(1, || (0, "never ran".into()));
        t.get(2, || (0, "fast".into()))
            .unwrap()
            .record(us(10), 0, false, false);
        t.get(3, || (0, "slow".into()))
            .unwrap()
            .record(us(900), 0, false, false);
        let texts: Vec<String> = t.rows().into_iter().map(|r| r.text).collect();
        assert_eq!(texts, ["slow", "fast"]);
        assert_eq!(t.top(1).len(), 1);
    }
}
