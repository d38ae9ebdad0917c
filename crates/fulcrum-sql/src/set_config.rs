//! PostgreSQL's `set_config(name, value, is_local)` as session state. With
//! `is_local = false` it is a `SET` by another name (row-level-security
//! apps set their tenant this way): replayed per client like a `SET`, so a
//! pooled connection never carries one client's value to the next. With
//! `is_local = true` it lasts until the transaction ends: nothing to track.
//! A name or flag that is not a literal cannot be replayed: the client is
//! pinned. A second walk over the parsed statements, only for statements
//! that call `set_config`.

use std::ops::ControlFlow;

use sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Statement, TableFactor, Value, Visit,
    Visitor,
};

use crate::effects::Effect;
use crate::rules::function_name;

struct Calls {
    effects: Vec<Effect>,
}

/// A literal string argument.
fn text(arg: &FunctionArg) -> Option<String> {
    let FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(v))) = arg else {
        return None;
    };
    match &v.value {
        Value::SingleQuotedString(s) | Value::EscapedStringLiteral(s) => Some(s.clone()),
        _ => None,
    }
}

/// A bound parameter (`$n`): its 0-based index.
fn param(arg: &FunctionArg) -> Option<usize> {
    let FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(v))) = arg else {
        return None;
    };
    match &v.value {
        Value::Placeholder(p) => p.strip_prefix('$')?.parse::<usize>().ok()?.checked_sub(1),
        _ => None,
    }
}

/// A literal boolean argument (`true`, `false`, or a string PostgreSQL
/// reads as one).
fn flag(arg: &FunctionArg) -> Option<bool> {
    let FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(v))) = arg else {
        return None;
    };
    match &v.value {
        Value::Boolean(b) => Some(*b),
        Value::SingleQuotedString(s) => match s.to_ascii_lowercase().as_str() {
            "t" | "true" | "on" | "yes" | "1" => Some(true),
            "f" | "false" | "off" | "no" | "0" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// `SET name = 'value'` (and the key it sets) for `set_config(name,
/// value, false)`, with the name as PostgreSQL folds it (GUC names are
/// case-insensitive) and each part quoted when it is not a plain word.
pub fn set_config_statement(name: &str, value: &str) -> Option<(String, String)> {
    let key = name.to_ascii_lowercase();
    let parts: Vec<String> = key
        .split('.')
        .map(|p| {
            let plain = p
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
                && p.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if plain {
                p.to_owned()
            } else {
                format!("\"{}\"", p.replace('"', "\"\""))
            }
        })
        .collect();
    if key.is_empty()
        || parts.iter().any(|p| p == "\"\"")
        || crate::effects::temp_search_path(&key, value)
    {
        return None;
    }
    let value = if LIST_QUOTE.contains(&key.as_str()) && !value.trim().is_empty() {
        list_elements(value)?
            .iter()
            .map(|e| format!("'{}'", e.replace('\'', "''")))
            .collect::<Vec<_>>()
            .join(", ")
    } else {
        format!("'{}'", value.replace('\'', "''"))
    };
    let stmt = format!("SET {} = {value}", parts.join("."));
    Some((key, stmt))
}

/// The settings PostgreSQL reads as a list of identifiers (`GUC_LIST_QUOTE`):
/// `set_config('search_path', 'app, public', false)` sets two schemas, but
/// `SET search_path = 'app, public'` one schema named `app, public`. Their
/// value is replayed element by element.
const LIST_QUOTE: [&str; 4] = [
    "search_path",
    "temp_tablespaces",
    "local_preload_libraries",
    "session_preload_libraries",
];

/// The elements of a list setting's value as PostgreSQL splits it
/// (`SplitIdentifierString`): comma-separated, each double-quoted (`""` a
/// quote) or plain (lower-cased). `None` when it is not such a list, or a
/// plain element is not ASCII (its case folding depends on the encoding):
/// the client is pinned instead.
fn list_elements(value: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut chars = value.trim_start().chars().peekable();
    loop {
        let mut element = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next()? {
                    '"' if chars.peek() == Some(&'"') => {
                        chars.next();
                        element.push('"');
                    }
                    '"' => break,
                    c => element.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ',' || c.is_whitespace() {
                    break;
                }
                if !c.is_ascii() || c == '"' {
                    return None;
                }
                element.push(c.to_ascii_lowercase());
                chars.next();
            }
            if element.is_empty() {
                return None;
            }
        }
        out.push(element);
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        match chars.next() {
            None => return Some(out),
            Some(',') => {
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
            }
            Some(_) => return None,
        }
    }
}

impl Calls {
    /// A call of `set_config` with `args` (`None`: no argument list).
    fn call(&mut self, args: Option<&[FunctionArg]>) {
        let Some(args) = args else {
            self.effects.push(Effect::Pin("set_config"));
            return;
        };
        let effect = match args {
            [name, value, local] => match (flag(local), text(name), text(value)) {
                // A transaction-local search_path naming pg_temp: a table
                // made while it lasts stays temporary (`effects.rs`).
                (Some(true), Some(name), Some(value))
                    if !crate::effects::temp_search_path(&name.to_ascii_lowercase(), &value) =>
                {
                    None
                }
                (Some(true), Some(name), None) if !name.eq_ignore_ascii_case("search_path") => None,
                (Some(false), Some(name), Some(value)) => {
                    match set_config_statement(&name, &value) {
                        Some((key, stmt)) => Some(Effect::Set { key, stmt }),
                        None => Some(Effect::Pin("set_config")),
                    }
                }
                (Some(false), Some(name), None) => match param(value) {
                    Some(param) if set_config_statement(&name, "").is_some() => {
                        Some(Effect::SetParam { name, param })
                    }
                    _ => Some(Effect::Pin("set_config")),
                },
                _ => Some(Effect::Pin("set_config")),
            },
            _ => Some(Effect::Pin("set_config")),
        };
        self.effects.extend(effect);
    }
}

impl Visitor for Calls {
    type Break = ();

    fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
        if let Expr::Function(f) = e {
            if function_name(&f.name) == "set_config" {
                match &f.args {
                    FunctionArguments::List(list) => self.call(Some(&list.args)),
                    _ => self.call(None),
                }
            }
        }
        ControlFlow::Continue(())
    }

    /// `SELECT * FROM set_config(...)`: a call in the FROM list.
    fn pre_visit_table_factor(&mut self, t: &TableFactor) -> ControlFlow<()> {
        match t {
            TableFactor::Table {
                name,
                args: Some(args),
                ..
            } if function_name(name) == "set_config" => self.call(Some(&args.args)),
            TableFactor::Function { name, args, .. } if function_name(name) == "set_config" => {
                self.call(Some(args))
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

/// The session effects of the `set_config` calls in `stmts` (none when
/// there are none, or all are transaction-local).
pub(crate) fn effects(stmts: &[Statement]) -> Vec<Effect> {
    let mut v = Calls {
        effects: Vec::new(),
    };
    for s in stmts {
        let _ = s.visit(&mut v);
    }
    v.effects
}

#[cfg(test)]
mod tests {
    use crate::{Classifier, ClassifierConfig, Decision, Dialect, Effect};

    fn effects(sql: &str) -> (Decision, Vec<Effect>) {
        let c = Classifier::new(Dialect::Postgres, &ClassifierConfig::default());
        let u = c.classify_unit(sql);
        (u.decision, u.effects.iter().cloned().collect())
    }

    #[test]
    fn a_session_set_config_is_a_set_and_a_local_one_nothing() {
        assert_eq!(
            effects("select set_config('app.tenant', '42', false)"),
            (
                Decision::Primary,
                vec![Effect::Set {
                    key: "app.tenant".into(),
                    stmt: "SET app.tenant = '42'".into()
                }]
            )
        );
        assert_eq!(
            effects("SELECT set_config('App.Tenant', 'o''k', 'off')").1,
            vec![Effect::Set {
                key: "app.tenant".into(),
                stmt: "SET app.tenant = 'o''k'".into()
            }]
        );
        assert_eq!(effects("SELECT set_config('app.x', '1', true)").1, vec![]);
        assert_eq!(
            effects("SELECT set_config('my-app.x', '1', false)").1,
            vec![Effect::Set {
                key: "my-app.x".into(),
                stmt: "SET \"my-app\".x = '1'".into()
            }]
        );
    }

    #[test]
    fn a_bound_value_is_a_set_read_from_the_bind() {
        assert_eq!(
            effects("select set_config('app.tenant', $1, false)").1,
            vec![Effect::SetParam {
                name: "app.tenant".into(),
                param: 0
            }]
        );
        assert_eq!(
            effects("SELECT 1, set_config('App.X', $2, 'f')").1,
            vec![Effect::SetParam {
                name: "App.X".into(),
                param: 1
            }]
        );
        assert_eq!(effects("SELECT set_config('app.x', $1, true)").1, vec![]);
        assert_eq!(
            super::set_config_statement("App.X", "it's"),
            Some(("app.x".into(), "SET app.x = 'it''s'".into()))
        );
    }

    #[test]
    fn a_set_config_that_cannot_be_replayed_pins() {
        for sql in [
            "SELECT set_config(name, '1', false) FROM t",
            "SELECT set_config('app.x', '1', $1)",
            "SELECT set_config('app.x', v, false) FROM t",
            "SELECT set_config('app.x', '1')",
            "SELECT set_config($1, $2, false)",
            "SELECT set_config('app.x', $1::text, false)",
        ] {
            assert_eq!(effects(sql).1, vec![Effect::Pin("set_config")], "{sql}");
        }
    }
}
