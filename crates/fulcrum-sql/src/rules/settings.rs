//! How a setting is routed: `SET` in its forms (a variable, `SET
//! TRANSACTION`, `SET ROLE`, `SET NAMES`, ...) and `RESET`. A session
//! setting is replayed on each server connection (`Decision::Set`); one
//! Fulcrum cannot replay pins its client; a global one changes the server.

use sqlparser::ast::{Expr, Set};

use super::{read_only, serializable};
use crate::decision::Decision;
use crate::dialect::Dialect;

/// A `SET` statement.
pub(super) fn set(set: &Set, dialect: Dialect) -> Decision {
    match set {
        // SET SESSION CHARACTERISTICS AS TRANSACTION sets a session default.
        Set::SetTransaction { session: true, .. } => Decision::Set,
        // MySQL: the characteristics of the session's next transaction
        // (`SET SESSION` / `GLOBAL TRANSACTION` alone are `mysql::quirk`'s),
        // kept by the server connection until that transaction starts.
        // The client keeps its connection (default-deny): back in the
        // pool, it would give another client's transaction this level.
        Set::SetTransaction { .. } if dialect == Dialect::MySql => {
            Decision::Pin("SET TRANSACTION (the next transaction's characteristics)")
        }
        Set::SetTransaction { modes, .. } => {
            if read_only(modes) && !serializable(modes) {
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
        Set::SetTimeZone { local: true, .. } if dialect == Dialect::Postgres => Decision::Txn,
        Set::SetTimeZone { .. } | Set::SetNames { .. } | Set::SetNamesDefault {} => Decision::Set,
        Set::SetSessionParam(_) => Decision::Set,
    }
}

/// A `RESET` statement.
pub(super) fn reset(r: &sqlparser::ast::ResetStatement, dialect: Dialect) -> Decision {
    use sqlparser::ast::Reset;
    if dialect == Dialect::MySql {
        // MySQL's RESET (MASTER, SLAVE, QUERY CACHE) changes the server.
        return Decision::Write;
    }
    match &r.reset {
        Reset::SessionAuthorization => Decision::Pin("RESET SESSION AUTHORIZATION"),
        Reset::ConfigurationParameter(p) if p.to_string().eq_ignore_ascii_case("role") => {
            Decision::Pin("RESET ROLE")
        }
        _ => Decision::Set,
    }
}

/// One `name = value` of a `SET`, in `scope`.
fn assignment(
    dialect: Dialect,
    scope: Option<&sqlparser::ast::ContextModifier>,
    variable: &str,
    values: &[Expr],
) -> Decision {
    use sqlparser::ast::ContextModifier;
    let name = variable.to_ascii_lowercase();
    match scope {
        // In MySQL LOCAL is a synonym of SESSION: replayed like it.
        Some(ContextModifier::Local) if dialect == Dialect::Postgres => return Decision::Txn,
        Some(ContextModifier::Global) => return Decision::Write,
        _ => {}
    }
    if ["@@global.", "@@persist.", "@@persist_only."]
        .iter()
        .any(|p| name.starts_with(p))
    {
        return Decision::Write;
    }
    // MySQL `SET PASSWORD = ...` changes the account, not the session.
    if dialect == Dialect::MySql && name == "password" {
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
