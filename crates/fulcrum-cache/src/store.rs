//! The entries behind the cache's lock: the map by key, the LRU order, the
//! byte count, the index by table, the write versions and the fills under
//! way. Every method keeps them consistent with each other.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::watch;

use crate::stats::{CacheMetrics, DigestRow, DigestStats};
use crate::{Fill, Limits, Source, Table};

/// What one entry costs beyond its key and answer: the map's and the LRU
/// index's slots, the table list, the bookkeeping (an estimate on the
/// high side, so `max_memory` holds).
const ENTRY_OVERHEAD: u64 = 192;
/// Per table an entry reads (its slot in the entry and in the index).
const TABLE_OVERHEAD: u64 = 64;
/// Keys whose first miss `mode = "auto"` remembers (by hash, 8 bytes each),
/// forgotten all at once when full.
const SEEN_ONCE_MAX: usize = 65_536;

struct Entry {
    answer: Bytes,
    tables: Arc<[Table]>,
    digest: u64,
    expires: Instant,
    /// Its place in `lru`.
    tick: u64,
    bytes: u64,
}

pub(crate) struct Store {
    limits: Limits,
    entries: HashMap<Arc<[u8]>, Entry>,
    /// Least recently used first.
    lru: BTreeMap<u64, Arc<[u8]>>,
    tick: u64,
    bytes: u64,
    by_table: HashMap<Table, HashSet<Arc<[u8]>>>,
    /// The write sequence: moves at every invalidation.
    sequence: u64,
    /// The sequence at each table's, database's and the whole cache's last
    /// invalidation.
    table_versions: HashMap<Table, u64>,
    database_versions: HashMap<Arc<str>, u64>,
    all_version: u64,
    /// Keys being filled, with the channel their waiters watch.
    filling: HashMap<Arc<[u8]>, watch::Receiver<()>>,
    /// Per database, whether its change stream is up; `None`: no stream is
    /// needed (`invalidation = "proxy"`, or none can be had).
    streams: Option<HashMap<Arc<str>, bool>>,
    /// Databases looked up whose stream nobody has started yet.
    wanted: Vec<Arc<str>>,
    stats: DigestStats,
    races: u64,
    /// Hashes of keys that missed once (`second_miss`).
    seen_once: HashSet<u64>,
    seen_hasher: std::collections::hash_map::RandomState,
}

impl Store {
    pub(crate) fn new(limits: Limits) -> Store {
        Store {
            limits,
            entries: HashMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
            bytes: 0,
            by_table: HashMap::new(),
            sequence: 0,
            table_versions: HashMap::new(),
            database_versions: HashMap::new(),
            all_version: 0,
            filling: HashMap::new(),
            streams: limits.needs_stream.then(HashMap::new),
            wanted: Vec::new(),
            stats: DigestStats::default(),
            races: 0,
            seen_once: HashSet::new(),
            seen_hasher: Default::default(),
        }
    }

    /// Whether entries of `database` may be served and filled: its change
    /// stream is up, or none is needed. A database seen for the first
    /// time is queued for its stream (`wanted`).
    pub(crate) fn serving(&mut self, database: &str) -> bool {
        let Some(streams) = &mut self.streams else {
            return true;
        };
        match streams.get(database) {
            Some(up) => *up,
            None => {
                let database: Arc<str> = Arc::from(database);
                streams.insert(database.clone(), false);
                self.wanted.push(database);
                false
            }
        }
    }

    /// Returns whether the state changed.
    pub(crate) fn set_stream(&mut self, database: &str, up: bool) -> bool {
        let Some(streams) = &mut self.streams else {
            return false;
        };
        let was = streams.insert(Arc::from(database), up);
        was != Some(up)
    }

    pub(crate) fn drop_streams(&mut self) {
        self.streams = None;
        self.wanted.clear();
    }

    pub(crate) fn uses_streams(&self) -> bool {
        self.streams.is_some()
    }

    pub(crate) fn take_wanted(&mut self) -> Vec<Arc<str>> {
        std::mem::take(&mut self.wanted)
    }

    pub(crate) fn stream_states(&self) -> Vec<(Arc<str>, bool)> {
        let mut v: Vec<_> = self
            .streams
            .iter()
            .flatten()
            .map(|(d, up)| (d.clone(), *up))
            .collect();
        v.sort();
        v
    }

    pub(crate) fn sequence(&self) -> u64 {
        self.sequence
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn races(&self) -> u64 {
        self.races
    }

    pub(crate) fn max_result(&self) -> u64 {
        self.limits.max_result
    }

    /// The answer under `key` if it is there and fresh (moved to the most
    /// recently used end); an expired one goes.
    pub(crate) fn hit(&mut self, key: &[u8], now: Instant, m: &CacheMetrics) -> Option<Bytes> {
        let (expired, digest) = {
            let e = self.entries.get(key)?;
            (e.expires <= now, e.digest)
        };
        if expired {
            let key: Arc<[u8]> = Arc::from(key);
            self.remove(&key, Source::Ttl, m);
            return None;
        }
        self.tick += 1;
        let tick = self.tick;
        let e = self.entries.get_mut(key).expect("looked up above");
        let k = self.lru.remove(&e.tick).expect("every entry is in the LRU");
        e.tick = tick;
        self.lru.insert(tick, k);
        let answer = e.answer.clone();
        self.stats.hit(digest);
        Some(answer)
    }

    /// Whether this is `key`'s first miss (remembered for its second).
    pub(crate) fn first_miss(&mut self, key: &[u8]) -> bool {
        use std::hash::{BuildHasher, Hasher};
        let mut h = self.seen_hasher.build_hasher();
        h.write(key);
        let hash = h.finish();
        if self.seen_once.remove(&hash) {
            return false;
        }
        if self.seen_once.len() >= SEEN_ONCE_MAX {
            self.seen_once.clear();
        }
        self.seen_once.insert(hash);
        true
    }

    pub(crate) fn missed(&mut self, digest: u64, text: &str) {
        self.stats.missed(digest, text);
    }

    /// The channel of the fill of `key` under way, if one is.
    pub(crate) fn filling(&self, key: &[u8]) -> Option<watch::Receiver<()>> {
        self.filling.get(key).cloned()
    }

    pub(crate) fn start_fill(&mut self, key: Arc<[u8]>, rx: watch::Receiver<()>) {
        self.filling.insert(key, rx);
    }

    pub(crate) fn end_fill(&mut self, key: &[u8]) {
        self.filling.remove(key);
    }

    /// Stores a fill's answer unless a table it read (its database, the
    /// whole cache) was invalidated since it started, or it is too large.
    pub(crate) fn finish_fill(
        &mut self,
        fill: &Fill,
        answer: Bytes,
        now: Instant,
        m: &CacheMetrics,
    ) -> bool {
        let database = fill.database.clone();
        if answer.len() as u64 > self.limits.max_result || !self.serving(&database) {
            return false;
        }
        let overtaken = self.all_version > fill.started
            || fill.tables.iter().any(|t| {
                self.table_versions
                    .get(t)
                    .is_some_and(|v| *v > fill.started)
                    || self
                        .database_versions
                        .get(&t.0)
                        .is_some_and(|v| *v > fill.started)
            });
        if overtaken {
            self.races += 1;
            return false;
        }
        let bytes = ENTRY_OVERHEAD
            + fill.key.len() as u64
            + answer.len() as u64
            + TABLE_OVERHEAD * fill.tables.len() as u64;
        if bytes > self.limits.max_memory {
            return false;
        }
        // A fill of a key already stored (a waiter's second miss raced
        // another fill): the new answer replaces the old.
        if self.entries.contains_key(&fill.key) {
            let key = fill.key.clone();
            self.unlink(&key);
        }
        while self.bytes + bytes > self.limits.max_memory {
            let Some((_, oldest)) = self.lru.first_key_value() else {
                break;
            };
            let oldest = oldest.clone();
            self.remove(&oldest, Source::Memory, m);
        }
        self.tick += 1;
        for t in fill.tables.iter() {
            self.by_table
                .entry(t.clone())
                .or_default()
                .insert(fill.key.clone());
        }
        self.lru.insert(self.tick, fill.key.clone());
        self.entries.insert(
            fill.key.clone(),
            Entry {
                answer,
                tables: fill.tables.clone(),
                digest: fill.digest,
                expires: now + fill.ttl.max(Duration::from_millis(1)),
                tick: self.tick,
                bytes,
            },
        );
        self.bytes += bytes;
        self.stats.stored(fill.digest, bytes);
        m.bytes.set(self.bytes as i64);
        true
    }

    /// A write to `table`: its version moves and its entries go.
    pub(crate) fn bump_table(&mut self, table: &Table, source: Source, m: &CacheMetrics) {
        self.sequence += 1;
        self.table_versions.insert(table.clone(), self.sequence);
        if let Some(keys) = self.by_table.remove(table) {
            for key in keys {
                self.remove(&key, source, m);
            }
        }
        // Bounded: versions older than every fill under way (and with no
        // fill, all of them) decide nothing any more.
        if self.filling.is_empty() && self.table_versions.len() > 4096 {
            self.table_versions.clear();
            self.database_versions.clear();
        }
    }

    pub(crate) fn bump_database(&mut self, database: &str, source: Source, m: &CacheMetrics) {
        self.sequence += 1;
        self.database_versions
            .insert(Arc::from(database), self.sequence);
        let keys: Vec<Arc<[u8]>> = self
            .entries
            .iter()
            .filter(|(_, e)| e.tables.iter().any(|t| &*t.0 == database))
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            self.remove(&key, source, m);
        }
    }

    /// Every entry goes, and every fill under way is dropped when it ends.
    pub(crate) fn bump_all(&mut self, source: Source, m: &CacheMetrics) -> usize {
        self.sequence += 1;
        self.all_version = self.sequence;
        let keys: Vec<Arc<[u8]>> = self.entries.keys().cloned().collect();
        let n = keys.len();
        for key in keys {
            self.remove(&key, source, m);
        }
        n
    }

    /// `FLUSH CACHE table`: tables of that name in every database.
    pub(crate) fn bump_named(&mut self, name: &str, m: &CacheMetrics) -> usize {
        let name = name.rsplit('.').next().unwrap_or(name).to_ascii_lowercase();
        let tables: Vec<Table> = self
            .by_table
            .keys()
            .filter(|t| *t.1 == *name)
            .cloned()
            .collect();
        let before = self.entries.len();
        for t in &tables {
            self.bump_table(t, Source::Flush, m);
        }
        before - self.entries.len()
    }

    pub(crate) fn digest_rows(&self) -> Vec<DigestRow> {
        self.stats.rows()
    }

    /// Drops `key`'s entry, counted as an invalidation from `source`.
    fn remove(&mut self, key: &Arc<[u8]>, source: Source, m: &CacheMetrics) {
        if let Some(digest) = self.unlink(key) {
            self.stats.invalidated(digest, source);
            m.invalidations[source as usize].inc();
            m.bytes.set(self.bytes as i64);
        }
    }

    /// Takes `key`'s entry out of every index; returns its digest.
    fn unlink(&mut self, key: &Arc<[u8]>) -> Option<u64> {
        let e = self.entries.remove(key)?;
        self.lru.remove(&e.tick);
        self.bytes -= e.bytes;
        for t in e.tables.iter() {
            if let Some(keys) = self.by_table.get_mut(t) {
                keys.remove(key);
                if keys.is_empty() {
                    self.by_table.remove(t);
                }
            }
        }
        self.stats.dropped(e.digest, e.bytes);
        Some(e.digest)
    }
}
