//! The result cache on a MySQL session (`[cluster.cache]`; docs/routing.md,
//! "Cache", "MySQL and MariaDB"): a COM_QUERY or COM_STMT_EXECUTE from an
//! idle client answered from the cluster's cache, the answer of one that
//! missed kept as it passes (`Capture`), what the client's writes (COM_QUERY and
//! COM_STMT_EXECUTE) invalidate, when they are forwarded and again when
//! their answer (or their transaction's end) comes back, and the session's
//! opt-out, `SET fulcrum.cache = off`, which Fulcrum answers itself. The
//! store and its rules are `fulcrum_cache`'s; this module owns only what
//! is MySQL's: the key's bytes, which answers may be kept, and the
//! sequence ids and status flags of an answer served again. Where a client
//! may be served (inside a transaction, session pooling) is `scope.rs`;
//! the `fulcrum.cache` setting is `setting.rs`.

use std::sync::Arc;

use bytes::Bytes;
use fulcrum_cache::{Lookup, Query, Source, Table};
use fulcrum_config::CacheIsolation;
use fulcrum_sql::Writes;

use super::super::reply::Reply;
use super::*;
use crate::codec::packet::last_packet_payload;
use crate::codec::response::{parse_eof, parse_ok, set_status_flags};

mod scope;
mod setting;

use scope::Scope;

/// How long a read waits for another client's fill of the same key before
/// it goes to the server itself.
const FILL_WAIT: Duration = Duration::from_secs(5);

/// What the cache did with a COM_QUERY.
pub(super) enum CacheStep {
    /// Not the cache's: routed as usual.
    Pass,
    /// Answered from the cache.
    Answered,
    /// A miss whose answer is to be kept: routed to the primary, captured.
    Filling,
}

/// The answer of a read that missed, collected as it is forwarded.
pub(super) struct Capture {
    fill: fulcrum_cache::Fill,
    answer: BytesMut,
    max: usize,
    /// The client's (and its server connection's) capabilities: how the
    /// answer's end is read.
    caps: C,
    /// Something in the answer may not be kept (not a result set, an
    /// error, a warning, a second result, over `max_result`).
    spoiled: bool,
    /// Its last message came, and said the transaction status it started
    /// with.
    whole: bool,
    /// It runs inside a transaction (`in_transactions`): its end says
    /// `IN_TRANS`, and is kept with the status an idle client is given.
    in_txn: bool,
}

/// What the client's writes may have changed, invalidated again when
/// their answer, or their transaction's end, comes back.
#[derive(Default)]
pub(super) struct Written {
    tables: Vec<Table>,
    /// Databases anything of which may have changed (lower case); `None`
    /// in it: no default database, anything anywhere.
    databases: Vec<Option<Arc<str>>>,
}

/// A database as invalidation knows it on MySQL: lower case, so that a
/// server with `lower_case_table_names` set, where `Shop.t` is `shop.t`,
/// never keeps a stale entry (elsewhere, a few extra misses).
fn database_key(database: &str) -> Arc<str> {
    Arc::from(database.to_ascii_lowercase())
}

/// The table `named` (`t` or `db.t`) read or written with `database` the
/// default.
fn table_of(database: &str, named: &str) -> Table {
    let (db, name) = fulcrum_cache::table(database, named, true);
    (database_key(&db), name)
}

/// How a read is kept: the tables it reads, how long, and whether only
/// from its key's second miss (`mode = "auto"`).
struct Keep {
    tables: Vec<Table>,
    ttl: Duration,
    second_miss: bool,
}

/// The status bits that say where the client's transaction stands: set
/// from the client's own in a served answer, as an idle client's in a
/// kept one.
const TXN_BITS: StatusFlags = StatusFlags::SERVER_STATUS_IN_TRANS
    .union(StatusFlags::SERVER_STATUS_AUTOCOMMIT)
    .union(StatusFlags::SERVER_STATUS_IN_TRANS_READONLY);

impl Capture {
    /// One message of the answer, as forwarded (`frame`, its header and
    /// all its packets), `first` its first packet's payload, `reply` the
    /// answer's state after it. `altered`: Fulcrum changed it on its way
    /// (a process list's ids).
    pub(super) fn message(&mut self, frame: &[u8], first: &[u8], reply: &Reply, altered: bool) {
        if self.spoiled {
            return;
        }
        // A result set opens with its column count: not an OK (0x00), an
        // ERR (0xFF), a LOCAL INFILE request (0xFB) or an EOF (0xFE).
        // Its sequence ids start at 1 (a one-packet command's answer), as
        // `put_answer` expects.
        let opening = self.answer.is_empty();
        let bad_start = opening
            && (frame.get(3) != Some(&1)
                || matches!(first.first(), None | Some(0x00 | 0xFB | 0xFE | 0xFF)));
        if altered || bad_start || reply.error || reply.wants_file() {
            return self.spoil();
        }
        if reply.is_done() {
            // The result set's end: EOF, or with DEPRECATE_EOF an OK-as-EOF.
            let end = match self.caps.contains(C::CLIENT_DEPRECATE_EOF) {
                true => parse_ok(first, self.caps)
                    .ok()
                    .map(|ok| (ok.warnings, ok.status)),
                false => parse_eof(first).ok(),
            };
            let kept = end.is_some_and(|(warnings, status)| {
                warnings == 0
                    && status.contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT)
                    && status.contains(StatusFlags::SERVER_STATUS_IN_TRANS) == self.in_txn
                    && !status.intersects(
                        StatusFlags::SERVER_STATUS_IN_TRANS_READONLY
                            | StatusFlags::SERVER_MORE_RESULTS_EXISTS
                            | StatusFlags::SERVER_SESSION_STATE_CHANGED
                            | StatusFlags::SERVER_STATUS_CURSOR_EXISTS,
                    )
            });
            if !kept || self.answer.len() + frame.len() > self.max {
                return self.spoil();
            }
            let at = self.answer.len() + HEADER_LEN;
            self.answer.extend_from_slice(frame);
            // Kept as an idle client's answer: autocommit, no transaction.
            let idle = |s: StatusFlags| (s - TXN_BITS) | StatusFlags::SERVER_STATUS_AUTOCOMMIT;
            if self.in_txn && !set_status_flags(&mut self.answer[at..], idle) {
                return self.spoil();
            }
            self.whole = true;
            return;
        } else if reply.awaits_next_result() {
            // SERVER_MORE_RESULTS_EXISTS: several statements, a CALL.
            return self.spoil();
        }
        if self.answer.len() + frame.len() > self.max {
            return self.spoil();
        }
        self.answer.extend_from_slice(frame);
    }

    /// Nothing of this answer is kept.
    pub(super) fn spoil(&mut self) {
        self.spoiled = true;
        self.answer = BytesMut::new();
    }

    /// Stores the answer if it is whole and ended where it started.
    fn finish(self) -> bool {
        !self.spoiled && self.whole && self.fill.store(self.answer.freeze())
    }
}

/// Writes `answer` (whole packets, sequence ids from 1) to `out` with its
/// sequence ids following `seq`, the first answer packet's, and the
/// transaction bits of its final status those of `status` (`None`: as
/// stored, an idle client's).
fn put_answer(out: &mut BytesMut, answer: &[u8], seq: u8, status: Option<StatusFlags>) {
    let at = out.len();
    out.extend_from_slice(answer);
    if let Some(status) = status {
        let end = last_packet_payload(&out[at..]).map(|r| r.start + at..r.end + at);
        if let Some(end) = end {
            let client = |s: StatusFlags| (s - TXN_BITS) | (status & TXN_BITS);
            set_status_flags(&mut out[end], client);
        }
    }
    if seq == 1 {
        // A one-packet COM_QUERY (sequence id 0): the ids are already so.
        return;
    }
    let packets = &mut out[at..];
    let (mut p, mut id) = (0usize, seq);
    while p + HEADER_LEN <= packets.len() {
        let len = u32::from_le_bytes([packets[p], packets[p + 1], packets[p + 2], 0]) as usize;
        packets[p + 3] = id;
        id = id.wrapping_add(1);
        p += HEADER_LEN + len;
    }
}

impl Session {
    /// Looks the COM_QUERY `text` up in the cache; `seq` is its answer's
    /// first sequence id.
    pub(super) async fn cache_front(&mut self, text: &str, seq: u8) -> CacheStep {
        let Some(scope) = self.cache_scope() else {
            return CacheStep::Pass;
        };
        let (decision, unit) = self.ctx.classify_unit_for(
            text,
            &self.user,
            (self.hello.wire_format.bits(), self.hello.charset),
            self.schema.as_deref().unwrap_or(""),
        );
        if decision != Decision::Read {
            return CacheStep::Pass;
        }
        let Some(keep) = self.keepable(&unit, text, scope) else {
            return CacheStep::Pass;
        };
        let key = self.cache_key(b'Q', &[text.as_bytes()]);
        self.cache_lookup(&key, text, unit.key, &keep, (seq, scope))
            .await
    }

    /// Looks a COM_STMT_EXECUTE (`payload`, no cursor) of the statement
    /// `sql` (decided `decision` at its prepare) up, its parameters' types
    /// `types` (this execute's, or those bound before).
    pub(super) async fn cache_front_execute(
        &mut self,
        (sql, decision): (&str, Decision),
        types: Option<&[u8]>,
        payload: &[u8],
        seq: u8,
    ) -> CacheStep {
        let Some(scope) = self.cache_scope() else {
            return CacheStep::Pass;
        };
        if decision != Decision::Read {
            return CacheStep::Pass;
        }
        let unit = self.ctx.classifier.classify_shared(sql);
        let Some(keep) = self.keepable(&unit, sql, scope) else {
            return CacheStep::Pass;
        };
        // The text, the types in force, then all of the execute after the
        // statement id: flags, iterations, NULL bitmap, the types flag
        // (and types), the values.
        let Some(rest) = payload.get(5..) else {
            return CacheStep::Pass;
        };
        let types = types.unwrap_or_default();
        let key = self.cache_key(b'E', &[sql.as_bytes(), types, rest]);
        self.cache_lookup(&key, sql, unit.key, &keep, (seq, scope))
            .await
    }

    /// The lookup of `key` (`text`, its fingerprint `digest`, reading
    /// `tables`): a hit answers the command, a miss takes the fill, another
    /// client's fill is waited for first; a miss fills only where `scope`
    /// says its connection is the primary's.
    async fn cache_lookup(
        &mut self,
        key: &[u8],
        text: &str,
        digest: u64,
        keep: &Keep,
        (seq, scope): (u8, Scope),
    ) -> CacheStep {
        let normal = fulcrum_sql::normalize(text, fulcrum_sql::Dialect::MySql, 1000);
        let database = self.schema.as_deref().map(database_key).unwrap_or_default();
        let query = Query {
            key,
            database: &database,
            digest,
            text: &normal,
            tables: &keep.tables,
            ttl: keep.ttl,
            second_miss: keep.second_miss,
        };
        let cache = self.ctx.cache.clone().expect("checked by cache_scope");
        let mut found = cache.lookup(&query, true);
        if let Lookup::Wait(waiter) = found {
            // Another client is filling it: its answer serves this one too.
            let _ = tokio::time::timeout(FILL_WAIT, waiter.wait()).await;
            found = cache.lookup(&query, false);
        }
        match found {
            Lookup::Hit(answer) => {
                self.answer_from_cache(&answer, seq, scope.in_txn);
                CacheStep::Answered
            }
            // Its connection is a replica's: the answer may lack a write.
            Lookup::Fill(_) if !scope.fill => CacheStep::Pass,
            Lookup::Fill(fill) => {
                let max = usize::try_from(fill.max_result()).unwrap_or(usize::MAX);
                self.cache.fill = Some(Box::new(Capture {
                    fill,
                    answer: BytesMut::new(),
                    max,
                    caps: self.hello.caps,
                    spoiled: false,
                    whole: false,
                    in_txn: scope.in_txn,
                }));
                CacheStep::Filling
            }
            Lookup::Wait(_) | Lookup::Off => CacheStep::Pass,
        }
    }

    /// The tables and TTL of a read the cache may keep: a read of tables a
    /// rule lists (or, in `auto` mode, any) that calls no function a list
    /// does not know to be immutable (MariaDB has no IMMUTABLE: a stored
    /// function's answer is never kept), that asks nothing of its
    /// connection (FOUND_ROWS(), CONNECTION_ID(), the process list), with
    /// no `fulcrum:nocache` hint; inside a transaction, only a rule's with
    /// `in_transactions`.
    fn keepable(&self, unit: &fulcrum_sql::Classified, text: &str, scope: Scope) -> Option<Keep> {
        let config = &self.ctx.config.cache;
        let reads = unit.cache.reads.as_ref()?;
        let identity = &unit.identity;
        if unit.cache.calls.is_some()
            || identity.found_rows
            || identity.connection_id
            || identity.processlist
            || (unit.comments && fulcrum_sql::no_cache(text))
        {
            return None;
        }
        // What the text cannot show (a view, a sequence, a system-versioned
        // table) the relation catalog tells, for the session's database: a
        // name in another database is not kept.
        let db = self.schema.as_deref()?;
        let elsewhere = |t: &str| {
            t.rsplit_once('.')
                .is_some_and(|(q, _)| !q.eq_ignore_ascii_case(db))
        };
        if reads.iter().any(|t| elsewhere(t))
            || !self.ctx.relations.keepable(&self.user, (0, 0), db, reads)
        {
            return None;
        }
        let names = reads.iter().map(|t| &**t);
        let keeping = config.keeping(names)?;
        if scope.in_txn && !keeping.in_transactions {
            return None;
        }
        Some(Keep {
            tables: reads.iter().map(|t| table_of(db, t)).collect(),
            ttl: keeping.ttl,
            second_miss: keeping.second_miss,
        })
    }

    /// The key of a command: its kind, the schema, the user (unless
    /// entries are shared), the client's capability word and character set
    /// (they shape the answer's bytes: EOF packets or not, session
    /// tracking, the text's encoding), every SET statement the client ran
    /// (replayed on its connections: `sql_mode`, `time_zone`, `NAMES`, ...),
    /// then `parts` (the statement, an execute's types and values).
    fn cache_key(&self, kind: u8, parts: &[&[u8]]) -> Vec<u8> {
        let mut key = Vec::with_capacity(128 + parts.iter().map(|p| p.len() + 4).sum::<usize>());
        let mut put = |b: &[u8]| {
            key.extend_from_slice(&(b.len() as u32).to_le_bytes());
            key.extend_from_slice(b);
        };
        put(&[kind]);
        put(self.schema.as_deref().unwrap_or("").as_bytes());
        match self.ctx.config.cache.isolation {
            CacheIsolation::User => put(self.user.as_bytes()),
            CacheIsolation::Shared => put(b""),
        }
        put(&self.hello.caps.bits().to_le_bytes());
        put(&[self.hello.charset]);
        for set in &self.desired {
            put(set.as_bytes());
        }
        put(b"--");
        for p in parts {
            put(p);
        }
        key
    }

    /// Answers the command with a cached answer: the server's bytes, with
    /// their sequence ids following the command's and, inside a
    /// transaction, its final status saying so (the client's own flags).
    /// A transaction answered so is not replayed (`transaction_replay`
    /// would send the read to a server and compare answers).
    fn answer_from_cache(&mut self, answer: &Bytes, seq: u8, in_txn: bool) {
        let status = in_txn.then_some(self.status);
        if in_txn {
            self.engine.log_spoiled();
        }
        put_answer(&mut self.client.write_buf, answer, seq, status);
        self.client_entry.counts.queries(1);
        self.ctx.metrics.bytes_out.inc_by(answer.len() as u64);
        self.client_entry.counts.sent(answer.len() as u64);
    }

    /// The command being forwarded may change `writes`: its entries go
    /// now, and again at its answer (and at its transaction's end).
    fn cache_writes(&mut self, writes: &Writes) {
        if self.ctx.cache.is_none() {
            return;
        }
        let db = self.schema.as_deref();
        let now = match writes {
            Writes::Nothing => return,
            // A routine or DDL may name any database: everything goes.
            Writes::Everything => Written {
                tables: Vec::new(),
                databases: vec![None],
            },
            // A table with triggers or cascading foreign keys, or one the
            // catalog does not know: its database, besides the names.
            Writes::Tables(names) if self.wide(db, names) => Written {
                tables: Vec::new(),
                databases: vec![db.map(database_key)],
            },
            Writes::Tables(names) => Written {
                tables: names
                    .iter()
                    .map(|t| table_of(db.unwrap_or(""), t))
                    .collect(),
                databases: Vec::new(),
            },
        };
        self.invalidate(&now);
        let mut all = self.cache.written.take().map(|w| *w).unwrap_or_default();
        all.tables.extend(now.tables);
        all.tables.sort();
        all.tables.dedup();
        all.databases.extend(now.databases);
        all.databases.sort();
        all.databases.dedup();
        self.cache.written = Some(Box::new(all));
    }

    /// Whether a write to `names` (in the default database `db`) may change
    /// more than they: the relation catalog's word, or (no default
    /// database, a name in another database) yes.
    fn wide(&self, db: Option<&str>, names: &[Arc<str>]) -> bool {
        let Some(db) = db else {
            return true;
        };
        names.iter().any(|t| {
            t.rsplit_once('.')
                .is_some_and(|(q, _)| !q.eq_ignore_ascii_case(db))
        }) || self
            .ctx
            .relations
            .wide_writes(&self.user, (0, 0), db, names)
    }

    /// What a unit decided `decision` (with the function catalog) may
    /// change: its facts, or everything in the database when it is a read
    /// calling a function the catalog says may write (the text cannot tell
    /// what that function changes).
    pub(super) fn cache_unit_writes(&mut self, decision: Decision, unit: &fulcrum_sql::Classified) {
        if self.ctx.cache.is_none() {
            return;
        }
        let calls_writer = unit.functions.is_some()
            && unit.decision == Decision::Read
            && decision != Decision::Read;
        match calls_writer {
            true => self.cache_writes(&Writes::Everything),
            false => self.cache_writes(&unit.cache.writes),
        }
    }

    /// A COM_STMT_EXECUTE of `sql` (decided `decision` at its prepare).
    pub(super) fn cache_execute_writes(&mut self, sql: &str, decision: Decision) {
        if self.ctx.cache.is_none() {
            return;
        }
        let unit = self.ctx.classifier.classify_shared(sql);
        self.cache_unit_writes(decision, &unit);
    }

    fn invalidate(&self, written: &Written) {
        let Some(cache) = &self.ctx.cache else {
            return;
        };
        cache.invalidate(&written.tables, Source::Proxy);
        for db in &written.databases {
            match db {
                Some(db) => cache.invalidate_database(db, Source::Proxy),
                None => cache.invalidate_all(Source::Proxy),
            }
        }
    }

    /// A forwarded answer has ended (the session's status is its): a fill
    /// is stored if whole; what the client wrote is invalidated again, and
    /// once more at the end of its transaction when it is in one.
    pub(super) fn cache_answered(&mut self) {
        if let Some(capture) = self.cache.fill.take() {
            capture.finish();
        }
        if let Some(written) = self.cache.written.take() {
            self.invalidate(&written);
            if self.in_transaction() {
                self.cache.written = Some(written);
            }
        }
    }

    /// The command's answer will not be kept (no server could be had, a
    /// replica read is retried).
    pub(super) fn cache_spoil(&mut self) {
        self.cache.fill = None;
    }

    /// The server connection is gone mid-answer: nothing of it is kept, and
    /// what the client wrote is invalidated now (it may have committed) and
    /// kept for the next answer (a replay may commit it later).
    pub(super) fn cache_server_lost(&mut self) {
        self.cache.fill = None;
        if let Some(written) = &self.cache.written {
            self.invalidate(written);
        }
    }
}

/// The session's cache state.
#[derive(Default)]
pub(super) struct SessionCache {
    /// `SET fulcrum.cache = off`: this client's reads neither use nor fill
    /// the cache (until it sets it on, resets it, COM_RESET_CONNECTION or
    /// COM_CHANGE_USER).
    pub(super) off: bool,
    /// The answer of the COM_QUERY being forwarded, to be kept.
    pub(super) fill: Option<Box<Capture>>,
    /// What the client's writes may have changed, not yet invalidated at
    /// their answer or transaction's end.
    pub(super) written: Option<Box<Written>>,
    /// Whether its open transaction may be served (`in_transactions`).
    pub(super) txn: fulcrum_session::cache_txn::TxnScope,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_ids_follow_the_command() {
        // Two packets: 1-byte and 2-byte payloads, ids 1 and 2.
        let answer = [1, 0, 0, 1, 0xAA, 2, 0, 0, 2, 0xBB, 0xCC];
        let mut out = BytesMut::from(&b"xy"[..]);
        put_answer(&mut out, &answer, 1, None);
        assert_eq!(&out[2..], &answer);
        let mut out = BytesMut::new();
        put_answer(&mut out, &answer, 5, None);
        assert_eq!(&out[..], &[1, 0, 0, 5, 0xAA, 2, 0, 0, 6, 0xBB, 0xCC]);
    }

    #[test]
    fn a_served_answer_ends_with_the_client_s_transaction_status() {
        // A one-column row, then an old-style EOF saying autocommit.
        let mut answer = vec![1, 0, 0, 1, 0x41];
        answer.extend_from_slice(&[5, 0, 0, 2, 0xFE, 0, 0, 2, 0]);
        let client = StatusFlags::SERVER_STATUS_IN_TRANS | StatusFlags::SERVER_STATUS_AUTOCOMMIT;
        let mut out = BytesMut::new();
        put_answer(&mut out, &answer, 1, Some(client));
        assert_eq!(&out[..answer.len() - 2], &answer[..answer.len() - 2]);
        assert_eq!(parse_eof(&out[9..]), Ok((0, client)));
    }

    #[test]
    fn qualified_names_are_their_database_s_in_lower_case() {
        assert_eq!(
            table_of("App", "Other.T"),
            (Arc::from("other"), Arc::from("t"))
        );
        assert_eq!(table_of("App", "t"), (Arc::from("app"), Arc::from("t")));
    }
}
