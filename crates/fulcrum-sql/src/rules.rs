//! The routing rules over sqlparser's AST: one function from a parsed statement
//! to a `Decision`. Reads are a short whitelist; anything not recognised as a
//! read, transaction control or session state is a write (the primary).
//! Every rule is documented with an example in docs/routing.md.

use std::collections::HashSet;
use std::ops::ControlFlow;

use sqlparser::ast::{
    visit_expressions, visit_statements, DiscardObject, Expr, Query, SetExpr, Statement,
    TransactionAccessMode, TransactionMode,
};

use crate::decision::Decision;
use crate::dialect::Dialect;

/// Function-name lists the rules consult (lower case, unqualified).
pub(crate) struct FunctionRules {
    pub primary: HashSet<String>,
    pub pin: HashSet<String>,
    pub read_only: HashSet<String>,
}

pub(crate) fn classify_statement(
    stmt: &Statement,
    dialect: Dialect,
    f: &FunctionRules,
) -> Decision {
    use sqlparser::ast::Set;
    match stmt {
        Statement::Query(q) => query(q, f),
        Statement::Explain {
            analyze, statement, ..
        } => {
            if *analyze {
                classify_statement(statement, dialect, f)
            } else {
                Decision::Read
            }
        }
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
        // COPY ... TO STDOUT reads; COPY ... FROM writes.
        Statement::Copy { to: true, .. } => Decision::Read,
        Statement::StartTransaction { modes, .. } => Decision::Begin {
            read_only: read_only(modes),
        },
        Statement::Commit { .. } => Decision::End,
        Statement::Rollback {
            savepoint: None, ..
        } => Decision::End,
        Statement::Rollback {
            savepoint: Some(_), ..
        }
        | Statement::Savepoint { .. }
        | Statement::ReleaseSavepoint { .. } => Decision::Txn,
        Statement::Set(set) => match set {
            Set::SetTransaction { modes, .. } => {
                if read_only(modes) {
                    Decision::TxnReadOnly
                } else {
                    Decision::Txn
                }
            }
            Set::SingleAssignment {
                scope,
                variable,
                values,
                ..
            } => assignment(dialect, scope.as_ref(), &variable.to_string(), values),
            Set::ParenthesizedAssignments { .. } => Decision::Pin("SET (...) = (...)"),
            Set::MultipleAssignments { assignments } => assignments
                .iter()
                .map(|a| {
                    assignment(
                        dialect,
                        a.scope.as_ref(),
                        &a.name.to_string(),
                        std::slice::from_ref(&a.value),
                    )
                })
                .fold(Decision::Read, Decision::combine),
            Set::SetSessionAuthorization(_) => Decision::Pin("SET SESSION AUTHORIZATION"),
            Set::SetRole { .. } => Decision::Pin("SET ROLE"),
            Set::SetTimeZone { local: true, .. } => Decision::Txn,
            Set::SetTimeZone { .. } | Set::SetNames { .. } | Set::SetNamesDefault {} => {
                Decision::Set
            }
            Set::SetSessionParam(_) => Decision::Set,
        },
        Statement::Use(_) => Decision::Set,
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
        Statement::UNLISTEN { .. } => Decision::Pin("UNLISTEN"),
        Statement::LockTables { .. } => Decision::Pin("LOCK TABLES"),
        Statement::UnlockTables => Decision::Pin("UNLOCK TABLES"),
        Statement::Kill { .. } => Decision::Primary,
        Statement::CreateTable(ct) if ct.temporary => Decision::Pin("temporary table"),
        // Everything else changes something: DML, DDL, COPY FROM, GRANT, VACUUM, CALL, ...
        _ => Decision::Write,
    }
}

fn read_only(modes: &[TransactionMode]) -> bool {
    modes.iter().any(|m| {
        matches!(
            m,
            TransactionMode::AccessMode(TransactionAccessMode::ReadOnly)
        )
    })
}

fn assignment(
    dialect: Dialect,
    scope: Option<&sqlparser::ast::ContextModifier>,
    variable: &str,
    values: &[Expr],
) -> Decision {
    use sqlparser::ast::ContextModifier;
    let name = variable.to_ascii_lowercase();
    match scope {
        Some(ContextModifier::Local) => return Decision::Txn,
        Some(ContextModifier::Global) => return Decision::Write,
        _ => {}
    }
    if name.starts_with("@@global.") {
        return Decision::Write;
    }
    if name.starts_with('@') && !name.starts_with("@@") {
        return Decision::Pin("user variable");
    }
    let bare = name
        .trim_start_matches("@@session.")
        .trim_start_matches("@@local.")
        .trim_start_matches("@@")
        .trim_start_matches("session.");
    if dialect == Dialect::MySql && bare == "autocommit" {
        let off = values.iter().any(|v| {
            let t = v.to_string().to_ascii_lowercase();
            matches!(t.as_str(), "0" | "off" | "false" | "'off'" | "'0'")
        });
        return if off {
            Decision::Pin("SET autocommit = 0")
        } else {
            Decision::Set
        };
    }
    if dialect == Dialect::MySql && matches!(bare, "transaction_read_only" | "tx_read_only") {
        return Decision::Set;
    }
    if dialect == Dialect::Postgres && matches!(bare, "role" | "session_authorization") {
        return Decision::Pin("SET ROLE");
    }
    Decision::Set
}

/// A query reads unless it locks rows, writes into a table or variable,
/// contains a data-modifying CTE, or calls a function on the lists.
fn query(q: &Query, f: &FunctionRules) -> Decision {
    // Data-modifying statements nested anywhere (CTEs, subqueries).
    let nested_write = visit_statements(q, |s| match s {
        Statement::Insert(_)
        | Statement::Update(_)
        | Statement::Delete(_)
        | Statement::Merge(_) => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    });
    if nested_write.is_break() || has_modifying_body(q) {
        return Decision::Write;
    }
    let mut decision = Decision::Read;
    if !q.locks.is_empty() {
        decision = Decision::Primary;
    }
    let mut into = None;
    visit_selects(q, &mut |s| {
        if let Some(i) = &s.into {
            let target = i.targets.first().map(|t| t.to_string()).unwrap_or_default();
            into = Some(if target.starts_with('@') {
                Decision::Pin("SELECT ... INTO @variable")
            } else {
                Decision::Write
            });
        }
        if s.select_modifiers
            .as_ref()
            .is_some_and(|m| m.sql_calc_found_rows)
        {
            decision = decision.combine(Decision::Primary);
        }
    });
    if let Some(d) = into {
        return d;
    }
    let _ = visit_expressions(q, |e| {
        match e {
            Expr::Function(func) => {
                let name = func
                    .name
                    .0
                    .last()
                    .map(|p| {
                        p.to_string()
                            .trim_matches('"')
                            .trim_matches('`')
                            .to_ascii_lowercase()
                    })
                    .unwrap_or_default();
                if f.read_only.contains(&name) {
                } else if f.pin.contains(&name) {
                    decision = decision.combine(Decision::Pin("session lock function"));
                } else if f.primary.contains(&name) {
                    decision = decision.combine(Decision::Primary);
                }
            }
            Expr::Identifier(id) => {
                let v = id.value.to_ascii_lowercase();
                if v == "@@identity" || v == "@@last_insert_id" {
                    decision = decision.combine(Decision::Primary);
                } else if v.starts_with('@') && !v.starts_with("@@") {
                    decision = decision.combine(Decision::Pin("user variable"));
                }
            }
            _ => {}
        }
        ControlFlow::<()>::Continue(())
    });
    decision
}

fn has_modifying_body(q: &Query) -> bool {
    fn body(b: &SetExpr) -> bool {
        match b {
            SetExpr::Insert(_) | SetExpr::Update(_) | SetExpr::Delete(_) | SetExpr::Merge(_) => {
                true
            }
            SetExpr::Query(q) => has_modifying_body(q),
            SetExpr::SetOperation { left, right, .. } => body(left) || body(right),
            _ => false,
        }
    }
    body(&q.body)
        || q.with
            .as_ref()
            .is_some_and(|w| w.cte_tables.iter().any(|c| has_modifying_body(&c.query)))
}

fn visit_selects(q: &Query, f: &mut dyn FnMut(&sqlparser::ast::Select)) {
    fn body(b: &SetExpr, f: &mut dyn FnMut(&sqlparser::ast::Select)) {
        match b {
            SetExpr::Select(s) => f(s),
            SetExpr::Query(q) => visit_selects(q, f),
            SetExpr::SetOperation { left, right, .. } => {
                body(left, f);
                body(right, f);
            }
            _ => {}
        }
    }
    body(&q.body, f);
    if let Some(w) = &q.with {
        for c in &w.cte_tables {
            visit_selects(&c.query, f);
        }
    }
}
