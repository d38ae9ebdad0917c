//! What a parsed PostgreSQL unit may leave in the session beyond the
//! statements' own kinds, so that only what Fulcrum can prove harmless
//! goes unpinned (default-deny): `set_config` calls (replayed, or pinned
//! when they cannot be), names in the temporary schema (pinned), sequences
//! advanced by `nextval`/`setval` (their `currval` is reset before another
//! client uses the connection), and the calls not known to leave no session
//! state (the cluster pins them unless its catalog shows built-ins). A walk
//! over the parsed statements, on a cache miss only. For text sqlparser
//! cannot parse, the first words that prove a statement plain
//! (`maintenance_by_words`, `mysql_plain_by_words`); anything else pins.

use std::ops::ControlFlow;
use std::sync::Arc;

use sqlparser::ast::{Expr, Statement, Visit, Visitor};

use crate::calls::unproven_calls;
use crate::decision::PinReason;
use crate::dialect::Dialect;
use crate::effects::Effect;
use crate::rules::{function_name, FunctionRules};

/// Why a unit that names `pg_temp` pins.
pub const TEMP_SCHEMA: PinReason = "temporary object (pg_temp)";
/// Why a PostgreSQL unit sqlparser cannot parse pins.
pub const UNPARSED: PinReason = "statement Fulcrum cannot parse";
/// Why a unit that defines a function or procedure and calls a function
/// not known to leave no session state pins: the function catalog was read
/// before the definition, so it cannot tell the call is a user's.
pub const DEFINED_AND_CALLED: PinReason = "function defined and called in one unit";
/// Why a unit that advances a sequence has its connection reset.
pub const SEQUENCE_STATE: PinReason = "sequence state (nextval, setval)";

/// The facts of one unit.
#[derive(Debug, Default)]
pub(crate) struct Facts {
    /// Effects beyond the statements' own (set_config, pins, resets).
    pub effects: Vec<Effect>,
    /// A pin the routing decision must carry.
    pub pin: Option<PinReason>,
    /// Calls not known to leave no session state.
    pub unproven: Option<Arc<[Arc<str>]>>,
}

/// The facts of the PostgreSQL unit `sql`, parsed as `stmts`.
pub(crate) fn of(sql: &str, stmts: &[Statement], rules: &FunctionRules) -> Facts {
    let mut facts = Facts::default();
    if sql
        .as_bytes()
        .windows(10)
        .any(|w| w.eq_ignore_ascii_case(b"set_config"))
    {
        facts.effects = crate::set_config::effects(stmts);
    }
    if crate::temp_schema::names_temp_schema(sql) {
        facts.pin = Some(TEMP_SCHEMA);
        facts.effects.push(Effect::Pin(TEMP_SCHEMA));
    }
    let mut calls = Calls::default();
    for s in stmts {
        let _ = s.visit(&mut calls);
    }
    if calls.sequence {
        facts.effects.push(Effect::ResetBeforeReuse(SEQUENCE_STATE));
    }
    if calls.notify || stmts.iter().any(|s| matches!(s, Statement::NOTIFY { .. })) {
        facts.effects.push(Effect::Notifies);
    }
    let unproven = unproven_calls(stmts, Dialect::Postgres, rules);
    if !unproven.is_empty() {
        if stmts.iter().any(defines_routine) {
            facts.pin = Some(DEFINED_AND_CALLED);
            facts.effects.push(Effect::Pin(DEFINED_AND_CALLED));
        }
        facts.unproven = Some(Arc::from(unproven));
    }
    facts
}

/// A statement that makes or changes a function or procedure (or an
/// operator or aggregate over one): a call later in the same unit may run
/// it before the function catalog hears of it.
fn defines_routine(s: &Statement) -> bool {
    matches!(
        s,
        Statement::CreateFunction(_)
            | Statement::CreateProcedure { .. }
            | Statement::AlterFunction(_)
            | Statement::CreateOperator(_)
    )
}

/// A single PostgreSQL statement sqlparser cannot parse whose first words
/// prove it leaves no session state: maintenance and DDL that make nothing
/// temporary (pgbench -i's `vacuum analyze t`, `copy t from stdin with
/// (freeze on)`, `REINDEX`, `CLUSTER`, `CHECKPOINT`, `CREATE PUBLICATION`).
/// It keeps `default_route`; anything else unparsed pins.
pub(crate) fn maintenance_by_words(sql: &str) -> bool {
    if sql.trim_end().trim_end_matches(';').contains(';')
        || crate::temp_schema::names_temp_schema(sql)
    {
        return false;
    }
    let words = crate::statements::head_words(sql, 3);
    let word = |i: usize| words.get(i).map(String::as_str).unwrap_or("");
    let temporary = |w: &str| matches!(w, "temp" | "temporary" | "local" | "global" | "unlogged");
    match word(0) {
        "vacuum" | "analyze" | "analyse" | "copy" | "reindex" | "cluster" | "checkpoint"
        | "refresh" | "comment" | "grant" | "revoke" | "truncate" | "drop" | "security"
        | "import" | "alter" => true,
        "create" => !temporary(word(1)),
        _ => false,
    }
}

/// A single MySQL statement sqlparser cannot parse whose first words prove
/// it leaves no session state: DML and DDL that make nothing temporary,
/// table maintenance, SHOW and replication control, with no user variable
/// and no sequence (`NEXT VALUE FOR` sets what `PREVIOUS VALUE FOR` reads).
/// It keeps `default_route`; anything else unparsed pins (`XA`, `HANDLER`,
/// `DO`, compound statements, several statements).
pub(crate) fn mysql_plain_by_words(sql: &str) -> bool {
    let b = sql.as_bytes();
    // `@v` after an operator or a space; `'u1'@'host'` names an account.
    let user_variable = b.iter().enumerate().any(|(i, &c)| {
        c == b'@'
            && b.get(i + 1) != Some(&b'@')
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b"_'\"`@".contains(&b[i - 1])))
    });
    let contains = |needle: &[u8]| {
        b.windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
    };
    let words = crate::statements::head_words(sql, 2);
    let word = |i: usize| words.get(i).map(String::as_str).unwrap_or("");
    // A routine's body holds `;` and runs nothing when it is made.
    let routine = word(0) == "create"
        && matches!(
            word(1),
            "procedure" | "function" | "trigger" | "event" | "definer"
        );
    if user_variable
        || contains(b"value for")
        || (!routine && sql.trim_end().trim_end_matches(';').contains(';'))
    {
        return false;
    }
    match word(0) {
        "select" | "insert" | "update" | "delete" | "replace" | "alter" | "drop" | "rename"
        | "truncate" | "analyze" | "optimize" | "check" | "checksum" | "repair" | "show"
        | "explain" | "describe" | "desc" | "grant" | "revoke" | "install" | "uninstall"
        | "change" | "purge" | "cache" | "kill" | "help" | "load" | "signal" => true,
        "create" => !matches!(word(1), "temporary" | "temp"),
        "start" | "stop" => matches!(word(1), "slave" | "replica" | "all"),
        _ => false,
    }
}

/// Finds calls that advance a sequence in this session, or notify.
#[derive(Default)]
struct Calls {
    sequence: bool,
    notify: bool,
}

impl Calls {
    fn call(&mut self, name: &sqlparser::ast::ObjectName) {
        match function_name(name).as_str() {
            "nextval" | "setval" => self.sequence = true,
            "pg_notify" => self.notify = true,
            _ => {}
        }
    }
}

impl Visitor for Calls {
    type Break = ();

    fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
        if let Expr::Function(f) = e {
            self.call(&f.name);
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, t: &sqlparser::ast::TableFactor) -> ControlFlow<()> {
        if let Some(name) = crate::rules::called_in_from(t) {
            self.call(name);
        }
        ControlFlow::Continue(())
    }
}
