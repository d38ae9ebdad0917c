//! What the result cache needs to know of a unit, read from the statements'
//! AST once, with their classification (and cached with it): the tables a
//! read may be kept for, the calls the catalog must vouch for, and what a
//! write may change (docs/routing.md, "Cache"). When in doubt a read is not
//! kept and a write may change everything.

mod names;
mod walk;

use std::collections::BTreeSet;
use std::sync::Arc;

use sqlparser::ast::{CascadeOption, CopySource, Statement};

use crate::decision::Decision;
use crate::dialect::Dialect;

/// A unit's facts for the result cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheFacts {
    /// A read whose result may be kept: the relations it reads, each as the
    /// statement names it (unquoted, lower case; `schema.table` when
    /// qualified), at least one. `None`: never kept.
    pub reads: Option<Arc<[Arc<str>]>>,
    /// Functions the read calls that no list knows to be immutable: its
    /// result is kept only if the catalog says each is. `None`: none.
    pub calls: Option<Arc<[Arc<str>]>>,
    /// What the unit may change.
    pub writes: Writes,
}

/// What a unit may change, for invalidation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Writes {
    /// Nothing the cache keeps (reads, settings, transaction control).
    Nothing,
    /// Only these tables (as the statement names them, as in `reads`).
    /// What the text cannot show is not in it: triggers, rules, foreign
    /// keys ON DELETE/UPDATE CASCADE, a view's base tables, partitions and
    /// inheritance children.
    Tables(Arc<[Arc<str>]>),
    /// Anything in the database: DDL, calls of functions that may write, a
    /// write the parser cannot place.
    Everything,
}

impl CacheFacts {
    /// What a decision alone tells: nothing kept; anything that may write
    /// may change everything.
    pub fn of_decision(decision: Decision) -> CacheFacts {
        let writes = match decision {
            Decision::Read
            | Decision::Begin { .. }
            | Decision::End
            | Decision::Txn
            | Decision::TxnReadOnly
            | Decision::Set => Writes::Nothing,
            Decision::Primary | Decision::Write | Decision::Pin(_) | Decision::Unknown => {
                Writes::Everything
            }
        };
        CacheFacts {
            reads: None,
            calls: None,
            writes,
        }
    }
}

/// What one statement may change, before the unit's are combined.
enum Change {
    Nothing,
    Tables(BTreeSet<String>),
    Everything,
}

impl Change {
    fn combine(self, other: Change) -> Change {
        match (self, other) {
            (Change::Everything, _) | (_, Change::Everything) => Change::Everything,
            (Change::Tables(mut a), Change::Tables(b)) => {
                a.extend(b);
                Change::Tables(a)
            }
            (Change::Tables(a), Change::Nothing) | (Change::Nothing, Change::Tables(a)) => {
                Change::Tables(a)
            }
            (Change::Nothing, Change::Nothing) => Change::Nothing,
        }
    }
}

fn list(names: BTreeSet<String>) -> Arc<[Arc<str>]> {
    names.into_iter().map(Arc::from).collect()
}

/// The facts of parsed statements with their combined `decision`.
pub(crate) fn of(stmts: &[Statement], dialect: Dialect, decision: Decision) -> CacheFacts {
    let (reads, calls) = match (stmts, decision) {
        ([stmt @ Statement::Query(_)], Decision::Read) => kept(stmt, dialect),
        _ => (None, None),
    };
    let writes = if decision == Decision::Read {
        Writes::Nothing
    } else {
        match stmts
            .iter()
            .map(|s| change(s, dialect))
            .fold(Change::Nothing, Change::combine)
        {
            Change::Nothing => Writes::Nothing,
            Change::Tables(t) => Writes::Tables(list(t)),
            Change::Everything => Writes::Everything,
        }
    };
    CacheFacts {
        reads,
        calls,
        writes,
    }
}

type Names = Option<Arc<[Arc<str>]>>;

/// A plain query's relations and unlisted calls, when its result may be kept.
fn kept(stmt: &Statement, dialect: Dialect) -> (Names, Names) {
    let w = walk::walk(stmt, dialect);
    if w.refused.is_some() || w.relations.is_empty() || !w.targets.is_empty() || w.untargeted {
        return (None, None);
    }
    let calls = (!w.calls.is_empty()).then(|| list(w.calls));
    (Some(list(w.relations)), calls)
}

/// What a statement whose calls the walk checks may change: everything
/// when it calls a function that may write, else the tables it modifies.
fn walked(stmt: &Statement, dialect: Dialect) -> Change {
    let w = walk::walk(stmt, dialect);
    if w.may_write_anywhere || w.untargeted {
        Change::Everything
    } else if w.targets.is_empty() {
        Change::Nothing
    } else {
        Change::Tables(w.targets)
    }
}

/// What one statement may change.
fn change(stmt: &Statement, dialect: Dialect) -> Change {
    match stmt {
        Statement::Query(_)
        | Statement::Insert(_)
        | Statement::Update(_)
        | Statement::Delete(_)
        | Statement::Merge(_)
        // A SET may call a function (MySQL `SET @x = f()`); a cursor's
        // query runs at FETCH, which is `Everything` below.
        | Statement::Set(_)
        | Statement::Declare { .. } => {
            if matches!(stmt, Statement::Set(_)) && sets_global(stmt) {
                return Change::Everything;
            }
            walked(stmt, dialect)
        }
        Statement::Copy {
            to: false, source, ..
        } => match source {
            CopySource::Table { table_name, .. } => match names::relation(table_name) {
                Some(t) => Change::Tables(BTreeSet::from([t])),
                None => Change::Everything,
            },
            CopySource::Query(_) => Change::Everything,
        },
        // COPY ... TO reads (its query may still call a function).
        Statement::Copy { to: true, .. } => walked(stmt, dialect),
        Statement::Truncate(t) => {
            if matches!(t.cascade, Some(CascadeOption::Cascade)) {
                return Change::Everything;
            }
            t.table_names
                .iter()
                .map(|n| match names::relation(&n.name) {
                    Some(t) => Change::Tables(BTreeSet::from([t])),
                    None => Change::Everything,
                })
                .fold(Change::Nothing, Change::combine)
        }
        Statement::Explain { statement, .. } => {
            if crate::rules::explain_runs(stmt) {
                change(statement, dialect)
            } else {
                Change::Nothing
            }
        }
        Statement::Reset(_) if dialect == Dialect::MySql => Change::Everything,
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
        | Statement::ShowCollation { .. }
        | Statement::ShowProcessList { .. }
        | Statement::Use(_)
        | Statement::Reset(_)
        | Statement::StartTransaction { .. }
        | Statement::Commit { .. }
        | Statement::Rollback { .. }
        | Statement::Savepoint { .. }
        | Statement::ReleaseSavepoint { .. }
        | Statement::Discard { .. }
        | Statement::Prepare { .. }
        | Statement::Deallocate { .. }
        | Statement::Close { .. }
        | Statement::LISTEN { .. }
        | Statement::UNLISTEN { .. }
        | Statement::NOTIFY { .. }
        | Statement::Lock(_)
        | Statement::LockTables { .. }
        | Statement::UnlockTables
        | Statement::Analyze(_)
        | Statement::Vacuum(_) => Change::Nothing,
        // DDL, GRANT, CALL, EXECUTE, FETCH, anything else.
        _ => Change::Everything,
    }
}

/// A SET of a server-wide setting (MySQL `GLOBAL`, `PERSIST`): other
/// sessions' results may change with it (`time_zone`). Read from the
/// statement's text, so a literal naming "global" also counts.
fn sets_global(stmt: &Statement) -> bool {
    let text = stmt.to_string().to_ascii_lowercase();
    text.contains("global") || text.contains("persist")
}

#[cfg(test)]
mod tests;
