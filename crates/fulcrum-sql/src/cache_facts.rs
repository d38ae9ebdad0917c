//! What the result cache needs to know of a unit, read from the statements'
//! AST once, with their classification (and cached with it): the tables a
//! read may be kept for, the calls the catalog must vouch for, and what a
//! write may change (docs/routing.md, "Cache").

use std::sync::Arc;

use sqlparser::ast::Statement;

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

/// The facts of parsed statements with their combined `decision`.
pub(crate) fn of(_stmts: &[Statement], _dialect: Dialect, decision: Decision) -> CacheFacts {
    CacheFacts::of_decision(decision)
}
