//! `relation_catalog`: what the server says of the relations a cached read
//! names or a write touches, which the statement text cannot show (issue
//! 46). Per database, every relation by its unqualified lower-case name
//! ([`Relations`]): whether reads of it may be kept by the result cache
//! (an ordinary, permanent table that is no partition, no inheritance
//! parent or child, outside the system schemas: not a view, materialized
//! view, sequence or foreign table), and whether a write to it may change
//! more than itself (a user trigger, a rule, a foreign key referencing it
//! with a cascading action, a partition or inheritance tree): such a write
//! invalidates the whole database. A name in several schemas is combined
//! conservatively (kept only if every one may be, wide if any is).
//!
//! Mirrors `function_catalog`: read in one query on the primary by the
//! protocol context ([`crate::ProtocolContext::read_relations`]) in the
//! background, only when the cluster has a cache; kept for
//! `function_catalog_ttl` (a stale answer still used while it is read
//! again); forgotten on DDL seen through Fulcrum (a lookup in flight then
//! is discarded); a failed lookup asked again after [`RETRY_AFTER`]. The
//! data path never waits: a database not known yet keeps nothing and
//! invalidates itself whole on every write, and is asked for; a login asks
//! for its database and waits up to `function_catalog_wait`.
//!
//! Row-level security: tables with `relrowsecurity` stay keepable, because
//! the cache key holds the user and every setting the client has (policies
//! depending on anything else, such as a setting changed inside a function,
//! are outside what the cache can see: leave such tables out of `auto`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::by_database::ByDatabase;
pub use crate::by_database::{start_lookups, Wanted, RETRY_AFTER};

/// What the server says of one relation name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relation {
    /// Reads of it may be kept (an ordinary permanent table, alone).
    pub keepable: bool,
    /// A write to it may change other relations too.
    pub wide: bool,
}

impl Relation {
    /// What two relations of one name (in different schemas) make together.
    pub fn and(self, other: Relation) -> Relation {
        Relation {
            keepable: self.keepable && other.keepable,
            wide: self.wide || other.wide,
        }
    }
}

/// The relations of one database, by unqualified lower-case name, and
/// the database's default transaction isolation as far as the result
/// cache's `in_transactions` needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Relations {
    by_name: HashMap<Arc<str>, Relation>,
    /// A transaction that names no isolation level runs READ COMMITTED
    /// (or READ UNCOMMITTED) for every user of the database: the server's
    /// default says so and no per-database or per-role setting says
    /// otherwise. False when not shown (default-deny).
    pub read_committed: bool,
}

/// The last part of `name` (`schema.table` to `table`), lower case.
fn key(name: &str) -> String {
    name.rsplit('.').next().unwrap_or(name).to_lowercase()
}

impl Relations {
    pub fn new() -> Relations {
        Relations::default()
    }

    /// Adds the relation `name` (as the server spells it): one already
    /// known by that name is combined with it conservatively.
    pub fn add(&mut self, name: &str, relation: Relation) {
        let name = key(name);
        match self.by_name.get_mut(name.as_str()) {
            Some(known) => *known = known.and(relation),
            None => {
                self.by_name.insert(name.into(), relation);
            }
        }
    }

    /// What is known of `name` (qualified or not; any case).
    pub fn get(&self, name: &str) -> Option<Relation> {
        self.by_name.get(key(name).as_str()).copied()
    }

    /// Whether reads of every name may be kept (an unknown name: no).
    pub fn keepable(&self, names: &[Arc<str>]) -> bool {
        names
            .iter()
            .all(|n| self.get(n).is_some_and(|r| r.keepable))
    }

    /// Whether a write to any name may change more than the names (an
    /// unknown name: yes).
    pub fn wide_writes(&self, names: &[Arc<str>]) -> bool {
        names.iter().any(|n| self.get(n).is_none_or(|r| r.wide))
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

/// The relation catalog: per database, its relations (the lookups, TTL,
/// back-off and DDL generation are [`ByDatabase`]'s).
pub type RelationCatalog = ByDatabase<Relations>;

impl ByDatabase<Relations> {
    /// A relation catalog keeping each database's answer for `ttl`.
    pub fn new(ttl: Duration) -> RelationCatalog {
        ByDatabase::named("relation catalog", ttl)
    }

    /// Whether the result cache may keep a read of `names` on `database`
    /// (of `user`, with its protocol `options`): only once the database's
    /// relations are known and every name is an ordinary table. Unknown or
    /// stale: asked for (a stale answer is still used).
    pub fn keepable(
        &self,
        user: &Arc<str>,
        options: (u32, u8),
        database: &str,
        names: &[Arc<str>],
    ) -> bool {
        self.answer(user, options, database, |r| r.keepable(names))
            .unwrap_or(false)
    }

    /// Whether a write to `names` on `database` must invalidate the whole
    /// database: a name with triggers, rules, cascading foreign keys onto
    /// it, partitions or inheritance, an unknown name, or a database not
    /// known yet (asked for then).
    pub fn wide_writes(
        &self,
        user: &Arc<str>,
        options: (u32, u8),
        database: &str,
        names: &[Arc<str>],
    ) -> bool {
        self.answer(user, options, database, |r| r.wide_writes(names))
            .unwrap_or(true)
    }

    /// Whether a transaction on `database` that names no isolation level
    /// runs READ COMMITTED (`Relations::read_committed`); false while not
    /// known (asked for then).
    pub fn read_committed(&self, user: &Arc<str>, options: (u32, u8), database: &str) -> bool {
        self.answer(user, options, database, |r| r.read_committed)
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Arc<str> {
        s.into()
    }

    const TABLE: Relation = Relation {
        keepable: true,
        wide: false,
    };
    const VIEW: Relation = Relation {
        keepable: false,
        wide: false,
    };
    const TRIGGERED: Relation = Relation {
        keepable: true,
        wide: true,
    };

    fn app() -> Relations {
        let mut r = Relations::new();
        r.add("accounts", TABLE);
        r.add("balances", VIEW);
        r.add("orders", TRIGGERED);
        r
    }

    #[test]
    fn names_are_unqualified_and_combined_conservatively() {
        let mut r = app();
        assert!(r.keepable(&[n("accounts"), n("public.accounts")]));
        assert!(r.keepable(&[n("App.ACCOUNTS")]), "any case, any schema");
        assert!(!r.keepable(&[n("accounts"), n("balances")]), "a view");
        assert!(!r.keepable(&[n("missing")]), "unknown: not kept");
        assert!(r.keepable(&[]), "nothing to refuse");
        assert!(!r.wide_writes(&[n("accounts")]));
        assert!(r.wide_writes(&[n("accounts"), n("orders")]), "a trigger");
        assert!(r.wide_writes(&[n("missing")]), "unknown: the database");
        r.add("audit.accounts", VIEW);
        assert!(!r.keepable(&[n("accounts")]), "a view of that name too");
        r.add("other.accounts", TRIGGERED);
        assert!(r.wide_writes(&[n("accounts")]), "wide in one schema");
        r.add("\"odd.balances\"", TABLE);
        assert_eq!(r.get("balances"), Some(VIEW), "a dotted name combines");
    }

    #[test]
    fn nothing_is_kept_and_writes_are_wide_until_the_database_is_known() {
        let c = RelationCatalog::new(Duration::from_secs(60));
        let (u, db) = (n("app"), n("app"));
        assert!(!c.keepable(&u, (0, 0), &db, &[n("accounts")]));
        assert!(c.wide_writes(&u, (0, 0), &db, &[n("accounts")]));
        let wanted = c.wanted();
        assert_eq!(wanted.len(), 1, "asked once: {wanted:?}");
        let generation = c.generation();
        c.settle("main", wanted[0].clone(), Some(app()), generation);
        assert!(c.keepable(&u, (0, 0), &db, &[n("accounts")]));
        assert!(!c.wide_writes(&u, (0, 0), &db, &[n("accounts")]));
        assert!(c.wide_writes(&u, (0, 0), &db, &[n("orders")]));
        assert!(c.wanted().is_empty(), "known and fresh");
        assert!(!c.keepable(&u, (0, 0), &n("other"), &[n("accounts")]));
        assert_eq!(c.wanted().len(), 1, "per database");
    }

    #[test]
    fn ddl_forgets_and_discards_a_lookup_it_overtook() {
        let c = RelationCatalog::new(Duration::from_secs(60));
        let (u, db) = (n("app"), n("app"));
        c.want(&u, (0, 0), &db);
        let w = c.wanted().remove(0);
        let generation = c.generation();
        c.forget();
        c.settle("main", w, Some(app()), generation);
        assert!(!c.knows(&db), "read before the DDL: not kept");
        assert!(!c.keepable(&u, (0, 0), &db, &[n("accounts")]));
        let w = c.wanted().remove(0);
        c.settle("main", w, Some(app()), c.generation());
        assert!(c.keepable(&u, (0, 0), &db, &[n("accounts")]));
        c.forget();
        assert!(!c.keepable(&u, (0, 0), &db, &[n("accounts")]));
        assert!(c.wide_writes(&u, (0, 0), &db, &[n("accounts")]));
    }

    #[test]
    fn failures_back_off_and_stale_answers_are_used_while_refreshed() {
        let c = RelationCatalog::new(Duration::ZERO);
        let (u, db) = (n("app"), n("app"));
        c.want(&u, (0, 0), &db);
        let w = c.wanted().remove(0);
        c.settle("main", w, None, c.generation());
        assert!(!c.keepable(&u, (0, 0), &db, &[n("accounts")]));
        assert!(
            c.wanted().is_empty(),
            "not asked again right after a failure"
        );
        c.failure_expired(&db);
        assert!(!c.keepable(&u, (0, 0), &db, &[n("accounts")]));
        let w = c.wanted().remove(0);
        c.settle("main", w, Some(app()), c.generation());
        assert!(c.keepable(&u, (0, 0), &db, &[n("accounts")]), "stale, used");
        assert_eq!(c.wanted().len(), 1, "and refreshed");
    }

    #[test]
    fn a_failure_as_the_health_user_holds_nothing_back() {
        let c = RelationCatalog::new(Duration::from_secs(60));
        let db = n("app");
        c.want(&n(""), (0, 0), &db);
        let w = c.wanted().remove(0);
        c.settle("main", w, None, c.generation());
        c.want(&n("app"), (0, 0), &db);
        assert_eq!(c.wanted().len(), 1, "a client's login asks at once");
    }
}
