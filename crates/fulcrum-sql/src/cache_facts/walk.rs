//! One walk over a statement's AST gathering what both halves of the cache
//! facts need: the relations it reads (CTE names resolved by scope), the
//! functions it calls, whatever makes a read unfit to keep, and the tables
//! its data-modifying parts (INSERT, UPDATE, DELETE, MERGE, also inside a
//! query's CTEs) change.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ops::ControlFlow;

use sqlparser::ast::{
    Expr, FromTable, Ident, ObjectName, Query, Select, SetExpr, Statement, TableFactor,
    TableObject, TableWithJoins, UpdateTableFromKind, Value, ValueWithSpan, Visit, Visitor,
};

use super::names::{self, Called};
use crate::dialect::Dialect;

/// What one statement's walk found.
#[derive(Debug, Default)]
pub(super) struct Walk {
    dialect: Option<Dialect>,
    /// Relations read or named (CTE names excluded), normalised.
    pub relations: BTreeSet<String>,
    /// Why a read of it is never kept (the first reason found).
    pub refused: Option<&'static str>,
    /// Calls no list knows to be immutable, nor volatile (lower case,
    /// unqualified).
    pub calls: BTreeSet<String>,
    /// It calls a function that may change tables the cache keeps (not on
    /// the immutable or the harmless-in-a-write lists).
    pub may_write_anywhere: bool,
    /// Tables its INSERT / UPDATE / DELETE / MERGE parts change.
    pub targets: BTreeSet<String>,
    /// It changes something it does not name as a table (a target the
    /// walk cannot place, `SELECT ... INTO table`).
    pub untargeted: bool,
    /// Per query on the way down: how many scope frames it pushed.
    pushed: Vec<usize>,
    frames: Vec<Frame>,
    /// The CTE names a CTE body sees, by the body's address.
    bodies: HashMap<usize, HashSet<String>>,
}

/// CTE names in scope. A CTE body's frame hides the frame of its own
/// WITH beneath it (a body sees only the CTEs before it, unless
/// RECURSIVE).
#[derive(Debug)]
struct Frame {
    names: HashSet<String>,
    hides_parent: bool,
}

pub(super) fn walk(stmt: &Statement, dialect: Dialect) -> Walk {
    let mut w = Walk {
        dialect: Some(dialect),
        ..Walk::default()
    };
    let _ = stmt.visit(&mut w);
    w
}

impl Walk {
    fn dialect(&self) -> Dialect {
        self.dialect.unwrap_or(Dialect::Postgres)
    }

    fn refuse(&mut self, why: &'static str) {
        self.refused.get_or_insert(why);
    }

    /// An identifier as the server compares names: PostgreSQL folds
    /// unquoted ones to lower case; MySQL's are kept as written (a CTE
    /// name is then matched only exactly: a miss keeps a name as a table,
    /// which only widens invalidation).
    fn fold(&self, i: &Ident) -> String {
        match (self.dialect(), i.quote_style) {
            (Dialect::Postgres, None) => i.value.to_lowercase(),
            _ => i.value.clone(),
        }
    }

    fn is_cte(&self, name: &ObjectName) -> bool {
        let [part] = name.0.as_slice() else {
            return false;
        };
        let Some(ident) = part.as_ident() else {
            return false;
        };
        let folded = self.fold(ident);
        let mut skip = false;
        for f in self.frames.iter().rev() {
            if skip {
                skip = false;
                continue;
            }
            if f.names.contains(&folded) {
                return true;
            }
            skip = f.hides_parent;
        }
        false
    }

    fn read(&mut self, name: &ObjectName) {
        if self.is_cte(name) {
            return;
        }
        match names::relation(name) {
            Some(r) => {
                if names::is_system(&r, self.dialect()) {
                    self.refuse("system catalog");
                }
                self.relations.insert(r);
            }
            None => self.refuse("relation name not understood"),
        }
    }

    fn call(&mut self, name: &ObjectName) {
        let d = self.dialect();
        match names::called(name, d) {
            Called::Builtin(n) if names::immutable(&n, d) => {}
            Called::Builtin(n) => {
                if names::volatile(&n, d) {
                    self.refuse("volatile or session-dependent function");
                } else {
                    self.calls.insert(n.clone());
                }
                if !names::harmless_in_write(&n, d) {
                    self.may_write_anywhere = true;
                }
            }
            Called::Other(n) => {
                self.calls.insert(n);
                self.may_write_anywhere = true;
            }
            Called::Quoted => {
                self.refuse("quoted function name");
                self.may_write_anywhere = true;
            }
        }
    }

    fn target(&mut self, name: &ObjectName) {
        match names::relation(name) {
            Some(r) => {
                self.targets.insert(r);
            }
            None => self.untargeted = true,
        }
    }

    fn target_factor(&mut self, t: &TableFactor) {
        match t {
            TableFactor::Table {
                name, args: None, ..
            } => self.target(name),
            TableFactor::NestedJoin {
                table_with_joins, ..
            } => self.target_joined(table_with_joins),
            _ => self.untargeted = true,
        }
    }

    /// Every table of a table-with-joins (MySQL multi-table UPDATE and
    /// DELETE); derived tables cannot be changed and are skipped.
    fn target_joined(&mut self, t: &TableWithJoins) {
        for f in std::iter::once(&t.relation).chain(t.joins.iter().map(|j| &j.relation)) {
            match f {
                TableFactor::Derived { .. } => {}
                f => self.target_factor(f),
            }
        }
    }

    fn target_statement(&mut self, s: &Statement) {
        let mysql = self.dialect() == Dialect::MySql;
        match s {
            Statement::Insert(i) => match &i.table {
                TableObject::TableName(n) => self.target(n),
                _ => self.untargeted = true,
            },
            Statement::Update(u) => {
                if mysql {
                    self.target_joined(&u.table);
                    if let Some(
                        UpdateTableFromKind::BeforeSet(f) | UpdateTableFromKind::AfterSet(f),
                    ) = &u.from
                    {
                        f.iter().for_each(|t| self.target_joined(t));
                    }
                } else if u.table.joins.is_empty() {
                    // PostgreSQL: only the table before SET changes.
                    self.target_factor(&u.table.relation);
                } else {
                    self.untargeted = true;
                }
            }
            Statement::Delete(d) => {
                let (FromTable::WithFromKeyword(from) | FromTable::WithoutKeyword(from)) = &d.from;
                if mysql {
                    // Multi-table DELETE names aliases or tables: every
                    // table of the statement (a superset).
                    d.tables.iter().for_each(|n| self.target(n));
                    from.iter().for_each(|t| self.target_joined(t));
                    d.using.iter().flatten().for_each(|t| self.target_joined(t));
                } else if let ([one], true) = (from.as_slice(), d.tables.is_empty()) {
                    if one.joins.is_empty() {
                        self.target_factor(&one.relation);
                    } else {
                        self.untargeted = true;
                    }
                } else {
                    self.untargeted = true;
                }
            }
            Statement::Merge(m) => self.target_factor(&m.table),
            _ => {}
        }
    }

    /// `TABLE t` (no TableFactor): its relation, through set operations.
    fn table_bodies(&mut self, body: &SetExpr) {
        match body {
            SetExpr::Table(t) => match &t.table_name {
                Some(table) => {
                    let name = match &t.schema_name {
                        Some(s) => format!("{}.{}", s.to_lowercase(), table.to_lowercase()),
                        None => table.to_lowercase(),
                    };
                    if names::is_system(&name, self.dialect()) {
                        self.refuse("system catalog");
                    }
                    self.relations.insert(name);
                }
                None => self.refuse("TABLE without a name"),
            },
            SetExpr::SetOperation { left, right, .. } => {
                self.table_bodies(left);
                self.table_bodies(right);
            }
            _ => {}
        }
    }
}

fn address(q: &Query) -> usize {
    q as *const Query as usize
}

impl Visitor for Walk {
    type Break = ();

    fn pre_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
        let mut pushed = 0;
        if let Some(names) = self.bodies.remove(&address(q)) {
            self.frames.push(Frame {
                names,
                hides_parent: true,
            });
            pushed += 1;
        }
        if let Some(with) = &q.with {
            let all: Vec<String> = with
                .cte_tables
                .iter()
                .map(|c| self.fold(&c.alias.name))
                .collect();
            for (i, cte) in with.cte_tables.iter().enumerate() {
                let seen = if with.recursive { &all[..] } else { &all[..i] };
                self.bodies
                    .insert(address(&cte.query), seen.iter().cloned().collect());
            }
            self.frames.push(Frame {
                names: all.into_iter().collect(),
                hides_parent: false,
            });
            pushed += 1;
        }
        self.pushed.push(pushed);
        if !q.locks.is_empty() {
            self.refuse("locking clause");
        }
        if matches!(
            *q.body,
            SetExpr::Insert(_) | SetExpr::Update(_) | SetExpr::Delete(_) | SetExpr::Merge(_)
        ) {
            self.refuse("data-modifying query");
        }
        self.table_bodies(&q.body);
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _q: &Query) -> ControlFlow<()> {
        let n = self.pushed.pop().unwrap_or(0);
        let keep = self.frames.len().saturating_sub(n);
        self.frames.truncate(keep);
        ControlFlow::Continue(())
    }

    fn pre_visit_select(&mut self, s: &Select) -> ControlFlow<()> {
        if let Some(into) = &s.into {
            self.refuse("SELECT ... INTO");
            let variables = !into.targets.is_empty()
                && into.targets.iter().all(|t| t.to_string().starts_with('@'));
            if !variables {
                self.untargeted = true;
            }
        }
        if s.select_modifiers
            .as_ref()
            .is_some_and(|m| m.sql_calc_found_rows)
        {
            self.refuse("SQL_CALC_FOUND_ROWS");
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
            self.refuse("data-modifying statement");
            self.target_statement(s);
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, t: &TableFactor) -> ControlFlow<()> {
        match t {
            TableFactor::Table {
                name,
                args,
                version,
                sample,
                json_path,
                ..
            } => {
                if args.is_some() {
                    self.refuse("function in FROM");
                    self.call(name);
                } else {
                    if version.is_some() || sample.is_some() || json_path.is_some() {
                        self.refuse("time travel, sample or JSON path");
                    }
                    self.read(name);
                }
            }
            TableFactor::Function { name, .. } => {
                self.refuse("function in FROM");
                self.call(name);
            }
            TableFactor::Derived { sample, .. } => {
                if sample.is_some() {
                    self.refuse("TABLESAMPLE");
                }
            }
            TableFactor::NestedJoin { .. } => {}
            _ => self.refuse("table function"),
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
        match e {
            Expr::Function(f) => self.call(&f.name),
            Expr::Identifier(i) if names::value_function(i, self.dialect()) => {
                self.refuse("SQL value function");
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_ident(&mut self, i: &Ident) -> ControlFlow<()> {
        if i.quote_style.is_none() && i.value.starts_with('@') {
            self.refuse("variable");
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_value(&mut self, v: &ValueWithSpan) -> ControlFlow<()> {
        let text = match &v.value {
            Value::SingleQuotedString(s)
            | Value::EscapedStringLiteral(s)
            | Value::NationalStringLiteral(s)
            | Value::DoubleQuotedString(s) => Some(s.as_str()),
            Value::DollarQuotedString(d) => Some(d.value.as_str()),
            _ => None,
        };
        if text.is_some_and(names::clock_literal) {
            self.refuse("date/time literal that reads the clock");
        }
        ControlFlow::Continue(())
    }
}
