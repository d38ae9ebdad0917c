//! `function_catalog`: what the server says of the functions a read calls
//! that no list decides. Per database (schema on MySQL), the user-defined
//! functions and whether each may write (PostgreSQL `pg_proc.provolatile`,
//! MariaDB `information_schema.ROUTINES`), read in one query, cached per
//! cluster for `function_catalog_ttl` and forgotten on DDL seen through
//! Fulcrum. A read calling one that writes goes to the primary, and so does
//! every such read of a database not read yet; a name that is not a user
//! function is a built-in (a read), so built-ins cost no lookup. The
//! lookups run in the background (the protocol context drains
//! [`FunctionCatalog::wanted`] with its own query). Every configured
//! database is asked for at start and when the primary changes, and a
//! login to a database not read yet waits for its lookup up to
//! `function_catalog_wait` ([`FunctionCatalog::known_by`]), so even the
//! first read after a start is routed by the catalog; a read itself never
//! waits. Pgpool-II 4 reads `provolatile` likewise when no list is set.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::by_database::ByDatabase;
pub use crate::by_database::{start_lookups, Wanted, RETRY_AFTER};

/// What the server says a function does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FunctionKind {
    /// Safe on a replica (PostgreSQL: stable or immutable; MariaDB: NO SQL,
    /// READS SQL DATA, deterministic).
    Read,
    /// May write (PostgreSQL: volatile; MariaDB: MODIFIES SQL DATA, or
    /// CONTAINS SQL and not deterministic, the default).
    Write,
    /// A read whose result depends on its arguments alone (PostgreSQL:
    /// immutable in every overload): the result cache may keep reads
    /// calling it.
    Immutable,
}

/// The user-defined functions of one database (or schema), by name.
pub type Functions = HashMap<Arc<str>, FunctionKind>;

/// The function catalog: per database, its user-defined functions (the
/// lookups, TTL and back-off are [`ByDatabase`]'s).
pub type FunctionCatalog = ByDatabase<Functions>;

impl ByDatabase<Functions> {
    /// A function catalog keeping each database's answer for `ttl`.
    pub fn new(ttl: Duration) -> FunctionCatalog {
        ByDatabase::named("function catalog", ttl)
    }

    /// Whether a read of `user` on `database` calling `names` may go to a
    /// replica. Once the database's functions are known: unless one of the
    /// names is a user function that may write (a name that is not a user
    /// function is a built-in, or does not exist: a read). Not known yet:
    /// no, and they are asked for; stale: the old answer, and asked again.
    pub fn replica_ok(
        &self,
        user: &Arc<str>,
        options: (u32, u8),
        database: &str,
        names: &[Arc<str>],
    ) -> bool {
        self.known_all(user, options, database, names, |functions, n| {
            functions.get(n) != Some(&FunctionKind::Write)
        })
    }

    /// Whether every name in `names` is a user function of `database` the
    /// server says is immutable (the result cache keeps reads calling only
    /// such). Not known yet: no, and asked for.
    pub fn all_immutable(
        &self,
        user: &Arc<str>,
        options: (u32, u8),
        database: &str,
        names: &[Arc<str>],
    ) -> bool {
        self.known_all(user, options, database, names, |functions, n| {
            functions.get(n) == Some(&FunctionKind::Immutable)
        })
    }

    /// Whether every name in `names` is a built-in of `database` (no user
    /// function or procedure has it). Not known yet: no, and asked for.
    pub fn all_builtin(
        &self,
        user: &Arc<str>,
        options: (u32, u8),
        database: &str,
        names: &[Arc<str>],
    ) -> bool {
        self.known_all(user, options, database, names, |functions, n| {
            !functions.contains_key(n)
        })
    }

    /// Whether `test` holds for every name, by `database`'s functions as
    /// read: false while they are not known; asks for them when unknown
    /// or stale (a stale answer is still used).
    fn known_all(
        &self,
        user: &Arc<str>,
        options: (u32, u8),
        database: &str,
        names: &[Arc<str>],
        test: impl Fn(&Functions, &Arc<str>) -> bool,
    ) -> bool {
        self.answer(user, options, database, |functions| {
            names.iter().all(|n| test(functions, n))
        })
        .unwrap_or(false)
    }

    /// The decision for `unit`, a unit of `user` (with its protocol
    /// `options`) on `database`: a read calling functions no list decides
    /// becomes a primary read unless the catalog knows them all to be reads.
    pub fn decide(
        &self,
        unit: &fulcrum_sql::Classified,
        user: &Arc<str>,
        options: (u32, u8),
        database: &str,
    ) -> fulcrum_sql::Decision {
        use fulcrum_sql::Decision;
        match &unit.functions {
            Some(names)
                if unit.decision == Decision::Read
                    && !self.replica_ok(user, options, database, names) =>
            {
                Decision::Primary
            }
            _ => unit.decision,
        }
    }
}

/// A name safe to put in a single-quoted SQL literal (function names the
/// parser gave: identifiers, possibly quoted ones).
pub fn quote_literal(name: &str) -> String {
    format!("'{}'", name.replace('\'', "''").replace('\\', "\\\\"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Arc<str> {
        s.into()
    }

    #[test]
    fn reads_go_to_the_primary_until_the_databases_functions_are_known() {
        let c = FunctionCatalog::new(Duration::from_secs(60));
        let (u, db) = (n("app"), n("app"));
        assert!(
            !c.replica_ok(&u, (0, 0), &db, &[n("bump")]),
            "not known yet"
        );
        assert!(!c.replica_ok(&u, (0, 0), &db, &[n("price")]));
        let wanted = c.wanted();
        assert_eq!(wanted.len(), 1, "the database is asked once: {wanted:?}");
        assert_eq!(wanted[0].database, db);
        c.learned(
            db.clone(),
            Functions::from([
                (n("bump"), FunctionKind::Write),
                (n("price"), FunctionKind::Read),
            ]),
        );
        assert!(!c.replica_ok(&u, (0, 0), &db, &[n("bump")]), "it writes");
        assert!(c.replica_ok(&u, (0, 0), &db, &[n("price")]));
        assert!(
            c.replica_ok(&u, (0, 0), &db, &[n("json_detailed")]),
            "not a user function: a built-in"
        );
        assert!(!c.replica_ok(&u, (0, 0), &db, &[n("price"), n("bump")]));
        assert!(c.wanted().is_empty(), "known: nothing to ask");
        assert!(
            !c.replica_ok(&u, (0, 0), &n("other"), &[n("price")]),
            "per database"
        );
    }

    #[test]
    fn stale_answers_are_kept_while_asked_again_and_ddl_forgets() {
        let c = FunctionCatalog::new(Duration::ZERO);
        let (u, db) = (n("app"), n("app"));
        c.learned(
            db.clone(),
            Functions::from([(n("price"), FunctionKind::Read)]),
        );
        assert!(
            c.replica_ok(&u, (0, 0), &db, &[n("price")]),
            "stale but read"
        );
        assert_eq!(c.wanted().len(), 1, "refreshed");
        c.forget();
        assert!(!c.replica_ok(&u, (0, 0), &db, &[n("price")]));
        c.failed(&db);
        assert!(!c.replica_ok(&u, (0, 0), &db, &[n("price")]));
        assert!(
            c.wanted().is_empty(),
            "not asked again right after a failure"
        );
        c.failure_expired(&db);
        assert!(!c.replica_ok(&u, (0, 0), &db, &[n("price")]));
        assert_eq!(c.wanted().len(), 1, "asked again after RETRY_AFTER");
    }

    #[test]
    fn a_lookup_ddl_overtook_is_not_kept() {
        let c = FunctionCatalog::new(Duration::from_secs(60));
        let (u, db) = (n("app"), n("app"));
        assert!(!c.replica_ok(&u, (0, 0), &db, &[n("price")]));
        let w = c.wanted().remove(0);
        let generation = c.generation();
        c.forget(); // CREATE OR REPLACE FUNCTION price ... VOLATILE, meanwhile
        let before = Functions::from([(n("price"), FunctionKind::Read)]);
        c.settle("main", w, Some(before), generation);
        assert!(!c.knows(&db), "read before the DDL: not kept");
        assert!(!c.replica_ok(&u, (0, 0), &db, &[n("price")]));
        assert_eq!(c.wanted().len(), 1, "asked again");
    }

    #[test]
    fn literals_are_quoted() {
        assert_eq!(quote_literal("f"), "'f'");
        assert_eq!(quote_literal("it's"), "'it''s'");
    }
}
