//! The result cache of one cluster (issue 46; docs/routing.md, "Cache").
//!
//! An entry is an answer exactly as the server sent it, kept under a key
//! the protocol front end builds from everything that shapes that answer
//! (the statement, its parameters, the database, the user, the settings
//! that change results, the result format). This crate owns the entries,
//! their byte budget and LRU order, their TTL, the per-table write
//! versions that decide whether a fill may be stored, one fill per key at
//! a time, the per-digest statistics and the counters. It knows nothing of
//! sockets or wire formats.
//!
//! Right by construction:
//! - every write bumps the version of each table it may change, when it is
//!   forwarded and again when its answer comes back (before the client
//!   sees it), and drops those tables' entries;
//! - a fill records the write sequence when it starts, and is stored only
//!   if no table it read (nor its database, nor the whole cache) was bumped
//!   since: a result that was on its way while one of its tables changed
//!   is never kept;
//! - with `invalidation = "stream"`, nothing is served or stored while the
//!   change stream is down, and everything is dropped when it goes down.

mod stats;
mod store;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::watch;

pub use stats::{CacheMetrics, DigestRow};
use store::Store;

/// Where an invalidation came from (the `source` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A write that passed through Fulcrum.
    Proxy,
    /// The primary's change stream.
    Stream,
    /// The entry's TTL ran out.
    Ttl,
    /// Evicted to stay within `max_memory`.
    Memory,
    /// `FLUSH CACHE` on the console.
    Flush,
}

impl Source {
    pub const ALL: [Source; 5] = [
        Source::Proxy,
        Source::Stream,
        Source::Ttl,
        Source::Memory,
        Source::Flush,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Source::Proxy => "proxy",
            Source::Stream => "stream",
            Source::Ttl => "ttl",
            Source::Memory => "memory",
            Source::Flush => "flush",
        }
    }
}

/// A table, as invalidation knows it: its database and its own name
/// (unqualified, lower case). PostgreSQL's schemas are not told apart (a
/// write to `a.t` drops the entries of `b.t` too): never stale, at the
/// cost of a few extra misses.
pub type Table = (Arc<str>, Arc<str>);

/// The table `named` (as a statement names it: `t`, `schema.t`, or on
/// MySQL `database.t`) as invalidation knows it. `qualifier_is_database`:
/// MySQL, where `x.t` is table `t` of database `x`.
pub fn table(database: &str, named: &str, qualifier_is_database: bool) -> Table {
    let (qualifier, name) = match named.rsplit_once('.') {
        Some((q, n)) => (Some(q), n),
        None => (None, named),
    };
    let database = match qualifier {
        Some(q) if qualifier_is_database => q.rsplit('.').next().unwrap_or(q),
        _ => database,
    };
    (Arc::from(database), Arc::from(name.to_ascii_lowercase()))
}

/// The cache's limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_memory: u64,
    pub max_result: u64,
    /// Whether entries may be served only while the change stream is up.
    pub needs_stream: bool,
}

/// What a lookup found.
pub enum Lookup {
    /// The answer, as the server sent it.
    Hit(Bytes),
    /// Not there: the caller's read fills it, with this ticket.
    Fill(Fill),
    /// Another client is filling it: wait for that, then look again.
    Wait(Waiter),
    /// The cache does not answer now (the change stream is down): the read
    /// goes to the server and is not kept.
    Off,
}

/// The right to store one answer, if nothing it read changed meanwhile.
/// Dropped without [`Fill::store`], it wakes the waiters and stores nothing.
pub struct Fill {
    cache: Cache,
    key: Arc<[u8]>,
    digest: u64,
    database: Arc<str>,
    tables: Arc<[Table]>,
    /// The write sequence when the fill started.
    started: u64,
    ttl: Duration,
    /// Dropped with the fill: the waiters' channel closes.
    _done: watch::Sender<()>,
}

/// A wait for another client's fill of the same key.
pub struct Waiter(watch::Receiver<()>);

impl Waiter {
    /// Returns when the fill has ended (stored or not).
    pub async fn wait(mut self) {
        // The sender never sends: `changed` returns when it is dropped.
        let _ = self.0.changed().await;
    }
}

/// The lookup's key, its statement's digest and the tables it reads.
pub struct Query<'a> {
    pub key: &'a [u8],
    /// The session's database: whose change stream must be up.
    pub database: &'a str,
    /// The statement's digest (the per-digest statistics).
    pub digest: u64,
    /// The digest's normalised text, shown by `SHOW CACHE`.
    pub text: &'a str,
    pub tables: &'a [Table],
    /// How long an entry filled now may be served.
    pub ttl: Duration,
    /// Fill only a key seen before (`mode = "auto"`): a key's first miss
    /// is remembered, its second fills.
    pub second_miss: bool,
}

/// A cluster's result cache: cheap to clone, one store behind a lock.
#[derive(Clone)]
pub struct Cache {
    inner: Arc<Inner>,
}

struct Inner {
    store: Mutex<Store>,
    metrics: CacheMetrics,
}

impl Cache {
    pub fn new(limits: Limits, metrics: CacheMetrics) -> Cache {
        Cache {
            inner: Arc::new(Inner {
                store: Mutex::new(Store::new(limits)),
                metrics,
            }),
        }
    }

    fn store(&self) -> MutexGuard<'_, Store> {
        // A panic while holding the lock leaves a consistent store (every
        // change is made before any counter moves): go on with it.
        self.inner.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Looks `q` up: a hit, a fill to make, a fill to wait for (only when
    /// `may_wait`), or off.
    pub fn lookup(&self, q: &Query<'_>, may_wait: bool) -> Lookup {
        let now = Instant::now();
        let mut store = self.store();
        if !store.serving(q.database) {
            return Lookup::Off;
        }
        if let Some(answer) = store.hit(q.key, now, &self.inner.metrics) {
            self.inner.metrics.hits.inc();
            return Lookup::Hit(answer);
        }
        self.inner.metrics.misses.inc();
        store.missed(q.digest, q.text);
        if q.second_miss && store.first_miss(q.key) {
            return Lookup::Off;
        }
        if let Some(rx) = store.filling(q.key) {
            return if may_wait {
                Lookup::Wait(Waiter(rx))
            } else {
                Lookup::Off
            };
        }
        let key: Arc<[u8]> = Arc::from(q.key);
        let (tx, rx) = watch::channel(());
        store.start_fill(key.clone(), rx);
        Lookup::Fill(Fill {
            cache: self.clone(),
            key,
            digest: q.digest,
            database: Arc::from(q.database),
            tables: Arc::from(q.tables),
            started: store.sequence(),
            ttl: q.ttl,
            _done: tx,
        })
    }

    /// A write may change `tables`: their versions move and their entries
    /// go. Called when the write is forwarded and again when its answer
    /// (or its transaction's COMMIT's) comes back.
    pub fn invalidate<'a, I: IntoIterator<Item = &'a Table>>(&self, tables: I, source: Source) {
        let mut store = self.store();
        for t in tables {
            store.bump_table(t, source, &self.inner.metrics);
        }
    }

    /// A write may change anything in `database` (DDL, a call that may
    /// write, a statement the parser cannot place).
    pub fn invalidate_database(&self, database: &str, source: Source) {
        self.store()
            .bump_database(database, source, &self.inner.metrics);
    }

    /// Anything anywhere may have changed (a statement the change stream
    /// reports as text): every entry goes, and every fill under way.
    pub fn invalidate_all(&self, source: Source) {
        self.store().bump_all(source, &self.inner.metrics);
    }

    /// `FLUSH CACHE [table]`: drops every entry, or those of tables named
    /// `table` (unqualified, any database). Returns how many went.
    pub fn flush(&self, table: Option<&str>) -> usize {
        let mut store = self.store();
        match table {
            None => store.bump_all(Source::Flush, &self.inner.metrics),
            Some(name) => store.bump_named(name, &self.inner.metrics),
        }
    }

    /// `database`'s change stream is up (`true`) or down. Under
    /// `invalidation = "stream"` nothing of a database is served or stored
    /// unless its stream is up (a stream reports one database's changes:
    /// PostgreSQL's logical decoding is per database), and going down drops
    /// the database's entries and the fills under way (what the stream
    /// would have reported meanwhile is unknown).
    pub fn set_stream_up(&self, database: &str, up: bool) {
        let mut store = self.store();
        if store.set_stream(database, up) && !up {
            store.bump_database(database, Source::Stream, &self.inner.metrics);
        }
    }

    /// Databases looked up since the last call whose stream nobody has
    /// started: the stream's owner starts one for each.
    pub fn wanted_streams(&self) -> Vec<Arc<str>> {
        self.store().take_wanted()
    }

    /// No change stream can be had (PostgreSQL without `wal_level =
    /// logical`): the cache serves on Fulcrum's own writes alone, as with
    /// `invalidation = "proxy"` (the caller warns).
    pub fn without_stream(&self) {
        self.store().drop_streams();
    }

    /// Whether the cache depends on change streams (`invalidation =
    /// "stream"`, and streams can be had).
    pub fn uses_streams(&self) -> bool {
        self.store().uses_streams()
    }

    /// Each database's stream state (`SHOW CACHE`), by name.
    pub fn streams(&self) -> Vec<(Arc<str>, bool)> {
        self.store().stream_states()
    }

    /// Whether the cache answers for `database` now.
    pub fn serving(&self, database: &str) -> bool {
        self.store().serving(database)
    }

    /// Bytes the entries hold (keys, answers and their bookkeeping).
    pub fn bytes(&self) -> u64 {
        self.store().bytes()
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.store().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `SHOW CACHE`: per digest, busiest first.
    pub fn digests(&self) -> Vec<DigestRow> {
        self.store().digest_rows()
    }

    /// Fills dropped because a table they read changed while under way.
    pub fn races(&self) -> u64 {
        self.store().races()
    }
}

impl Fill {
    /// Stores `answer` unless something it read changed since the fill
    /// started, or it is over `max_result`. Returns whether it was kept.
    pub fn store(self, answer: Bytes) -> bool {
        let cache = self.cache.clone();
        let mut store = cache.store();
        let kept = store.finish_fill(&self, answer, Instant::now(), &cache.inner.metrics);
        // The lock goes before `self` drops (its `Drop` takes it again).
        drop(store);
        kept
    }

    /// The longest answer this fill may keep: the caller stops collecting
    /// past it.
    pub fn max_result(&self) -> u64 {
        self.cache.store().max_result()
    }
}

impl Drop for Fill {
    fn drop(&mut self) {
        // Whether stored or not, the key is no longer being filled; the
        // channel closes when `_done` drops after this.
        self.cache.store().end_fill(&self.key);
    }
}
