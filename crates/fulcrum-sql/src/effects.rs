//! What each statement of a unit does to the client's session, reported by
//! the classifier in the same pass as the routing decision: settings to
//! replay on every server connection the client uses (SET, RESET, RESET ALL,
//! DISCARD ALL), prepared names dropped (DEALLOCATE), state that pins the
//! client to its server connection, and the transaction control that decides
//! whether settings made inside a block survive it. Derived from sqlparser's
//! AST; a statement sqlparser cannot parse is read by its first words.

use std::sync::Arc;

use sqlparser::ast::{DiscardObject, ObjectName, Set, Statement};

use crate::decision::{Decision, PinReason};
use crate::statements::{head_words, skip_space_and_comments};

/// What one statement does to the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// `SET [SESSION] key ...`: replay `stmt` on every server connection used.
    Set {
        key: String,
        stmt: String,
    },
    /// `RESET key`.
    Reset {
        key: String,
    },
    /// `RESET ALL`.
    ResetAll,
    /// `DISCARD ALL`: resets parameters and drops prepared statements.
    DiscardAll,
    /// `DEALLOCATE [PREPARE] name` (None = ALL).
    Deallocate(Option<String>),
    /// `set_config('name', $n, false)`: a `SET` whose value is the unit's
    /// bound parameter `param` (0-based), made a [`Effect::Set`] when the
    /// Bind carrying it is read (`set_config_statement`).
    SetParam {
        name: String,
        param: usize,
    },
    /// State that cannot be replayed: keep this client on its server connection.
    Pin(PinReason),
    /// State no later unit of this client needs but another client must not
    /// see (a sequence's `currval` after `nextval`/`setval`): the server
    /// connection is reset before anyone else uses it. No pin.
    ResetBeforeReuse(PinReason),
    /// `UNLISTEN channel` (`None`: `UNLISTEN *`): the client stops listening
    /// (Fulcrum listens for it in transaction pooling).
    Unlisten(Option<String>),
    /// `NOTIFY` or `pg_notify()`: the server connection's notifications come
    /// from this client (so they can carry the pid Fulcrum gave it).
    Notifies,
    /// Transaction control, so SETs inside a rolled-back block are dropped.
    Begin,
    Commit,
    Rollback,
}

/// The effects of a unit's statements, in order. Cheap to clone: most units
/// have none, and the rest share one allocation with the decision cache.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effects(Option<Arc<[Effect]>>);

impl Effects {
    pub fn new(list: Vec<Effect>) -> Effects {
        if list.is_empty() {
            Effects(None)
        } else {
            Effects(Some(list.into()))
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Effect> {
        self.0.as_deref().unwrap_or(&[]).iter()
    }

    pub fn to_vec(&self) -> Vec<Effect> {
        self.iter().cloned().collect()
    }

    /// True when an effect carries literal text (a SET's statement), so the
    /// unit's effects cannot be shared by every text of its fingerprint.
    pub(crate) fn carry_text(&self) -> bool {
        self.iter()
            .any(|e| matches!(e, Effect::Set { .. } | Effect::SetParam { .. }))
    }
}

/// The effect of one parsed PostgreSQL statement whose routing decision is
/// `decision`; `text` is the statement as the client wrote it.
pub(crate) fn of_statement(stmt: &Statement, decision: Decision, text: &str) -> Option<Effect> {
    let set = |key: String| set_or_pin(key, skip_space_and_comments(text).trim_end().to_owned());
    // SET LOCAL too: a table made while it lasts stays temporary.
    if matches!(stmt, Statement::Set(_))
        && contains_ci(text, "search_path")
        && temp_search_path("search_path", text)
    {
        return Some(Effect::Pin(TEMP_SEARCH_PATH));
    }
    let own = match stmt {
        // Several session defaults at once: replaying them by key could
        // reorder them against later SETs, so the client keeps its connection.
        Statement::Set(Set::SetTransaction { session: true, .. }) => {
            Some(Effect::Pin("SET SESSION CHARACTERISTICS"))
        }
        Statement::Set(Set::SetTimeZone { local: false, .. }) => Some(set("timezone".into())),
        Statement::Set(Set::SetNames { .. } | Set::SetNamesDefault {}) => {
            Some(set("client_encoding".into()))
        }
        Statement::Set(Set::SingleAssignment { variable, .. }) if decision == Decision::Set => {
            Some(set(setting_name(variable)))
        }
        Statement::Set(Set::MultipleAssignments { assignments }) if decision == Decision::Set => {
            let names: Vec<String> = assignments.iter().map(|a| setting_name(&a.name)).collect();
            Some(set(names.join(",")))
        }
        Statement::Reset(r) => match &r.reset {
            sqlparser::ast::Reset::ALL => Some(Effect::ResetAll),
            sqlparser::ast::Reset::ConfigurationParameter(p) if decision == Decision::Set => {
                Some(Effect::Reset {
                    key: setting_name(p),
                })
            }
            _ => None,
        },
        Statement::Discard {
            object_type: DiscardObject::ALL,
        } => Some(Effect::DiscardAll),
        Statement::Deallocate { name, .. } => Some(Effect::Deallocate(
            if name.quote_style.is_none() && name.value.eq_ignore_ascii_case("all") {
                None
            } else {
                Some(ident_name(name))
            },
        )),
        Statement::UNLISTEN { channel } => Some(Effect::Unlisten(
            if channel.quote_style.is_none() && channel.value == "*" {
                None
            } else {
                Some(crate::listen::fold(&channel.value, channel.quote_style))
            },
        )),
        Statement::StartTransaction { .. } => Some(Effect::Begin),
        Statement::Commit { .. } => Some(Effect::Commit),
        Statement::Rollback {
            savepoint: None, ..
        } => Some(Effect::Rollback),
        _ => None,
    };
    own.or(match decision {
        Decision::Pin(reason) => Some(Effect::Pin(reason)),
        _ => None,
    })
}

/// A setting's name as PostgreSQL folds it: unquoted parts lower case,
/// quoted ones as written.
fn setting_name(name: &ObjectName) -> String {
    let parts: Vec<String> = name
        .0
        .iter()
        .map(|p| match p.as_ident() {
            Some(ident) => ident_name(ident),
            None => p.to_string(),
        })
        .collect();
    let key = parts.join(".");
    match key.as_str() {
        "time zone" => "timezone".into(),
        _ => key,
    }
}

fn ident_name(ident: &sqlparser::ast::Ident) -> String {
    if ident.quote_style.is_some() {
        ident.value.clone()
    } else {
        ident.value.to_ascii_lowercase()
    }
}

/// The effect of a PostgreSQL statement sqlparser could not parse, read from
/// its first words.
pub(crate) fn of_words(stmt: &str) -> Option<Effect> {
    let w = head_words(stmt, 6);
    let word = |i: usize| w.get(i).map(String::as_str).unwrap_or("");
    match word(0) {
        "set" => {
            let mut i = 1;
            if word(1) == "session" {
                match word(2) {
                    "authorization" => return Some(Effect::Pin("SET SESSION AUTHORIZATION")),
                    "characteristics" => return Some(Effect::Pin("SET SESSION CHARACTERISTICS")),
                    _ => i = 2,
                }
            }
            let key = match word(i) {
                "local"
                    if matches!(word(i + 1), "schema" | "search_path")
                        && temp_search_path("search_path", stmt) =>
                {
                    return Some(Effect::Pin(TEMP_SEARCH_PATH))
                }
                "local" | "transaction" | "constraints" | "" => return None,
                "role" => return Some(Effect::Pin("SET ROLE")),
                "time" if word(i + 1) == "zone" => "timezone".to_owned(),
                "schema" => "search_path".to_owned(),
                "names" => "client_encoding".to_owned(),
                "xml" if word(i + 1) == "option" => "xmloption".to_owned(),
                k => k.to_owned(),
            };
            Some(set_or_pin(
                key,
                skip_space_and_comments(stmt).trim_end().to_owned(),
            ))
        }
        "reset" => match word(1) {
            "all" => Some(Effect::ResetAll),
            "role" => Some(Effect::Pin("RESET ROLE")),
            "session" => Some(Effect::Pin("RESET SESSION AUTHORIZATION")),
            "" => None,
            "time" if word(2) == "zone" => Some(Effect::Reset {
                key: "timezone".into(),
            }),
            k => Some(Effect::Reset { key: k.to_owned() }),
        },
        "discard" if word(1) == "all" => Some(Effect::DiscardAll),
        "discard" if matches!(word(1), "temp" | "temporary") => Some(Effect::Pin("DISCARD TEMP")),
        "deallocate" => {
            let name = if word(1) == "prepare" {
                word(2)
            } else {
                word(1)
            };
            match name {
                "" => None,
                "all" => Some(Effect::Deallocate(None)),
                n => Some(Effect::Deallocate(Some(n.to_owned()))),
            }
        }
        "begin" | "start" => Some(Effect::Begin),
        "commit" | "end" => Some(Effect::Commit),
        "rollback" | "abort" if word(1) != "to" && word(2) != "to" => Some(Effect::Rollback),
        "prepare" if word(1) == "transaction" => Some(Effect::Rollback),
        "prepare" => Some(Effect::Pin("SQL PREPARE")),
        "listen" => Some(Effect::Pin("LISTEN")),
        "declare" if contains_ci(stmt, "with hold") => Some(Effect::Pin("cursor WITH HOLD")),
        "create"
            if matches!(word(1), "temp" | "temporary")
                || (matches!(word(1), "local" | "global")
                    && matches!(word(2), "temp" | "temporary")) =>
        {
            Some(Effect::Pin("temporary table"))
        }
        _ if contains_ci(stmt, "pg_advisory_lock") || contains_ci(stmt, "pg_try_advisory_lock") => {
            Some(Effect::Pin("session advisory lock"))
        }
        _ => None,
    }
}

/// Why a `search_path` naming the temporary schema pins.
pub(crate) const TEMP_SEARCH_PATH: PinReason = "search_path naming pg_temp";

/// Whether setting `key` to what `text` says may put the temporary schema
/// on the search path: a plain `CREATE TABLE t` then makes a temporary
/// table that no `pg_temp.` in its text shows (a string literal is not the
/// identifier `temp_schema.rs` looks for).
/// Text that escapes characters (`E'pg\x5ftemp'`, `U&'pg\005ftemp'`) may
/// spell it too: it counts as naming it.
pub(crate) fn temp_search_path(key: &str, text: &str) -> bool {
    key == "search_path"
        && (contains_ci(text, "pg_temp") || text.contains('\\') || contains_ci(text, "u&"))
}

/// `SET key ...` (`stmt`) replayed, or a pin when it names `pg_temp` on
/// the search path ([`temp_search_path`]).
fn set_or_pin(key: String, stmt: String) -> Effect {
    if temp_search_path(&key, &stmt) {
        Effect::Pin(TEMP_SEARCH_PATH)
    } else {
        Effect::Set { key, stmt }
    }
}

fn contains_ci(hay: &str, needle: &str) -> bool {
    hay.as_bytes()
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

#[cfg(test)]
mod tests;
