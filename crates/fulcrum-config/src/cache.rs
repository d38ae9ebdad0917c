//! `[cluster.cache]` and its `[[cluster.cache.rule]]`s: whether a cluster
//! keeps read results, how much of them, for how long, per whom, and what
//! invalidates them (docs/routing.md, "Cache").

use std::time::Duration;

/// A cluster's result cache, as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct Cache {
    pub mode: CacheMode,
    /// Bytes of results and keys the cluster's entries hold, at most
    /// (`max_memory`); past it the least recently used go.
    pub max_memory: u64,
    /// The longest any entry is served (`ttl`).
    pub ttl: Duration,
    /// Larger results are not kept (`max_result`).
    pub max_result: u64,
    pub isolation: CacheIsolation,
    pub invalidation: CacheInvalidation,
    pub rules: Vec<CacheRule>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheMode {
    /// Nothing is cached (the default).
    Off,
    /// Only reads whose tables are all listed by one rule.
    Rules,
    /// Deterministic reads of digests seen often, besides the rules' reads.
    Auto,
}

/// Whose entries a read may be answered from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheIsolation {
    /// Each login user has its own entries (the default): what one user
    /// may read never answers another (grants, row-level security).
    User,
    /// One set of entries for every user.
    Shared,
}

/// What invalidates entries besides their TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheInvalidation {
    /// The primary's change stream (PostgreSQL logical decoding, the
    /// MariaDB binlog) and the writes that pass through Fulcrum (the
    /// default).
    Stream,
    /// Only the writes that pass through Fulcrum.
    Proxy,
}

/// `[[cluster.cache.rule]]`: reads whose tables are all listed are kept.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheRule {
    /// Table names as written (`schema.table` allowed), lower case.
    pub tables: Vec<String>,
    /// Below the cluster's `ttl` (the cluster's when not set).
    pub ttl: Option<Duration>,
    /// Reads inside transactions may be answered from (and fill) the cache
    /// too (`in_transactions`, default false).
    pub in_transactions: bool,
}

/// How one read is kept (`Cache::keeping`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keeping {
    /// How long its entry is served at most.
    pub ttl: Duration,
    /// Kept only from its key's second miss on (`mode = "auto"`).
    pub second_miss: bool,
    /// Its rule lets it be answered from (and fill) the cache inside a
    /// transaction too, where the isolation allows it.
    pub in_transactions: bool,
}

impl Default for Cache {
    fn default() -> Cache {
        Cache {
            mode: CacheMode::Off,
            max_memory: 256 << 20,
            ttl: Duration::from_secs(60),
            max_result: 1 << 20,
            isolation: CacheIsolation::User,
            invalidation: CacheInvalidation::Stream,
            rules: Vec::new(),
        }
    }
}

impl CacheMode {
    /// The words the file uses, as `Table::choice` takes them.
    pub const NAMES: &'static [(&'static str, CacheMode)] = &[
        ("off", CacheMode::Off),
        ("rules", CacheMode::Rules),
        ("auto", CacheMode::Auto),
    ];

    /// The word the file uses.
    pub fn name(self) -> &'static str {
        match self {
            CacheMode::Off => "off",
            CacheMode::Rules => "rules",
            CacheMode::Auto => "auto",
        }
    }
}

impl CacheIsolation {
    /// The words the file uses, as `Table::choice` takes them.
    pub const NAMES: &'static [(&'static str, CacheIsolation)] = &[
        ("user", CacheIsolation::User),
        ("shared", CacheIsolation::Shared),
    ];

    /// The word the file uses.
    pub fn name(self) -> &'static str {
        match self {
            CacheIsolation::User => "user",
            CacheIsolation::Shared => "shared",
        }
    }
}

impl CacheInvalidation {
    /// The words the file uses, as `Table::choice` takes them.
    pub const NAMES: &'static [(&'static str, CacheInvalidation)] = &[
        ("stream", CacheInvalidation::Stream),
        ("proxy", CacheInvalidation::Proxy),
    ];

    /// The word the file uses.
    pub fn name(self) -> &'static str {
        match self {
            CacheInvalidation::Stream => "stream",
            CacheInvalidation::Proxy => "proxy",
        }
    }
}

impl Cache {
    /// The cluster caches anything at all.
    pub fn enabled(&self) -> bool {
        self.mode != CacheMode::Off
    }

    /// The rule that lists every one of `tables` (each as the statement
    /// names it, lower case), if any. A rule's `schema.table` matches a
    /// statement's `schema.table` and its plain `table`; a rule's plain
    /// `table` matches `table` in any schema.
    pub fn rule_for<'a, I>(&self, tables: I) -> Option<&CacheRule>
    where
        I: IntoIterator<Item = &'a str> + Clone,
    {
        self.rules.iter().find(|rule| {
            let mut any = false;
            let all = tables.clone().into_iter().all(|t| {
                any = true;
                rule.tables.iter().any(|r| table_matches(r, t))
            });
            any && all
        })
    }

    /// How a read of `tables` (as the statement names them) is kept, if at
    /// all: for its rule's `ttl` (never above the cluster's), or, in `auto`
    /// mode with no rule, for the cluster's `ttl` from its key's second
    /// miss on (and never inside a transaction).
    pub fn keeping<'a, I>(&self, tables: I) -> Option<Keeping>
    where
        I: IntoIterator<Item = &'a str> + Clone,
    {
        match self.rule_for(tables) {
            Some(rule) => Some(Keeping {
                ttl: rule.ttl.unwrap_or(self.ttl).min(self.ttl),
                second_miss: false,
                in_transactions: rule.in_transactions,
            }),
            None if self.mode == CacheMode::Auto => Some(Keeping {
                ttl: self.ttl,
                second_miss: true,
                in_transactions: false,
            }),
            None => None,
        }
    }
}

/// Whether a rule's `listed` name covers `named`, a statement's.
fn table_matches(listed: &str, named: &str) -> bool {
    if listed == named {
        return true;
    }
    let last = |s: &str| s.rsplit('.').next().unwrap_or(s).to_string();
    match (listed.contains('.'), named.contains('.')) {
        // `public.t` listed, `t` named: the statement's `t` is found by the
        // search path; the rule is the operator's choice of what to keep,
        // and invalidation goes by the table's own name either way.
        (true, false) => last(listed) == named,
        (false, _) => listed == last(named),
        (true, true) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(tables: &[&str]) -> Cache {
        Cache {
            mode: CacheMode::Rules,
            rules: vec![CacheRule {
                tables: tables.iter().map(|t| t.to_string()).collect(),
                ttl: None,
                in_transactions: false,
            }],
            ..Cache::default()
        }
    }

    #[test]
    fn names_are_the_files_words() {
        for &(word, m) in CacheMode::NAMES {
            assert_eq!(m.name(), word);
        }
        for &(word, i) in CacheIsolation::NAMES {
            assert_eq!(i.name(), word);
        }
        for &(word, i) in CacheInvalidation::NAMES {
            assert_eq!(i.name(), word);
        }
    }

    #[test]
    fn a_rule_covers_reads_whose_tables_it_all_lists() {
        let c = with(&["a", "public.b"]);
        assert!(c.rule_for(["a"]).is_some());
        assert!(c.rule_for(["a", "b"]).is_some());
        assert!(c.rule_for(["x.a", "public.b"]).is_some());
        assert!(c.rule_for(["a", "c"]).is_none());
        let keeping = |ttl, second_miss| Keeping {
            ttl,
            second_miss,
            in_transactions: false,
        };
        assert_eq!(c.keeping(["a"]), Some(keeping(c.ttl, false)));
        assert_eq!(
            c.keeping(["c"]),
            None,
            "rules mode keeps only a rule's reads"
        );
        let auto = Cache {
            mode: CacheMode::Auto,
            ..c.clone()
        };
        assert_eq!(
            auto.keeping(["c"]),
            Some(keeping(c.ttl, true)),
            "auto: from the second miss"
        );
        assert!(c.rule_for(["other.b"]).is_none());
        assert!(
            c.rule_for(Vec::<&str>::new()).is_none(),
            "a read of no table is not a rule's"
        );
    }
}
