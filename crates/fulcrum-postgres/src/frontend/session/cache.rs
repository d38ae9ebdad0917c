//! The result cache on a PostgreSQL session (`[cluster.cache]`;
//! docs/routing.md, "Cache"): a Query from an idle client answered from
//! the cluster's cache, the answer of one that missed kept as it passes
//! (`Capture`), and what the client's writes invalidate, when they are
//! forwarded and again when their answer (or their transaction's end)
//! comes back. The store and its rules are `fulcrum_cache`'s; this module
//! owns only what is PostgreSQL's: the key's bytes, which frames an answer
//! may hold, and when a unit starts and ends.

use bytes::Bytes;
use fulcrum_cache::{Lookup, Query, Source, Table};
use fulcrum_config::CacheIsolation;
use fulcrum_sql::Writes;

use super::*;

/// How long a read waits for another client's fill of the same key before
/// it goes to the server itself.
const FILL_WAIT: Duration = Duration::from_secs(5);

/// What the cache did with the Query at the front of the client buffer.
pub(super) enum CacheStep {
    /// Not the cache's: routed as usual.
    Pass,
    /// Answered from the cache (the frame is consumed).
    Answered,
    /// A miss whose answer is to be kept: routed to the primary, captured.
    Filling,
}

/// The answer of a read that missed, collected as it is forwarded.
pub(super) struct Capture {
    fill: fulcrum_cache::Fill,
    answer: BytesMut,
    max: usize,
    /// Something in the answer may not be kept (an error, a notice, a
    /// notification, a row streamed through, over `max_result`).
    spoiled: bool,
}

/// What the client's writes may have changed, invalidated again when
/// their answer, or their transaction's end, comes back.
pub(super) enum Written {
    Tables(Vec<Table>),
    Database,
}

impl Capture {
    /// Whole frames forwarded to the client (a run of rows, or one frame).
    pub(super) fn take(&mut self, frames: &[u8]) {
        if self.spoiled {
            return;
        }
        if self.answer.len() + frames.len() > self.max {
            self.spoil();
            return;
        }
        self.answer.extend_from_slice(frames);
    }

    /// One frame of type `tag` forwarded; true at its ReadyForQuery.
    pub(super) fn frame(&mut self, tag: u8, frame: &[u8]) -> bool {
        // RowDescription, rows, CommandComplete, ReadyForQuery; and of an
        // extended unit ParseComplete, BindComplete, ParameterDescription,
        // NoData. Anything else (an error, a notice, a notification, a
        // parameter report) is not part of a result worth keeping.
        if !matches!(tag, b'T' | b'D' | b'C' | b'Z' | b'1' | b'2' | b't' | b'n') {
            self.spoil();
        }
        self.take(frame);
        tag == b'Z'
    }

    /// Nothing of this answer is kept.
    pub(super) fn spoil(&mut self) {
        self.spoiled = true;
        self.answer = BytesMut::new();
    }

    /// Stores the answer if it is whole and ended outside a transaction.
    fn finish(self, status: u8) -> bool {
        !self.spoiled && status == b'I' && self.fill.store(self.answer.freeze())
    }
}

impl Session {
    /// Whether the unit at the front may be answered from (or fill) the
    /// cache: an idle client with nothing in flight, no transaction, no
    /// pin, no mirror, and no `SET fulcrum.cache = off`.
    fn cache_may_answer(&self) -> bool {
        self.ctx.cache.is_some()
            && self.server.is_none()
            && self.engine.status() == Status::Idle
            && self.engine.deferred().is_none()
            && self.engine.pinned().is_none()
            && !self.engine.is_lost()
            && self.txn.run.is_none()
            && self.mirror.is_none()
            && self.cache_fill.is_none()
            && !self.cache_off()
    }

    /// `SET fulcrum.cache = off` (or `false`): this client's reads neither
    /// use nor fill the cache until it sets it back or resets it.
    fn cache_off(&self) -> bool {
        self.params
            .desired
            .get("fulcrum.cache")
            .is_some_and(|stmt| {
                let value = stmt.rsplit(['=', ' ']).next().unwrap_or("");
                let value = value.trim_matches(|c| c == '\'' || c == ';' || c == ' ');
                value.eq_ignore_ascii_case("off") || value.eq_ignore_ascii_case("false")
            })
    }

    /// Looks the Query at the front of the client buffer (`total` bytes,
    /// its text `text_len` long) up in the cache.
    pub(super) async fn cache_front(&mut self, total: usize, text_len: Option<usize>) -> CacheStep {
        if !self.cache_may_answer() {
            return CacheStep::Pass;
        }
        let Some(n) = text_len else {
            return CacheStep::Pass;
        };
        let Ok(text) = std::str::from_utf8(&self.client.read_buf[5..5 + n]) else {
            return CacheStep::Pass;
        };
        let unit = self.ctx.classify_unit(text);
        let Some((tables, ttl)) = self.keepable(&unit, text) else {
            return CacheStep::Pass;
        };
        let key = self.cache_key(b'Q', &[text.as_bytes()]);
        let normal = fulcrum_sql::normalize(text, fulcrum_sql::Dialect::Postgres, 1000);
        let cache = self.ctx.cache.clone().expect("checked above");
        let query = Query {
            key: &key,
            database: &self.id.database,
            digest: unit.key,
            text: &normal,
            tables: &tables,
            ttl,
        };
        let mut found = cache.lookup(&query, true);
        if let Lookup::Wait(waiter) = found {
            // Another client is filling it: its answer serves this one too.
            let _ = tokio::time::timeout(FILL_WAIT, waiter.wait()).await;
            found = cache.lookup(&query, false);
        }
        match found {
            Lookup::Hit(answer) => {
                self.answer_from_cache(total, &answer);
                CacheStep::Answered
            }
            Lookup::Fill(fill) => {
                let max = usize::try_from(fill.max_result()).unwrap_or(usize::MAX);
                self.cache_fill = Some(Box::new(Capture {
                    fill,
                    answer: BytesMut::new(),
                    max,
                    spoiled: false,
                }));
                CacheStep::Filling
            }
            Lookup::Wait(_) | Lookup::Off => CacheStep::Pass,
        }
    }

    /// The tables and TTL of a read the cache may keep: a deterministic
    /// read of tables a rule lists (or, in `auto` mode, any), with no
    /// `fulcrum:nocache` hint.
    fn keepable(
        &self,
        unit: &fulcrum_sql::Classified,
        text: &str,
    ) -> Option<(Vec<Table>, Duration)> {
        let config = &self.ctx.config.cache;
        let reads = unit.cache.reads.as_ref()?;
        // Functions no list knows to be immutable: not kept (the catalog's
        // word on them is not asked yet).
        if unit.cache.calls.is_some() || (unit.comments && fulcrum_sql::no_cache(text)) {
            return None;
        }
        // Relation catalog: only ordinary tables the server has shown.
        if !self.relations_keepable(reads) {
            return None;
        }
        let names = reads.iter().map(|t| &**t);
        let ttl = match config.rule_for(names) {
            Some(rule) => rule.ttl.unwrap_or(config.ttl).min(config.ttl),
            None if config.mode == fulcrum_config::CacheMode::Auto => config.ttl,
            None => return None,
        };
        let db = &self.id.database;
        let tables = reads
            .iter()
            .map(|t| fulcrum_cache::table(db, t, false))
            .collect();
        Some((tables, ttl))
    }

    /// The key of a unit: its kind, the database, the user (unless entries
    /// are shared), every setting the client has (but `application_name`),
    /// then `parts` (the statement, its parameters and formats).
    pub(super) fn cache_key(&self, kind: u8, parts: &[&[u8]]) -> Vec<u8> {
        let mut key = Vec::with_capacity(128);
        let mut put = |b: &[u8]| {
            key.extend_from_slice(&(b.len() as u32).to_le_bytes());
            key.extend_from_slice(b);
        };
        put(&[kind]);
        put(self.id.database.as_bytes());
        match self.ctx.config.cache.isolation {
            CacheIsolation::User => put(self.id.user.as_bytes()),
            CacheIsolation::Shared => put(b""),
        }
        for (name, value) in self.params.desired.iter() {
            if name != "application_name" {
                put(name.as_bytes());
                put(value.as_bytes());
            }
        }
        put(b"--");
        for p in parts {
            put(p);
        }
        key
    }

    /// Answers the `total`-byte frame at the front with a cached answer
    /// (byte for byte the server's, ReadyForQuery included).
    fn answer_from_cache(&mut self, total: usize, answer: &Bytes) {
        let _ = self.client.read_buf.split_to(total);
        self.client.write_buf.extend_from_slice(answer);
        self.id.entry.counts.queries(1);
        self.set_status(b'I');
    }

    /// A ReadyForQuery with `status`: what the client wrote is invalidated
    /// again (and once more at the end of its transaction, when it ran in
    /// one). A fill ends at its own forwarded ReadyForQuery (`cache_filled`).
    pub(super) fn cache_ready(&mut self, status: u8) {
        if let Some(written) = self.cache_written.take() {
            self.invalidate(&written);
            if status != b'I' {
                // Once more when the transaction ends (COMMIT's answer).
                self.cache_written = Some(written);
            }
        }
    }

    /// The unit being forwarded may change what `writes` says: its entries
    /// go now, and again at its answer.
    pub(super) fn cache_writes(&mut self, writes: &Writes) {
        if self.ctx.cache.is_none() {
            return;
        }
        let db = &self.id.database;
        let now = match writes {
            Writes::Nothing => return,
            Writes::Everything => Written::Database,
            // Relation catalog: triggers, rules, cascades, partitions.
            Writes::Tables(names) if self.relations_wide(names) => Written::Database,
            Writes::Tables(names) => Written::Tables(
                names
                    .iter()
                    .map(|t| fulcrum_cache::table(db, t, false))
                    .collect(),
            ),
        };
        self.invalidate(&now);
        let merged = match (self.cache_written.take().map(|w| *w), now) {
            (Some(Written::Database), _) | (_, Written::Database) => Written::Database,
            (Some(Written::Tables(mut a)), Written::Tables(b)) => {
                a.extend(b);
                a.sort();
                a.dedup();
                Written::Tables(a)
            }
            (None, now) => now,
        };
        self.cache_written = Some(Box::new(merged));
    }

    /// The relation catalog's word on a read of `names`: kept only when
    /// every name is an ordinary table (asked for when not known yet).
    fn relations_keepable(&self, names: &[std::sync::Arc<str>]) -> bool {
        let id = &self.id;
        self.ctx
            .relations
            .keepable(&id.pool_user, (0, 0), &id.database, names)
    }

    /// The relation catalog's word on a write to `names`: whether it may
    /// change more than them (the whole database is invalidated then).
    fn relations_wide(&self, names: &[std::sync::Arc<str>]) -> bool {
        let id = &self.id;
        self.ctx
            .relations
            .wide_writes(&id.pool_user, (0, 0), &id.database, names)
    }

    fn invalidate(&self, written: &Written) {
        let Some(cache) = &self.ctx.cache else {
            return;
        };
        match written {
            Written::Tables(tables) => cache.invalidate(tables, Source::Proxy),
            Written::Database => cache.invalidate_database(&self.id.database, Source::Proxy),
        }
    }

    /// The server connection is gone mid-answer: nothing of it is kept, and
    /// what the client wrote is invalidated now (it may have committed) and
    /// kept for the next ReadyForQuery (a replay may commit it later).
    pub(super) fn cache_server_lost(&mut self) {
        if let Some(mut capture) = self.cache_fill.take() {
            capture.spoil();
        }
        if let Some(written) = &self.cache_written {
            self.invalidate(written);
        }
    }

    /// The forwarded ReadyForQuery of a fill's answer: kept if whole.
    pub(super) fn cache_filled(&mut self, status: u8) {
        if let Some(capture) = self.cache_fill.take() {
            capture.finish(status);
        }
    }
}
