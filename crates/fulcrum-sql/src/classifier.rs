//! The classifier: hint check, cache lookup by fingerprint, and on a miss a
//! parse with sqlparser and the rules. Counts hits, misses and statements it
//! could not parse (each distinct one logged once by the caller's choice).
//! A text over `max_classify_bytes` is placed without a parse
//! (`classifier/oversized.rs`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::calls::undecided_calls;

use sqlparser::parser::Parser;

use crate::cache::DecisionCache;
use crate::decision::Decision;
use crate::dialect::Dialect;
use crate::effects::{self, Effect, Effects};
use crate::functions::{pin_functions, primary_functions};
use crate::hints::{hint, Hint};
use crate::mysql;
use crate::rules::{classify_statement, FunctionRules};
use crate::statements::split_statements;

mod oversized;

/// A unit's classification: the routing decision of all its statements, and
/// what each does to the session (PostgreSQL; MySQL replays the unit's text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classified {
    pub decision: Decision,
    pub effects: Effects,
    /// A read's calls of functions no list decides (for the cluster's
    /// function catalog); `None` when there are none.
    pub functions: Option<Arc<[Arc<str>]>>,
    /// It may commit (`statements::may_commit`), read with the decision
    /// when the text is first classified and cached with it.
    pub may_commit: bool,
    /// PostgreSQL: the functions and procedures the unit calls that are not
    /// known to leave no session state (user functions, built-ins no list
    /// knows); the cluster pins the client unless its catalog shows each
    /// is a built-in. `None` when there are none.
    pub unproven: Option<Arc<[Arc<str>]>>,
    /// The text's fingerprint (the cache's key; the digest statistics key
    /// by it too), 0 for a text too long to classify.
    pub key: u64,
    /// The text has a comment: only then can it carry a hint.
    pub comments: bool,
    /// MySQL: the connection ids it asks for (`CONNECTION_ID()`, the
    /// process list), read with the decision and cached with it.
    pub identity: crate::identity::Identity,
    /// What the result cache needs: the tables a read may be kept for and
    /// what a write may change (`cache_facts.rs`).
    pub cache: crate::cache_facts::CacheFacts,
}

/// Per-cluster classifier settings.
#[derive(Debug, Clone, Default)]
pub struct ClassifierConfig {
    /// Cached decisions kept (0: no cache).
    pub cache_size: usize,
    /// User functions that write: a read calling one goes to the primary.
    pub write_functions: Vec<String>,
    /// Functions known to be safe on a replica (overrides the built-in lists).
    pub read_only_functions: Vec<String>,
    /// User functions and procedures that leave no session state: calling
    /// one does not pin (PostgreSQL).
    pub session_free_functions: Vec<String>,
    /// Longest statement text parsed (0: no limit). A longer one is not
    /// parsed: it goes where `default_route` says, and is counted.
    pub max_classify_bytes: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ClassifierStats {
    pub hits: u64,
    pub misses: u64,
    pub unparsed: u64,
    /// Statements longer than `max_classify_bytes`, not parsed.
    pub oversized: u64,
    pub cached: usize,
}

pub struct Classifier {
    dialect: Dialect,
    rules: FunctionRules,
    cache: DecisionCache,
    max_bytes: usize,
    oversized: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    unparsed: AtomicU64,
}

impl Classifier {
    pub fn new(dialect: Dialect, config: &ClassifierConfig) -> Classifier {
        let lower = |v: &[String]| {
            v.iter()
                .map(|s| s.to_ascii_lowercase())
                .collect::<HashSet<_>>()
        };
        let mut primary: HashSet<String> = primary_functions(dialect)
            .iter()
            .map(|s| s.to_string())
            .collect();
        let written = lower(&config.write_functions);
        primary.extend(written.iter().cloned());
        Classifier {
            dialect,
            rules: FunctionRules {
                primary,
                pin: pin_functions(dialect)
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                read_only: lower(&config.read_only_functions),
                written,
                session_free: lower(&config.session_free_functions),
            },
            cache: DecisionCache::new(config.cache_size),
            max_bytes: config.max_classify_bytes,
            oversized: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            unparsed: AtomicU64::new(0),
        }
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The decision for `sql` (one or more statements), hints applied.
    pub fn classify(&self, sql: &str) -> Decision {
        self.classify_unit(sql).decision
    }

    /// The decision for `sql` and its session effects, in one pass: cached
    /// by fingerprint unless an effect carries the statement's own text.
    pub fn classify_unit(&self, sql: &str) -> Classified {
        Arc::unwrap_or_clone(self.classify_shared(sql))
    }

    /// `classify_unit`, shared: the cache keeps each keyed and unhinted, so a
    /// hit on a text without comments is the cached one itself (a reference
    /// count, not a copy of the whole struct); a commented text gets a copy.
    #[inline]
    pub fn classify_shared(&self, sql: &str) -> Arc<Classified> {
        self.classify_text(sql.as_bytes(), Some(sql))
    }

    /// [`classify_shared`](Self::classify_shared) of text in the client's
    /// encoding, which may not be UTF-8 (a LATIN1 client's literal). A hit
    /// is found from the bytes, with no UTF-8 check (one pass over the
    /// text: the fingerprint's). Text that is not UTF-8 is parsed as
    /// `encoding::statement_text` gives it, which keeps the statement's
    /// shape; a setting it would track carries text that is not what the
    /// client sent, so it pins instead (the client keeps its connection and
    /// its setting as the server has it), and it is not cached.
    #[inline]
    pub fn classify_bytes(&self, text: &[u8]) -> Arc<Classified> {
        self.classify_text(text, None)
    }

    /// `b`, and `utf8` when the caller knows it is that text.
    #[inline]
    fn classify_text(&self, b: &[u8], utf8: Option<&str>) -> Arc<Classified> {
        if self.max_bytes > 0 && b.len() > self.max_bytes {
            return self.classify_oversized(&text_of(b, utf8));
        }
        // One pass over the text: the key, and whether a hint may be in it.
        let scan = crate::fingerprint::scan_bytes(b, self.dialect);
        let key = scan.key;
        let cacheable = cacheable(b);
        let cached = if cacheable { self.cache.get(key) } else { None };
        let mut unit = match cached {
            Some(c) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                c
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                self.parse_new(b, utf8, key, cacheable)
            }
        };
        if scan.comments {
            let sql = text_of(b, utf8);
            let unit = Arc::make_mut(&mut unit);
            unit.comments = true;
            unit.decision = with_hint(&sql, unit.decision);
            // A read hinted to the primary asks for the freshest answer:
            // never from the result cache.
            if unit.decision != Decision::Read {
                unit.cache.reads = None;
                unit.cache.calls = None;
            }
        }
        unit
    }

    /// A text the cache does not hold, parsed and (when `cacheable` and
    /// no effect carries its text) kept under `key`. Out of line: a miss.
    #[inline(never)]
    fn parse_new(
        &self,
        b: &[u8],
        utf8: Option<&str>,
        key: u64,
        cacheable: bool,
    ) -> Arc<Classified> {
        let valid = utf8.or_else(|| std::str::from_utf8(b).ok());
        let mut c = match valid {
            Some(sql) => self.parse_unit(sql),
            None => not_utf8(self.parse_unit(&crate::encoding::statement_text(b))),
        };
        c.key = key;
        let c = Arc::new(c);
        if cacheable && valid.is_some() && !c.effects.carry_text() {
            self.cache.put(key, c.clone());
        }
        c
    }

    /// Parses and applies the rules, without the cache.
    pub fn parse(&self, sql: &str) -> Decision {
        self.parse_unit(sql).decision
    }

    fn parse_unit(&self, sql: &str) -> Classified {
        let mut unit = self.parse_text(sql);
        unit.may_commit = crate::statements::may_commit(sql.as_bytes());
        if self.dialect == Dialect::MySql {
            unit.identity = crate::identity::of(sql);
        }
        unit
    }

    fn parse_text(&self, sql: &str) -> Classified {
        let text;
        let sql = if self.dialect == Dialect::MySql && sql.contains("/*") {
            text = open_executable_comments(sql);
            text.as_str()
        } else {
            sql
        };
        if self.dialect == Dialect::MySql {
            if let Some(d) = mysql::quirk(sql) {
                return d.into();
            }
        }
        if let Some(c) = self.parse_statements(sql) {
            return c;
        }
        // MySQL text sqlparser refused is tokenized once more, and every
        // MySQL form below reads those tokens.
        let tokens = match self.dialect {
            Dialect::MySql => mysql::Tokens::of(sql),
            Dialect::Postgres => None,
        };
        if let Some(d) = tokens.as_ref().and_then(|t| self.mysql_form(t)) {
            return d.into();
        }
        self.unparsed.fetch_add(1, Ordering::Relaxed);
        let mut decision = unparsed_session_statement(sql, self.dialect, tokens.as_ref())
            .unwrap_or(Decision::Unknown);
        let mut effects = self.unparsed_effects(sql);
        let plain = match self.dialect {
            Dialect::Postgres => crate::session_facts::maintenance_by_words(sql),
            Dialect::MySql => crate::session_facts::mysql_plain_by_words(sql),
        };
        if decision == Decision::Unknown && !plain {
            // Default-deny: what Fulcrum cannot read (a DO block, a form
            // sqlparser lacks) may leave any session state.
            let reason = crate::session_facts::UNPARSED;
            decision = Decision::Pin(reason);
            if self.dialect == Dialect::Postgres {
                // MySQL reports no effects (it replays a unit's text).
                let mut list = effects.to_vec();
                list.push(Effect::Pin(reason));
                effects = Effects::new(list);
            }
        }
        Classified {
            decision,
            effects,
            functions: None,
            unproven: None,
            may_commit: false,
            key: 0,
            comments: false,
            identity: Default::default(),
            cache: crate::cache_facts::CacheFacts::of_decision(decision),
        }
    }

    /// sqlparser and the rules alone: `None` when sqlparser cannot parse `sql`.
    fn parse_statements(&self, sql: &str) -> Option<Classified> {
        let stmts = Parser::parse_sql(self.dialect.parser_dialect(), sql).ok()?;
        let decisions: Vec<Decision> = stmts
            .iter()
            .map(|s| classify_statement(s, self.dialect, &self.rules))
            .collect();
        let decision = decisions
            .iter()
            .copied()
            .reduce(Decision::combine)
            .unwrap_or(Decision::Read);
        // What the unit may leave in the session beyond its statements'
        // kinds (set_config, pg_temp, sequences, unproven calls).
        let mut facts = crate::session_facts::Facts::default();
        match self.dialect {
            Dialect::Postgres => facts = crate::session_facts::of(sql, &stmts, &self.rules),
            // A stored function or procedure may set user variables or make
            // temporary tables: the same default-deny for its calls.
            Dialect::MySql => {
                let calls = crate::calls::unproven_calls(&stmts, Dialect::MySql, &self.rules);
                facts.unproven = (!calls.is_empty()).then(|| Arc::from(calls));
            }
        }
        let decision = match facts.pin {
            Some(reason) => decision.combine(Decision::Pin(reason)),
            None => decision,
        };
        if facts.effects.is_empty()
            && (self.dialect != Dialect::Postgres || decisions.iter().all(|d| is_plain(*d)))
        {
            let functions = (decision == Decision::Read)
                .then(|| undecided_calls(&stmts, self.dialect, &self.rules))
                .filter(|f| !f.is_empty())
                .map(Arc::from);
            return Some(Classified {
                decision,
                effects: Effects::default(),
                functions,
                unproven: facts.unproven,
                may_commit: false,
                key: 0,
                comments: false,
                identity: Default::default(),
                cache: crate::cache_facts::of(&stmts, self.dialect, decision),
            });
        }
        // Each statement's effect, with the text the client wrote for it
        // (sqlparser's rendering where the two do not line up).
        let pieces = split_statements(sql);
        let mut list = Vec::new();
        for (i, (stmt, d)) in stmts.iter().zip(&decisions).enumerate() {
            let shown;
            let text = match pieces.get(i) {
                Some(p) if pieces.len() == stmts.len() => *p,
                _ => {
                    shown = stmt.to_string();
                    shown.as_str()
                }
            };
            list.extend(effects::of_statement(stmt, *d, text));
        }
        list.extend(facts.effects);
        Some(Classified {
            decision,
            effects: Effects::new(list),
            functions: None,
            unproven: facts.unproven,
            may_commit: false,
            key: 0,
            comments: false,
            identity: Default::default(),
            cache: crate::cache_facts::of(&stmts, self.dialect, decision),
        })
    }

    /// The effects of a PostgreSQL unit sqlparser could not parse, statement
    /// by statement by their first words.
    fn unparsed_effects(&self, sql: &str) -> Effects {
        if self.dialect != Dialect::Postgres {
            return Effects::default();
        }
        let list: Vec<Effect> = split_statements(sql)
            .into_iter()
            .filter_map(effects::of_words)
            .collect();
        Effects::new(list)
    }

    /// MySQL forms sqlparser cannot parse but whose decision follows from a
    /// statement it can. `SET STATEMENT ... FOR <stmt>` routes as `<stmt>`. A
    /// SELECT with `INTO @var` at the end pins (its user variable must
    /// survive), also when the rest does not parse. `DO <expr>` is placed,
    /// like the unparsed session statements, only when `SELECT <expr>` pins
    /// (locks, user variables); otherwise it stays unknown.
    fn mysql_form(&self, tokens: &mysql::Tokens<'_>) -> Option<Decision> {
        if let Some(body) = mysql::set_statement_body(tokens) {
            return Some(self.parse(body));
        }
        if let Some(select) = mysql::do_as_select(tokens) {
            return self
                .parse_statements(&select)
                .map(|c| c.decision)
                .filter(|d| matches!(d, Decision::Pin(_)));
        }
        let rest = mysql::without_into_variables(tokens)?;
        let pin = Decision::Pin("SELECT ... INTO @variable");
        Some(
            self.parse_statements(&rest)
                .map_or(pin, |c| c.decision.combine(pin)),
        )
    }

    pub fn stats(&self) -> ClassifierStats {
        ClassifierStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            unparsed: self.unparsed.load(Ordering::Relaxed),
            oversized: self.oversized.load(Ordering::Relaxed),
            cached: self.cache.len(),
        }
    }
}

/// A few statement kinds are placed by their first words when sqlparser cannot
/// parse them, because treating them as plain writes would lose session state:
/// every `SET`/`RESET` form changes only settings (role changes and user
/// variables pin, `SET LOCAL` lasts for the transaction, the rest is
/// replayed), SQL `PREPARE`, `LOCK TABLES` and temporary tables pin, and a
/// transaction start is still a transaction start. The exceptions are MySQL
/// `SET`s that change the server or an account (`GLOBAL`/`PERSIST` anywhere
/// in the list, `SET PASSWORD`, `SET DEFAULT ROLE`): writes.
fn unparsed_session_statement(
    sql: &str,
    dialect: Dialect,
    tokens: Option<&mysql::Tokens<'_>>,
) -> Option<Decision> {
    if sql.trim_end().trim_end_matches(';').contains(';') {
        return None;
    }
    let lower = sql.to_ascii_lowercase();
    let words: Vec<&str> = lower.split_whitespace().take(4).collect();
    let word = |i: usize| words.get(i).copied().unwrap_or("");
    match word(0) {
        "set" => {
            let mysql = dialect == Dialect::MySql;
            if mysql && mysql::sets_server_scope(tokens) {
                return Some(Decision::Write);
            }
            // In MySQL LOCAL is a synonym of SESSION.
            let i = if word(1) == "session" || mysql && word(1) == "local" {
                2
            } else {
                1
            };
            Some(match word(i) {
                "role" | "authorization" => Decision::Pin("SET ROLE"),
                "local" | "transaction" | "constraints" => Decision::Txn,
                "global" => Decision::Write,
                "" => return None,
                "password" if mysql => Decision::Write,
                "default" if mysql && word(i + 1) == "role" => Decision::Write,
                // SET STATEMENT without its FOR <statement>: not a setting.
                "statement" if mysql => return None,
                v if v.starts_with('@') && !v.starts_with("@@") => Decision::Pin("user variable"),
                _ => Decision::Set,
            })
        }
        "reset" if dialect == Dialect::Postgres => Some(Decision::Set),
        "prepare" if word(1) != "transaction" => Some(Decision::Pin("SQL PREPARE")),
        "lock" if word(1) == "tables" || word(1) == "table" && dialect == Dialect::MySql => {
            Some(Decision::Pin("LOCK TABLES"))
        }
        "create" if matches!(word(1), "temporary" | "temp") => {
            Some(Decision::Pin("temporary table"))
        }
        "start" if word(1) == "transaction" => Some(Decision::Begin {
            read_only: lower.contains("read only") && !lower.contains("serializable"),
        }),
        _ => None,
    }
}

impl From<Decision> for Classified {
    fn from(decision: Decision) -> Classified {
        Classified {
            decision,
            effects: Effects::default(),
            functions: None,
            unproven: None,
            may_commit: false,
            key: 0,
            comments: false,
            identity: Default::default(),
            cache: crate::cache_facts::CacheFacts::of_decision(decision),
        }
    }
}

/// Decisions of statements that cannot touch the session (the common case,
/// whose effects are not looked for).
fn is_plain(d: Decision) -> bool {
    matches!(
        d,
        Decision::Read | Decision::Write | Decision::Primary | Decision::Unknown
    )
}

/// `decision` with the statement's hint applied.
fn with_hint(sql: &str, decision: Decision) -> Decision {
    match (hint(sql), decision) {
        (Some(Hint::Primary), Decision::Read | Decision::Unknown) => Decision::Primary,
        (Some(Hint::Primary), Decision::Begin { read_only: true }) => {
            Decision::Begin { read_only: false }
        }
        // The replica hint lifts only the "read on the primary" rule: a
        // write, a transaction or session state never goes to a replica.
        (Some(Hint::Replica), Decision::Primary) if !locks_rows(sql) => Decision::Read,
        (_, d) => d,
    }
}

/// Row-locking clauses, which no hint moves off the primary.
fn locks_rows(sql: &str) -> bool {
    let lower = sql.to_ascii_lowercase();
    let words: Vec<&str> = lower.split_whitespace().collect();
    words
        .windows(2)
        .any(|w| w[0] == "for" && matches!(w[1], "update" | "share" | "no" | "key"))
        || lower.contains("lock in share mode")
}

/// Statements whose decision can depend on a literal are not cached:
/// `SET autocommit = 0` and `= 1` differ.
fn cacheable(sql: &[u8]) -> bool {
    let start = sql.iter().position(|c| !c.is_ascii_whitespace());
    let t = start.map_or(&[][..], |s| &sql[s..]);
    let head = &t[..t.len().min(4)];
    !head.eq_ignore_ascii_case(b"set ") && !head.eq_ignore_ascii_case(b"set\t")
}

/// The text of `b` (`utf8` when the caller had it; else as
/// `encoding::statement_text` reads it).
fn text_of<'a>(b: &'a [u8], utf8: Option<&'a str>) -> std::borrow::Cow<'a, str> {
    utf8.map_or_else(
        || crate::encoding::statement_text(b),
        std::borrow::Cow::Borrowed,
    )
}

/// A unit parsed from text that was not UTF-8: a setting it would track
/// pins instead (its value is not the text the client sent).
fn not_utf8(mut unit: Classified) -> Classified {
    if unit.effects.carry_text() {
        let pinned = unit.effects.iter().map(|e| match e {
            Effect::Set { .. } | Effect::SetParam { .. } => {
                Effect::Pin("a setting whose text is not UTF-8")
            }
            e => e.clone(),
        });
        unit.effects = Effects::new(pinned.collect());
    }
    unit
}

/// MySQL runs the text of `/*! ... */` and `/*M! ... */` comments: parse it.
fn open_executable_comments(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(at) = rest.find("/*") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let body = after.strip_prefix('!').or_else(|| after.strip_prefix("M!"));
        match body {
            Some(body) => {
                let body = body.trim_start_matches(|c: char| c.is_ascii_digit());
                match body.find("*/") {
                    Some(end) => {
                        out.push(' ');
                        out.push_str(&body[..end]);
                        out.push(' ');
                        rest = &body[end + 2..];
                    }
                    None => {
                        out.push_str(body);
                        rest = "";
                    }
                }
            }
            None => {
                out.push_str("/*");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod leaks;
#[cfg(test)]
mod tests;
