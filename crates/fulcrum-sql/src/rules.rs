//! The routing rules over sqlparser's AST: one function from a parsed statement
//! to a `Decision` (`classify_statement`, which hands each kind of statement
//! to a function of its own; settings are `settings.rs`'s). Reads are a
//! short whitelist; anything not recognised as a read, transaction control
//! or session state is a write (the primary).
//! Every rule is documented with an example in docs/routing.md.

use std::collections::HashSet;
use std::ops::ControlFlow;

use sqlparser::ast::{
    CopySource, CopyTarget, DiscardObject, Expr, FunctionArguments, ObjectName, Query, Select,
    SetExpr, Statement, TableFactor, TransactionAccessMode, TransactionMode, Visit, Visitor,
};

use crate::decision::Decision;
use crate::dialect::Dialect;
use crate::functions::PRIMARY_VARIABLES;

mod settings;

/// Function-name lists the rules consult (lower case, unqualified).
pub(crate) struct FunctionRules {
    pub primary: HashSet<String>,
    pub pin: HashSet<String>,
    pub read_only: HashSet<String>,
    /// `write_functions`: user functions among `primary`.
    pub written: HashSet<String>,
    /// `session_free_functions`: user functions and procedures declared to
    /// leave no session state.
    pub session_free: HashSet<String>,
}

/// A function's name as the lists hold it: its last part, unquoted, lower
/// case (`pg_catalog."NextVal"` is `nextval`).
pub(crate) fn function_name(name: &ObjectName) -> String {
    name.0
        .last()
        .map(|p| {
            p.to_string()
                .trim_matches('"')
                .trim_matches('`')
                .to_ascii_lowercase()
        })
        .unwrap_or_default()
}

/// The function a FROM item calls, if any: a set-returning function
/// (`SELECT * FROM nextval('s')`, `FROM my_srf(3)`).
pub(crate) fn called_in_from(t: &TableFactor) -> Option<&ObjectName> {
    match t {
        TableFactor::Function { name, .. } => Some(name),
        TableFactor::Table {
            name,
            args: Some(_),
            ..
        } => Some(name),
        _ => None,
    }
}

/// An EXPLAIN that runs its statement (ANALYZE, or the `analyze` option
/// not turned off); false for any other statement.
pub(crate) fn explain_runs(stmt: &Statement) -> bool {
    let Statement::Explain {
        analyze, options, ..
    } = stmt
    else {
        return false;
    };
    let analyze_option = options.as_ref().is_some_and(|opts| {
        opts.iter().any(|o| {
            o.name.value.eq_ignore_ascii_case("analyze")
                && o.arg.as_ref().is_none_or(|a| {
                    !matches!(
                        a.to_string().to_ascii_lowercase().as_str(),
                        "false" | "off" | "0"
                    )
                })
        })
    });
    *analyze || analyze_option
}

/// The decision for one parsed statement: reads, EXPLAIN and COPY by what
/// they run, transaction control, settings (`settings.rs`), and everything
/// else by [`pin_or_write`].
pub(crate) fn classify_statement(
    stmt: &Statement,
    dialect: Dialect,
    f: &FunctionRules,
) -> Decision {
    match stmt {
        Statement::Query(q) => query(q, f),
        Statement::Explain { statement, .. } => explain(stmt, statement, dialect, f),
        Statement::ExplainTable { .. }
        | Statement::ShowFunctions { .. }
        | Statement::ShowVariable { .. }
        | Statement::ShowStatus { .. }
        | Statement::ShowVariables { .. }
        | Statement::ShowCreate { .. }
        | Statement::ShowColumns { .. }
        | Statement::ShowCatalogs { .. }
        | Statement::ShowDatabases { .. }
        | Statement::ShowSchemas { .. }
        | Statement::ShowCharset(_)
        | Statement::ShowObjects(_)
        | Statement::ShowTables { .. }
        | Statement::ShowViews { .. }
        | Statement::ShowCollation { .. } => Decision::Read,
        Statement::ShowProcessList { .. } => Decision::Primary,
        Statement::Copy {
            to: true,
            source,
            target,
            ..
        } => copy_to(source, target, f),
        Statement::StartTransaction { .. }
        | Statement::Commit { .. }
        | Statement::Rollback { .. }
        | Statement::Savepoint { .. }
        | Statement::ReleaseSavepoint { .. } => transaction_control(stmt, dialect),
        Statement::Set(set) => settings::set(set, dialect),
        Statement::Use(_) => Decision::Set,
        Statement::Reset(r) => settings::reset(r, dialect),
        _ => pin_or_write(stmt, f),
    }
}

/// EXPLAIN ANALYZE runs the statement: it goes where the statement would.
/// Plain EXPLAIN only plans: a read.
fn explain(
    stmt: &Statement,
    statement: &Statement,
    dialect: Dialect,
    f: &FunctionRules,
) -> Decision {
    if explain_runs(stmt) {
        classify_statement(statement, dialect, f)
    } else if dialect == Dialect::MySql
        && !matches!(statement, Statement::Query(_))
        && classify_statement(statement, dialect, f).needs_primary()
    {
        // MariaDB refuses EXPLAIN of a write on a read-only server
        // (1290), though it only plans it: the primary.
        Decision::Primary
    } else {
        Decision::Read
    }
}

/// COPY ... TO STDOUT reads; COPY ... TO a server file or program writes on
/// the server: primary. (COPY ... FROM writes: [`pin_or_write`].)
fn copy_to(source: &CopySource, target: &CopyTarget, f: &FunctionRules) -> Decision {
    let read = match source {
        CopySource::Query(q) => query(q, f),
        CopySource::Table { .. } => Decision::Read,
    };
    match target {
        CopyTarget::Stdout => read,
        _ => read.combine(Decision::Primary),
    }
}

/// BEGIN, COMMIT, ROLLBACK and savepoints.
fn transaction_control(stmt: &Statement, dialect: Dialect) -> Decision {
    match stmt {
        Statement::StartTransaction { modes, .. } => Decision::Begin {
            read_only: read_only(modes) && !serializable(modes),
        },
        // MySQL's AND CHAIN ends the transaction and at once opens the next
        // on the same server connection: it starts a transaction.
        Statement::Commit { chain: true, .. }
        | Statement::Rollback {
            chain: true,
            savepoint: None,
        } if dialect == Dialect::MySql => Decision::Begin { read_only: false },
        Statement::Commit { .. } => Decision::End,
        Statement::Rollback {
            savepoint: None, ..
        } => Decision::End,
        // ROLLBACK TO SAVEPOINT, SAVEPOINT, RELEASE SAVEPOINT.
        _ => Decision::Txn,
    }
}

/// Everything that is not a read, transaction control or a setting: what
/// pins its client (session state Fulcrum cannot move to another server
/// connection), what needs the primary, and the writes (the default).
fn pin_or_write(stmt: &Statement, f: &FunctionRules) -> Decision {
    match stmt {
        Statement::Load { .. } => Decision::Pin("LOAD"),
        Statement::CreateView(v) if v.temporary => Decision::Pin("temporary view"),
        Statement::CreateSequence {
            temporary: true, ..
        } => Decision::Pin("temporary sequence"),
        Statement::Discard { object_type } => match object_type {
            DiscardObject::ALL => Decision::Set,
            DiscardObject::PLANS | DiscardObject::SEQUENCES => Decision::Set,
            DiscardObject::TEMP => Decision::Pin("DISCARD TEMP"),
        },
        Statement::Prepare { .. } => Decision::Pin("SQL PREPARE"),
        Statement::Deallocate { .. } => Decision::Pin("DEALLOCATE"),
        Statement::Execute { .. } => Decision::Primary,
        Statement::Declare { stmts } => {
            if stmts.iter().any(|d| d.hold == Some(true)) {
                Decision::Pin("cursor WITH HOLD")
            } else {
                Decision::Primary
            }
        }
        Statement::Fetch { .. } | Statement::Close { .. } => Decision::Primary,
        Statement::LISTEN { .. } => Decision::Pin("LISTEN"),
        // Pooled server connections never listen (Fulcrum answers LISTEN
        // or pins its client), so UNLISTEN anywhere is harmless; the
        // client's own subscription follows its `Effect::Unlisten`.
        Statement::UNLISTEN { .. } => Decision::Set,
        Statement::LockTables { .. } => Decision::Pin("LOCK TABLES"),
        Statement::UnlockTables => Decision::Pin("UNLOCK TABLES"),
        // Both hold table locks for the session until UNLOCK TABLES.
        Statement::Flush {
            read_lock: true, ..
        } => Decision::Pin("FLUSH TABLES WITH READ LOCK"),
        Statement::Flush { export: true, .. } => Decision::Pin("FLUSH TABLES FOR EXPORT"),
        Statement::Kill { .. } => Decision::Primary,
        Statement::CreateTable(ct) if ct.temporary => Decision::Pin("temporary table"),
        // A procedure may leave any session state (settings, user variables,
        // temporary tables), and no catalog tells a built-in one: default-deny.
        Statement::Call(call) if !f.session_free.contains(&function_name(&call.name)) => {
            Decision::Pin("CALL of a procedure")
        }
        // Everything else changes something: DML, DDL, COPY FROM, GRANT, VACUUM, CALL, ...
        _ => Decision::Write,
    }
}

/// Hot standbys refuse SERIALIZABLE: such a transaction needs the primary.
fn serializable(modes: &[TransactionMode]) -> bool {
    modes.iter().any(|m| {
        matches!(
            m,
            TransactionMode::IsolationLevel(
                sqlparser::ast::TransactionIsolationLevel::Serializable
            )
        )
    })
}

fn read_only(modes: &[TransactionMode]) -> bool {
    modes.iter().any(|m| {
        matches!(
            m,
            TransactionMode::AccessMode(TransactionAccessMode::ReadOnly)
        )
    })
}

/// A query reads unless, anywhere in it (subqueries, derived tables, CTEs),
/// it locks rows, writes into a table or variable, modifies data, or calls a
/// function on the lists.
fn query(q: &Query, f: &FunctionRules) -> Decision {
    let mut v = QueryRules {
        f,
        decision: Decision::Read,
    };
    let _ = q.visit(&mut v);
    v.decision
}

struct QueryRules<'a> {
    f: &'a FunctionRules,
    decision: Decision,
}

impl QueryRules<'_> {
    fn add(&mut self, d: Decision) {
        self.decision = self.decision.combine(d);
    }

    /// A call of `name`: matched on its last part, unquoted, lower case.
    fn function(&mut self, name: &ObjectName) {
        let name = function_name(name);
        if self.f.read_only.contains(&name) {
        } else if self.f.pin.contains(&name) {
            self.add(Decision::Pin("session lock function"));
        } else if self.f.primary.contains(&name) {
            self.add(Decision::Primary);
        }
    }

    /// A variable read: a user variable (`@v`) pins; a system variable on
    /// the list (`@@identity`, `@@session.last_insert_id`) needs the primary.
    fn variable(&mut self, name: &str) {
        let name = name.to_ascii_lowercase();
        if let Some(system) = name.strip_prefix("@@") {
            let bare = system
                .strip_prefix("session.")
                .or_else(|| system.strip_prefix("local."))
                .unwrap_or(system);
            if PRIMARY_VARIABLES.contains(&bare) {
                self.add(Decision::Primary);
            }
        } else if name.starts_with('@') {
            self.add(Decision::Pin("user variable"));
        }
    }
}

impl Visitor for QueryRules<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
        if !q.locks.is_empty() {
            self.add(Decision::Primary);
        }
        if matches!(
            *q.body,
            SetExpr::Insert(_) | SetExpr::Update(_) | SetExpr::Delete(_) | SetExpr::Merge(_)
        ) {
            self.add(Decision::Write);
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_select(&mut self, s: &Select) -> ControlFlow<()> {
        if let Some(i) = &s.into {
            let target = i.targets.first().map(|t| t.to_string()).unwrap_or_default();
            self.add(if target.starts_with('@') {
                Decision::Pin("SELECT ... INTO @variable")
            } else if i.temporary {
                Decision::Pin("SELECT ... INTO TEMP")
            } else {
                Decision::Write
            });
        }
        if s.select_modifiers
            .as_ref()
            .is_some_and(|m| m.sql_calc_found_rows)
        {
            self.add(Decision::Primary);
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_statement(&mut self, s: &Statement) -> ControlFlow<()> {
        if matches!(
            s,
            Statement::Insert(_)
                | Statement::Update(_)
                | Statement::Delete(_)
                | Statement::Merge(_)
        ) {
            self.add(Decision::Write);
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, t: &TableFactor) -> ControlFlow<()> {
        if let Some(name) = called_in_from(t) {
            self.function(name);
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
        match e {
            // MySQL's LAST_INSERT_ID(expr) sets the value the session's
            // next LAST_INSERT_ID() returns: the same connection must
            // serve it, and no one else.
            Expr::Function(func)
                if function_name(&func.name) == "last_insert_id"
                    && matches!(&func.args, FunctionArguments::List(l) if !l.args.is_empty()) =>
            {
                self.add(Decision::Pin("LAST_INSERT_ID(expr)"));
            }
            Expr::Function(func) => self.function(&func.name),
            Expr::Identifier(id) => self.variable(&id.value),
            // sqlparser reads MySQL's quoted user variable (@`v`) as a
            // placeholder named `@v`.
            Expr::Value(v) => {
                if let sqlparser::ast::Value::Placeholder(p) = &v.value {
                    if p.starts_with('@') {
                        self.variable(p);
                    }
                }
            }
            // `@@session.identity`, or a user variable with a dot in its name.
            Expr::CompoundIdentifier(ids)
                if ids.first().is_some_and(|i| i.value.starts_with('@')) =>
            {
                let name: Vec<&str> = ids.iter().map(|i| i.value.as_str()).collect();
                self.variable(&name.join("."));
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use sqlparser::parser::Parser;

    use super::*;

    /// The rules alone, with no function lists, on one parsed statement.
    fn rule(sql: &str, dialect: Dialect) -> Decision {
        let none = FunctionRules {
            primary: HashSet::new(),
            pin: HashSet::new(),
            read_only: HashSet::new(),
            written: HashSet::new(),
            session_free: HashSet::new(),
        };
        let stmts = Parser::parse_sql(dialect.parser_dialect(), sql).expect(sql);
        classify_statement(&stmts[0], dialect, &none)
    }

    #[test]
    fn mysql_chained_transaction_ends_open_the_next() {
        let (my, pg) = (Dialect::MySql, Dialect::Postgres);
        let rw = Decision::Begin { read_only: false };
        let cases = [
            ("COMMIT AND CHAIN", my, rw),
            ("COMMIT WORK AND CHAIN", my, rw),
            ("ROLLBACK AND CHAIN", my, rw),
            ("COMMIT AND NO CHAIN", my, Decision::End),
            ("ROLLBACK", my, Decision::End),
            ("ROLLBACK TO SAVEPOINT a", my, Decision::Txn),
            // PostgreSQL's front end follows the server's transaction status.
            ("COMMIT AND CHAIN", pg, Decision::End),
        ];
        for (sql, dialect, want) in cases {
            assert_eq!(rule(sql, dialect), want, "{sql} ({dialect:?})");
        }
    }

    #[test]
    fn flush_tables_that_keep_locks_pin() {
        let my = Dialect::MySql;
        let cases = [
            (
                "FLUSH TABLES WITH READ LOCK",
                Decision::Pin("FLUSH TABLES WITH READ LOCK"),
            ),
            (
                "FLUSH TABLES sbtest1, sbtest2 WITH READ LOCK",
                Decision::Pin("FLUSH TABLES WITH READ LOCK"),
            ),
            (
                "FLUSH TABLES sbtest1 FOR EXPORT",
                Decision::Pin("FLUSH TABLES FOR EXPORT"),
            ),
            ("FLUSH TABLES", Decision::Write),
            ("FLUSH PRIVILEGES", Decision::Write),
        ];
        for (sql, want) in cases {
            assert_eq!(rule(sql, my), want, "{sql}");
        }
    }

    #[test]
    fn mysql_set_scopes_and_accounts() {
        let (my, pg) = (Dialect::MySql, Dialect::Postgres);
        let cases = [
            // MySQL's LOCAL is SESSION; PostgreSQL's lasts for the transaction.
            ("SET LOCAL wait_timeout = 10", my, Decision::Set),
            (
                "SET LOCAL autocommit = 0",
                my,
                Decision::Pin("SET autocommit = 0"),
            ),
            ("SET LOCAL statement_timeout = '5s'", pg, Decision::Txn),
            ("SET LOCAL TIME ZONE 'UTC'", pg, Decision::Txn),
            ("SET LOCAL TIME ZONE 'UTC'", my, Decision::Set),
            ("SET @@persist.max_connections = 500", my, Decision::Write),
            (
                "SET @@PERSIST_ONLY.max_connections = 500",
                my,
                Decision::Write,
            ),
            ("SET PASSWORD = PASSWORD('secret')", my, Decision::Write),
            ("SET password = 'secret'", my, Decision::Write),
            ("SET wait_timeout = 10", my, Decision::Set),
        ];
        for (sql, dialect, want) in cases {
            assert_eq!(rule(sql, dialect), want, "{sql} ({dialect:?})");
        }
    }

    #[test]
    fn session_write_variables_need_the_primary() {
        let my = Dialect::MySql;
        let cases = [
            ("SELECT @@identity", Decision::Primary),
            ("SELECT @@session.identity", Decision::Primary),
            ("SELECT @@SESSION.last_insert_id", Decision::Primary),
            ("SELECT @@local.last_insert_id", Decision::Primary),
            ("SELECT @@last_gtid", Decision::Primary),
            (
                "SELECT id FROM t WHERE id > @@session.last_gtid",
                Decision::Primary,
            ),
            ("SELECT @@session.sql_mode", Decision::Read),
            ("SELECT @@gtid_current_pos", Decision::Read),
            ("SELECT @a.b", Decision::Pin("user variable")),
            ("SELECT t.identity FROM t", Decision::Read),
        ];
        for (sql, want) in cases {
            assert_eq!(rule(sql, my), want, "{sql}");
        }
    }
}
