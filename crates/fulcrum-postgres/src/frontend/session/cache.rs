//! The result cache on a PostgreSQL session (`[cluster.cache]`;
//! docs/routing.md, "Cache"): a Query from an idle client answered from
//! the cluster's cache (or an extended-protocol unit: `extended.rs` finds
//! it), the answer of one that missed kept as it passes
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

mod extended;
mod scope;

use extended::extended_unit;
use scope::Scope;

/// How long a read waits for another client's fill of the same key before
/// it goes to the server itself.
const FILL_WAIT: Duration = Duration::from_secs(5);

/// How a read is kept: the tables it reads, how long, and whether only
/// from its key's second miss (`mode = "auto"`).
struct Keep {
    tables: Vec<Table>,
    ttl: Duration,
    second_miss: bool,
    /// Its rule lets it be served and filled inside a transaction.
    in_transactions: bool,
}

/// What the cache did with the Query at the front of the client buffer.
pub(super) enum CacheStep {
    /// Not the cache's: routed as usual.
    Pass,
    /// Answered from the cache (the frame is consumed).
    Answered,
    /// A miss whose answer is to be kept: routed to the primary, captured.
    Filling,
    /// Another client is filling the key: its answer is waited for
    /// (`Session::cache_wait`, boxed where it is awaited).
    Wait(Waiting),
}

/// A lookup that must wait for another client's fill of the same key.
pub(super) struct Waiting {
    c: Candidate,
    total: usize,
    scope: Scope,
    parse_len: Option<usize>,
    waiter: fulcrum_cache::Waiter,
}

/// The answer of a read that missed, collected as it is forwarded.
pub(super) struct Capture {
    fill: fulcrum_cache::Fill,
    answer: BytesMut,
    max: usize,
    /// Something in the answer may not be kept (an error, a notice, a
    /// notification, a row streamed through, over `max_result`).
    spoiled: bool,
    /// It runs inside a transaction (`in_transactions`): its answer ends
    /// with `T`, and is kept as the `I` an idle client is given.
    in_txn: bool,
}

/// What the client's writes may have changed, invalidated again when
/// their answer, or their transaction's end, comes back.
pub(super) enum Written {
    Tables(Vec<Table>),
    Database,
}

/// A unit the cache may keep, keyed: what its lookup needs.
struct Candidate {
    key: Vec<u8>,
    /// The statement's normalised text (`SHOW CACHE`).
    normal: String,
    digest: u64,
    keep: Keep,
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

    /// Stores the answer if it is whole and ended where it started: idle,
    /// or (`in_transactions`) still in its transaction, kept with the
    /// ReadyForQuery an idle client is given.
    fn finish(mut self, status: u8) -> bool {
        let whole = match (self.in_txn, status) {
            (false, b'I') => true,
            (true, b'T') => match self.answer.last_mut() {
                Some(last) => {
                    *last = b'I';
                    true
                }
                None => false,
            },
            _ => false,
        };
        whole && !self.spoiled && self.fill.store(self.answer.freeze())
    }
}

impl Session {
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
    pub(super) fn cache_front(&mut self, total: usize, text_len: Option<usize>) -> CacheStep {
        let Some(scope) = self.cache_scope() else {
            return CacheStep::Pass;
        };
        let Some(n) = text_len else {
            return CacheStep::Pass;
        };
        let Ok(text) = std::str::from_utf8(&self.client.read_buf[5..5 + n]) else {
            return CacheStep::Pass;
        };
        let unit = self.ctx.classify_shared(text);
        let candidate = self.cache_candidate(scope, text, &unit, b'Q', &[text.as_bytes()]);
        // Routing reads this classification of the same frame, not the
        // text again (`next_unit_decision`).
        self.query_unit = Some(unit);
        match candidate {
            Some(c) => self.cache_lookup(c, total, scope, None),
            None => CacheStep::Pass,
        }
    }

    /// Looks the extended-protocol unit at the front of the client buffer
    /// up (`extended::extended_unit`): a Bind of a named statement (what
    /// pgbench -M prepared and libpq's `PQexecPrepared` send), or the
    /// unnamed statement's Parse and Bind (pgbench -M extended, psycopg,
    /// tokio-postgres `query_typed`), each with its Describe, an Execute
    /// of all rows and Sync. Anything else is not the cache's.
    pub(super) fn cache_front_extended(&mut self) -> CacheStep {
        let Some(scope) = self.cache_scope() else {
            return CacheStep::Pass;
        };
        if !self.stmts.signals.is_empty() || self.listen.is_some() {
            return CacheStep::Pass;
        }
        let max = self.ctx.config.max_message_size;
        let Some(unit) = extended_unit(&self.client.read_buf, max) else {
            return CacheStep::Pass;
        };
        let total = unit.total;
        let Some(parse) = unit.parse else {
            let Some(statement) = self.stmts.map.get(unit.statement).cloned() else {
                return CacheStep::Pass;
            };
            let Ok(text) = std::str::from_utf8(&statement.query) else {
                return CacheStep::Pass;
            };
            let classified = self.ctx.classify_unit(text);
            let parts = [statement.definition(), unit.bind_rest, &unit.described[..]];
            return match self.cache_candidate(scope, text, &classified, b'E', &parts) {
                Some(c) => self.cache_lookup(c, total, scope, None),
                None => CacheStep::Pass,
            };
        };
        // Session pooling forwards the unnamed statement as it is: a hit
        // would leave the client's previous one on its server.
        if !self.stmts.rewrite {
            return CacheStep::Pass;
        }
        let Ok(text) = std::str::from_utf8(parse.query) else {
            return CacheStep::Pass;
        };
        let classified = self.ctx.classify_shared(text);
        let parts = [parse.definition, unit.bind_rest, &unit.described[..]];
        let candidate = self.cache_candidate(scope, text, &classified, b'U', &parts);
        let parse_len = parse.frame.len();
        // Routing and the Parse's handling read this classification, not
        // the text again (`next_unit_decision`, `on_parse`).
        self.parse_unit = Some(classified);
        match candidate {
            Some(c) => self.cache_lookup(c, total, scope, Some(parse_len)),
            None => CacheStep::Pass,
        }
    }

    /// The key and keeping of a unit whose statement is `text` (classified
    /// `unit`), of `kind`, keyed by `parts` after the client's own; `None`
    /// when the read is not one the cache keeps here.
    fn cache_candidate(
        &self,
        scope: Scope,
        text: &str,
        unit: &fulcrum_sql::Classified,
        kind: u8,
        parts: &[&[u8]],
    ) -> Option<Candidate> {
        let keep = self
            .keepable(unit, text)
            .filter(|k| k.in_transactions || !scope.in_txn)?;
        Some(Candidate {
            key: self.cache_key(kind, parts),
            normal: fulcrum_sql::normalize(text, fulcrum_sql::Dialect::Postgres, 1000),
            digest: unit.key,
            keep,
        })
    }

    /// The lookup of `c` for the unit of `total` bytes at the front: a hit
    /// answers it, a miss takes the fill (where `scope` lets it run on the
    /// primary); another client's fill is to be waited for first (`Wait`:
    /// no future here, the usual lookup waits for nothing). A hit of a
    /// unit opening with the unnamed statement's Parse (`parse_len` bytes)
    /// makes that statement the client's, as the Parse would have.
    fn cache_lookup(
        &mut self,
        c: Candidate,
        total: usize,
        scope: Scope,
        parse_len: Option<usize>,
    ) -> CacheStep {
        let cache = self.ctx.cache.clone().expect("checked by cache_scope");
        match cache.lookup(&self.cache_query(&c), true) {
            Lookup::Wait(waiter) => CacheStep::Wait(Waiting {
                c,
                total,
                scope,
                parse_len,
                waiter,
            }),
            found => self.cache_found(found, total, scope, parse_len),
        }
    }

    /// Waits for another client's fill of the key (up to `FILL_WAIT`): its
    /// answer serves this one too; then looked up again, waiting no more.
    pub(super) async fn cache_wait(&mut self, w: Waiting) -> CacheStep {
        let _ = tokio::time::timeout(FILL_WAIT, w.waiter.wait()).await;
        let cache = self.ctx.cache.clone().expect("checked by cache_scope");
        let found = cache.lookup(&self.cache_query(&w.c), false);
        self.cache_found(found, w.total, w.scope, w.parse_len)
    }

    /// The cache's query for candidate `c`.
    fn cache_query<'a>(&'a self, c: &'a Candidate) -> Query<'a> {
        Query {
            key: &c.key,
            database: &self.id.database,
            digest: c.digest,
            text: &c.normal,
            tables: &c.keep.tables,
            ttl: c.keep.ttl,
            second_miss: c.keep.second_miss,
        }
    }

    /// What the cache `found` for the unit of `total` bytes at the front.
    fn cache_found(
        &mut self,
        found: Lookup,
        total: usize,
        scope: Scope,
        parse_len: Option<usize>,
    ) -> CacheStep {
        match found {
            Lookup::Hit(answer) => {
                if let (Some(len), Some(unit)) = (parse_len, self.parse_unit.take()) {
                    self.unnamed_answered(len, &unit);
                }
                self.answer_from_cache(total, &answer, scope.in_txn);
                CacheStep::Answered
            }
            // Its connection is a replica's: the answer may lack a write.
            Lookup::Fill(_) if !scope.fill => CacheStep::Pass,
            Lookup::Fill(fill) => {
                let max = usize::try_from(fill.max_result()).unwrap_or(usize::MAX);
                self.cache_fill = Some(Box::new(Capture {
                    fill,
                    answer: BytesMut::new(),
                    max,
                    spoiled: false,
                    in_txn: scope.in_txn,
                }));
                CacheStep::Filling
            }
            Lookup::Wait(_) | Lookup::Off => CacheStep::Pass,
        }
    }

    /// The tables and TTL of a read the cache may keep: a deterministic
    /// read of tables a rule lists (or, in `auto` mode, any), with no
    /// `fulcrum:nocache` hint.
    fn keepable(&self, unit: &fulcrum_sql::Classified, text: &str) -> Option<Keep> {
        let config = &self.ctx.config.cache;
        let reads = unit.cache.reads.as_ref()?;
        if unit.comments && fulcrum_sql::no_cache(text) {
            return None;
        }
        // Relation catalog: only ordinary tables the server has shown.
        if !self.relations_keepable(reads) {
            return None;
        }
        // Functions no list knows to be immutable: kept only if the
        // catalog says each is a user function declared IMMUTABLE.
        if let Some(calls) = &unit.cache.calls {
            let (user, db) = (&self.id.user, &self.id.database);
            if !self.ctx.functions.all_immutable(user, (0, 0), db, calls) {
                return None;
            }
        }
        let names = reads.iter().map(|t| &**t);
        let keeping = config.keeping(names)?;
        let db = &self.id.database;
        let tables = reads
            .iter()
            .map(|t| fulcrum_cache::table(db, t, false))
            .collect();
        Some(Keep {
            tables,
            ttl: keeping.ttl,
            second_miss: keeping.second_miss,
            in_transactions: keeping.in_transactions,
        })
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

    /// Answers the `total`-byte unit at the front with a cached answer
    /// (byte for byte the server's, its ReadyForQuery saying `T` inside a
    /// transaction).
    fn answer_from_cache(&mut self, total: usize, answer: &Bytes, in_txn: bool) {
        let _ = self.client.read_buf.split_to(total);
        self.client.write_buf.extend_from_slice(answer);
        let status = if in_txn { b'T' } else { b'I' };
        if let Some(last) = self.client.write_buf.last_mut() {
            *last = status;
        }
        self.id.entry.counts.queries(1);
        self.set_status(status);
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

    /// What a simple Query's `unit` may change: its facts, or the whole
    /// database when it is a read calling a user function the catalog says
    /// may write (the text cannot tell what that function changes).
    pub(super) fn cache_query_writes(&mut self, unit: &fulcrum_sql::Classified) {
        if self.ctx.cache.is_none() {
            return;
        }
        let (user, db) = (&self.id.user, &self.id.database);
        let calls_writer = unit.functions.is_some()
            && unit.decision == Decision::Read
            && self.ctx.catalog_decision(unit, user, db) != Decision::Read;
        match calls_writer {
            true => self.cache_writes(&Writes::Everything),
            false => self.cache_writes(&unit.cache.writes),
        }
    }

    /// A Bind (`frame`) of a statement that may write (its routing says
    /// so): what its text names (the unnamed statement's: as its Parse
    /// was classified), else (not known: session pooling; a read calling
    /// a function that writes) the whole database.
    pub(super) fn cache_bind_writes(&mut self, frame: &[u8]) {
        let writes = match bind_msg(&frame[5..]) {
            Some(b) if b.statement.is_empty() => {
                let known = self.stmts.rewrite && !self.stmts.unnamed.is_empty();
                known.then(|| self.stmts.unnamed_writes.clone())
            }
            b => b
                .and_then(|b| self.stmts.map.get(b.statement))
                .and_then(|s| std::str::from_utf8(&s.query).ok())
                .map(|text| self.ctx.classify_unit(text).cache.writes),
        };
        // It may write (its routing said so) yet its text names nothing it
        // changes (a read calling a function that writes).
        let writes = writes
            .filter(|w| *w != Writes::Nothing)
            .unwrap_or(Writes::Everything);
        self.cache_writes(&writes);
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
