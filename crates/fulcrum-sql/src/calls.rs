//! The functions a read calls that no list decides (not built in, not in
//! `write_functions` / `read_only_functions`, not a common built-in read):
//! the cluster's function catalog looks them up on the server
//! (`function_catalog`), and until it knows them the read goes to the
//! primary. A second walk over the parsed statements, only for reads.
//!
//! The same walk over any PostgreSQL statement lists the calls not known to
//! leave no session state (`unproven_calls`): a user function may call
//! `set_config`, make temporary tables or PREPARE, so a call of one pins its
//! client unless `session_free_functions` lists it (the cluster decides,
//! with the catalog telling built-ins from user functions).

use std::ops::ControlFlow;
use std::sync::Arc;

use sqlparser::ast::{Expr, ObjectName, Statement, TableFactor, Visit, Visitor};

use crate::dialect::Dialect;
use crate::rules::{called_in_from, function_name, FunctionRules};

/// Built-in functions common in reads, known to be safe on a replica: not
/// looked up (PostgreSQL's catalog would call some volatile, e.g. random,
/// yet they write nothing). A table of names, one list per dialect.
fn builtin_reads(dialect: Dialect) -> &'static [&'static str] {
    match dialect {
        Dialect::Postgres => POSTGRES_BUILTIN_READS,
        Dialect::MySql => MYSQL_BUILTIN_READS,
    }
}

/// [`builtin_reads`] of PostgreSQL.
const POSTGRES_BUILTIN_READS: &[&str] = &[
    "count",
    "sum",
    "avg",
    "min",
    "max",
    "coalesce",
    "nullif",
    "greatest",
    "least",
    "lower",
    "upper",
    "length",
    "char_length",
    "substr",
    "substring",
    "trim",
    "btrim",
    "ltrim",
    "rtrim",
    "concat",
    "concat_ws",
    "replace",
    "position",
    "strpos",
    "left",
    "right",
    "lpad",
    "rpad",
    "abs",
    "round",
    "floor",
    "ceil",
    "ceiling",
    "mod",
    "power",
    "sqrt",
    "random",
    "now",
    "clock_timestamp",
    "statement_timestamp",
    "date_trunc",
    "date_part",
    "extract",
    "to_char",
    "to_date",
    "to_timestamp",
    "to_number",
    "age",
    "array_agg",
    "string_agg",
    "json_agg",
    "jsonb_agg",
    "json_build_object",
    "jsonb_build_object",
    "row_to_json",
    "to_json",
    "to_jsonb",
    "array_length",
    "unnest",
    "generate_series",
    "row_number",
    "rank",
    "dense_rank",
    "lag",
    "lead",
    "first_value",
    "last_value",
    "ntile",
    "md5",
    "encode",
    "decode",
    "format",
    "version",
    "current_database",
    "current_schema",
    "current_user",
    "session_user",
    "current_setting",
    "inet_server_port",
    "inet_server_addr",
    "pg_backend_pid",
    "pg_sleep",
    "pg_is_in_recovery",
    "pg_last_wal_replay_lsn",
    "pg_size_pretty",
    "pg_relation_size",
    "pg_total_relation_size",
    "pg_database_size",
    "has_table_privilege",
    "bool_and",
    "bool_or",
    "every",
    "exists",
    "cast",
];

/// [`builtin_reads`] of MySQL and MariaDB.
const MYSQL_BUILTIN_READS: &[&str] = &[
    "count",
    "sum",
    "avg",
    "min",
    "max",
    "coalesce",
    "ifnull",
    "nullif",
    "if",
    "greatest",
    "least",
    "lower",
    "upper",
    "lcase",
    "ucase",
    "length",
    "char_length",
    "substr",
    "substring",
    "trim",
    "ltrim",
    "rtrim",
    "concat",
    "concat_ws",
    "replace",
    "left",
    "right",
    "lpad",
    "rpad",
    "abs",
    "round",
    "floor",
    "ceil",
    "ceiling",
    "mod",
    "pow",
    "power",
    "sqrt",
    "rand",
    "now",
    "sysdate",
    "curdate",
    "curtime",
    "current_timestamp",
    "date",
    "date_format",
    "date_add",
    "date_sub",
    "datediff",
    "unix_timestamp",
    "from_unixtime",
    "year",
    "month",
    "day",
    "hour",
    "minute",
    "second",
    "version",
    "database",
    "schema",
    "user",
    "current_user",
    "connection_id",
    "sleep",
    "group_concat",
    "md5",
    "sha1",
    "sha2",
    "uuid",
    "json_object",
    "json_array",
    "json_extract",
    "cast",
    "convert",
    "field",
    "find_in_set",
    "format",
    "hex",
    "unhex",
    "row_number",
    "rank",
    "dense_rank",
    "lag",
    "lead",
    "exists",
];

/// The SQL-standard value functions the grammar writes as keywords
/// (`CURRENT_TIMESTAMP`, `CURRENT_USER`, ...): the parser gives them as a
/// call of an unquoted one-part name.
const SQL_VALUE_FUNCTIONS: [&str; 9] = [
    "current_timestamp",
    "current_time",
    "current_date",
    "localtime",
    "localtimestamp",
    "current_catalog",
    "current_user",
    "session_user",
    "user",
];

/// Whether `f` is a keyword value function (`CURRENT_TIMESTAMP`,
/// `CURRENT_DATE(…)`'s precision form, PostgreSQL's `CURRENT_USER`), which
/// the server's grammar resolves to its built-in whatever functions a user
/// made: a read that needs no catalog and leaves no session state. Only
/// the keyword's own form counts: unquoted, one part, and without
/// parentheses unless it takes a precision (`"current_user"()` or
/// `public.localtime()` name a user's function).
fn sql_value_function(f: &sqlparser::ast::Function) -> bool {
    use sqlparser::ast::FunctionArguments;
    let [part] = &f.name.0[..] else {
        return false;
    };
    let Some(ident) = part.as_ident() else {
        return false;
    };
    if ident.quote_style.is_some() {
        return false;
    }
    let name = ident.value.to_ascii_lowercase();
    let takes_precision = matches!(
        name.as_str(),
        "current_timestamp" | "current_time" | "localtime" | "localtimestamp"
    );
    SQL_VALUE_FUNCTIONS.contains(&name.as_str())
        && (matches!(f.args, FunctionArguments::None) || takes_precision)
}

struct Calls<'a> {
    dialect: Dialect,
    rules: &'a FunctionRules,
    /// Listing the calls not proven free of session state (not the
    /// calls no routing list decides).
    session: bool,
    found: Vec<Arc<str>>,
}

/// A schema-qualified name that cannot be a built-in: PostgreSQL's
/// built-ins live in `pg_catalog`, so `public.lower(1)` or `s.nextval(1)`
/// is a user's function whatever its last part says; MySQL's built-ins
/// are never qualified (`app.lower(1)` is a stored function).
fn qualified_user(name: &ObjectName, dialect: Dialect) -> bool {
    let [.., schema, _] = &name.0[..] else {
        return false;
    };
    if dialect == Dialect::MySql {
        return true;
    }
    !schema.as_ident().is_some_and(|s| {
        if s.quote_style.is_some() {
            s.value == "pg_catalog"
        } else {
            s.value.eq_ignore_ascii_case("pg_catalog")
        }
    })
}

impl Calls<'_> {
    fn call(&mut self, name: &ObjectName) {
        let user = qualified_user(name, self.dialect);
        let name = function_name(name);
        let decided = if self.session {
            self.rules.session_free.contains(&name)
        } else {
            self.rules.read_only.contains(&name)
        };
        // The built-in lists name built-ins whose session effects the
        // classifier knows (set_config, nextval, advisory locks).
        let builtin = !user
            && ((self.rules.primary.contains(&name) && !self.rules.written.contains(&name))
                || self.rules.pin.contains(&name)
                || builtin_reads(self.dialect).contains(&name.as_str()));
        if name.is_empty() || decided || builtin || self.found.iter().any(|f| **f == *name) {
            return;
        }
        self.found.push(name.into());
    }
}

impl Visitor for Calls<'_> {
    type Break = ();

    fn pre_visit_table_factor(&mut self, t: &TableFactor) -> ControlFlow<()> {
        if let Some(name) = called_in_from(t) {
            self.call(name);
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
        if let Expr::Function(f) = e {
            if !sql_value_function(f) {
                self.call(&f.name);
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_statement(&mut self, s: &Statement) -> ControlFlow<()> {
        if let Statement::Call(f) = s {
            self.call(&f.name);
        }
        ControlFlow::Continue(())
    }
}

/// The functions `stmts` call that no list decides, lower case, once each.
pub(crate) fn undecided_calls(
    stmts: &[Statement],
    dialect: Dialect,
    rules: &FunctionRules,
) -> Vec<Arc<str>> {
    let mut v = Calls {
        dialect,
        rules,
        session: false,
        found: Vec::new(),
    };
    for s in stmts {
        let _ = s.visit(&mut v);
    }
    v.found
}

/// The functions and procedures `stmts` call (any statement, CALL too) not
/// known to leave no session state: not a built-in the lists know, not in
/// `session_free_functions`. Lower case, once each.
pub(crate) fn unproven_calls(
    stmts: &[Statement],
    dialect: Dialect,
    rules: &FunctionRules,
) -> Vec<Arc<str>> {
    let mut v = Calls {
        dialect,
        rules,
        session: true,
        found: Vec::new(),
    };
    for s in stmts {
        let _ = s.visit(&mut v);
    }
    v.found
}

#[cfg(test)]
mod tests {
    use crate::{Classifier, ClassifierConfig, Decision, Dialect};

    fn unproven(c: &Classifier, sql: &str) -> Vec<String> {
        c.classify_unit(sql)
            .unproven
            .map(|f| f.iter().map(|s| s.to_string()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn calls_not_known_to_leave_no_session_state_are_listed_in_any_statement() {
        let pg = Classifier::new(
            Dialect::Postgres,
            &ClassifierConfig {
                write_functions: vec!["audit".into()],
                read_only_functions: vec!["pure".into()],
                session_free_functions: vec!["Stateless".into()],
                ..Default::default()
            },
        );
        assert_eq!(unproven(&pg, "SELECT pure(1), lower('x')"), ["pure"]);
        assert_eq!(unproven(&pg, "INSERT INTO t VALUES (audit())"), ["audit"]);
        assert_eq!(unproven(&pg, "CALL refresh(1)"), ["refresh"]);
        assert_eq!(
            pg.classify("CALL refresh(1)"),
            Decision::Pin("CALL of a procedure")
        );
        assert_eq!(
            pg.classify("CALL stateless()"),
            Decision::Write,
            "declared free"
        );
        assert_eq!(unproven(&pg, "UPDATE t SET a = f(b), c = g()"), ["f", "g"]);
        for sql in [
            "SELECT stateless(1)",
            "CALL stateless()",
            "SELECT nextval('s'), set_config('a', 'b', true), now()",
            "SELECT pg_advisory_lock(1)",
            "SELECT 1",
        ] {
            assert!(unproven(&pg, sql).is_empty(), "{sql}");
        }
    }

    #[test]
    fn keyword_value_functions_are_built_ins_and_a_users_namesake_is_not() {
        let pg = Classifier::new(Dialect::Postgres, &ClassifierConfig::default());
        for sql in [
            // pgbench TPC-B's history row.
            "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) \
             VALUES (1, 1, 1, 5, CURRENT_TIMESTAMP)",
            "SELECT current_date, localtime(3), current_timestamp(0), localtimestamp",
            "SELECT current_user, session_user, user, current_catalog",
        ] {
            assert!(unproven(&pg, sql).is_empty(), "{sql}");
            assert!(listed(&pg, sql).is_empty(), "{sql}");
        }
        assert_eq!(
            unproven(&pg, "SELECT \"current_timestamp\"()"),
            ["current_timestamp"],
            "a quoted name is a user's function"
        );
        assert_eq!(unproven(&pg, "SELECT public.localtime()"), ["localtime"]);
        assert_eq!(
            unproven(&pg, "SELECT current_date(1)"),
            ["current_date"],
            "no precision form: not the keyword"
        );
    }

    fn listed(c: &Classifier, sql: &str) -> Vec<String> {
        c.classify_unit(sql)
            .functions
            .map(|f| f.iter().map(|s| s.to_string()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn reads_list_the_functions_no_list_decides_once_each() {
        let pg = Classifier::new(
            Dialect::Postgres,
            &ClassifierConfig {
                write_functions: vec!["audit".into()],
                read_only_functions: vec!["pure".into()],
                ..Default::default()
            },
        );
        assert_eq!(
            listed(
                &pg,
                "SELECT bump(), bump(), lower('x'), public.price(1) FROM t"
            ),
            ["bump", "price"]
        );
        assert_eq!(listed(&pg, "SELECT * FROM my_srf(3)"), ["my_srf"]);
        assert_eq!(
            listed(&pg, "SELECT count(*) FROM t WHERE x = (SELECT g(1))"),
            ["g"]
        );
        assert!(
            listed(&pg, "SELECT nextval('s')").is_empty(),
            "a primary read"
        );
        assert!(
            listed(&pg, "INSERT INTO t SELECT f()").is_empty(),
            "a write"
        );
        assert!(
            listed(&pg, "SELECT pure(1), now()").is_empty(),
            "decided by lists"
        );
        assert_eq!(pg.classify("SELECT audit()"), Decision::Primary);
        assert_eq!(
            pg.classify("SELECT bump()"),
            Decision::Read,
            "the classifier alone: the catalog decides at routing"
        );
        assert!(listed(&pg, "CALL p()").is_empty(), "a write");
        let my = Classifier::new(Dialect::MySql, &ClassifierConfig::default());
        assert_eq!(
            listed(&my, "SELECT twice(2), NOW(), `Bump`() FROM items"),
            ["twice", "bump"]
        );
        assert!(listed(&my, "SELECT LAST_INSERT_ID()").is_empty());
    }
}
