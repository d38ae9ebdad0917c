//! The names the cache facts are made of: relation names normalised as the
//! cache keys them, the system catalogs no read of which is kept, and the
//! per-dialect function lists (immutable built-ins, volatile or
//! session-dependent built-ins, and built-ins a write may call without
//! changing any table the cache keeps).

use sqlparser::ast::{Ident, ObjectName, ObjectNamePart};

use crate::dialect::Dialect;
use crate::functions::{pin_functions, primary_functions};

/// A relation's name as the cache holds it: each part unquoted and lower
/// case, its last two parts (`db.s.t` is `s.t`). `None` for a name part
/// sqlparser could not read as an identifier.
pub(super) fn relation(name: &ObjectName) -> Option<String> {
    let parts: Vec<&Ident> = name
        .0
        .iter()
        .map(|p| match p {
            ObjectNamePart::Identifier(i) => Some(i),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let kept = &parts[parts.len().saturating_sub(2)..];
    if kept.is_empty() || kept.iter().any(|i| i.value.is_empty()) {
        return None;
    }
    Some(
        kept.iter()
            .map(|i| i.value.to_lowercase())
            .collect::<Vec<_>>()
            .join("."),
    )
}

/// A relation (normalised by `relation`) in a system catalog, whose
/// contents change without any write the cache sees.
pub(super) fn is_system(relation: &str, dialect: Dialect) -> bool {
    let (schema, table) = match relation.rsplit_once('.') {
        Some((s, t)) => (Some(s), t),
        None => (None, relation),
    };
    match dialect {
        Dialect::Postgres => {
            table.starts_with("pg_")
                || schema.is_some_and(|s| s.starts_with("pg_") || s == "information_schema")
        }
        Dialect::MySql => schema.is_some_and(|s| {
            matches!(
                s,
                "information_schema" | "performance_schema" | "mysql" | "sys"
            )
        }),
    }
}

/// How a function call's name reads, for the lists.
pub(super) enum Called {
    /// A built-in name (unqualified, or `pg_catalog.` on PostgreSQL),
    /// lower case.
    Builtin(String),
    /// Schema-qualified: a user function by this lower-case unqualified
    /// name.
    Other(String),
    /// Quoted with upper case (`"Lower"(x)`): not the built-in its
    /// lower-case name would find, and no list can place it.
    Quoted,
}

pub(super) fn called(name: &ObjectName, dialect: Dialect) -> Called {
    let bare = crate::rules::function_name(name);
    let idents: Vec<Option<&Ident>> = name
        .0
        .iter()
        .map(|p| match p {
            ObjectNamePart::Identifier(i) => Some(i),
            _ => None,
        })
        .collect();
    let quoted_upper = idents
        .iter()
        .any(|i| i.is_none_or(|i| i.quote_style.is_some() && i.value != i.value.to_lowercase()));
    let builtin_schema = match idents.len() {
        0 | 1 => true,
        2 => {
            dialect == Dialect::Postgres
                && idents[0].is_some_and(|s| s.value.eq_ignore_ascii_case("pg_catalog"))
        }
        _ => false,
    };
    if quoted_upper {
        Called::Quoted
    } else if builtin_schema {
        Called::Builtin(bare)
    } else {
        Called::Other(bare)
    }
}

/// Built-ins whose result depends only on their arguments (PostgreSQL 15
/// `provolatile = 'i'`; MySQL deterministic), and the aggregates over them.
pub(super) fn immutable(name: &str, dialect: Dialect) -> bool {
    const BOTH: &[&str] = &[
        "abs",
        "lower",
        "upper",
        "length",
        "char_length",
        "octet_length",
        "coalesce",
        "nullif",
        "greatest",
        "least",
        "round",
        "floor",
        "ceil",
        "ceiling",
        "sqrt",
        "mod",
        "power",
        "substr",
        "substring",
        "ltrim",
        "rtrim",
        "trim",
        "left",
        "right",
        "md5",
        "replace",
        "reverse",
        "repeat",
        "lpad",
        "rpad",
        "sign",
        "row",
        "count",
        "sum",
        "min",
        "max",
        "avg",
    ];
    const POSTGRES: &[&str] = &[
        "trunc",
        "btrim",
        "split_part",
        "strpos",
        "bool_and",
        "bool_or",
        "every",
        "string_agg",
        "array_agg",
        "initcap",
        "ascii",
        "chr",
        "translate",
        "exp",
        "ln",
        "div",
        "cbrt",
        "starts_with",
        "to_hex",
        "bit_length",
    ];
    const MYSQL: &[&str] = &[
        "ifnull",
        "if",
        "lcase",
        "ucase",
        "character_length",
        "truncate",
        "pow",
        "concat",
        "concat_ws",
        "locate",
        "instr",
        "ascii",
        "exp",
        "ln",
        "hex",
    ];
    BOTH.contains(&name)
        || match dialect {
            Dialect::Postgres => POSTGRES.contains(&name),
            Dialect::MySql => MYSQL.contains(&name),
        }
}

/// Built-ins whose result depends on the time, chance, the session or the
/// server: a read calling one is never kept.
pub(super) fn volatile(name: &str, dialect: Dialect) -> bool {
    const BOTH: &[&str] = &[
        "now",
        "current_timestamp",
        "current_date",
        "current_time",
        "localtime",
        "localtimestamp",
        "current_user",
        "session_user",
        "user",
        "system_user",
        "current_role",
        "random",
        "rand",
        "uuid",
        "nextval",
        "currval",
        "lastval",
        "setval",
        "version",
        "sleep",
    ];
    const POSTGRES: &[&str] = &[
        "clock_timestamp",
        "statement_timestamp",
        "transaction_timestamp",
        "timeofday",
        "current_setting",
        "current_catalog",
        "current_schema",
        "current_schemas",
        "current_database",
        "current_query",
        "inet_client_addr",
        "inet_client_port",
        "inet_server_addr",
        "inet_server_port",
        "gen_random_uuid",
        "setseed",
        "set_config",
        "txid_current",
        "txid_current_if_assigned",
        "age",
        "to_regclass",
        "lo_get",
    ];
    const MYSQL: &[&str] = &[
        "curdate",
        "curtime",
        "sysdate",
        "utc_date",
        "utc_time",
        "utc_timestamp",
        "unix_timestamp",
        "database",
        "schema",
        "connection_id",
        "last_insert_id",
        "found_rows",
        "row_count",
        "uuid_short",
        "benchmark",
        "get_lock",
        "release_lock",
        "is_free_lock",
        "is_used_lock",
        "master_pos_wait",
        "master_gtid_wait",
        "load_file",
        "sys_guid",
        "random_bytes",
    ];
    name.starts_with("pg_")
        || name.starts_with("has_")
        || name.starts_with("txid_")
        || BOTH.contains(&name)
        || primary_functions(dialect).contains(&name)
        || pin_functions(dialect).contains(&name)
        || match dialect {
            Dialect::Postgres => POSTGRES.contains(&name),
            Dialect::MySql => MYSQL.contains(&name),
        }
}

/// Built-ins a write may call without changing any table the cache keeps
/// (besides the immutable ones): the time, chance, sequences, the session,
/// locks and notifications, formatting.
pub(super) fn harmless_in_write(name: &str, dialect: Dialect) -> bool {
    const BOTH: &[&str] = &[
        "now",
        "current_timestamp",
        "current_date",
        "current_time",
        "localtime",
        "localtimestamp",
        "current_user",
        "session_user",
        "user",
        "random",
        "rand",
        "uuid",
        "nextval",
        "currval",
        "lastval",
        "setval",
        "concat",
        "concat_ws",
        "date",
        "extract",
        "cast",
    ];
    const POSTGRES: &[&str] = &[
        "clock_timestamp",
        "statement_timestamp",
        "transaction_timestamp",
        "gen_random_uuid",
        "current_setting",
        "to_char",
        "to_date",
        "to_timestamp",
        "to_number",
        "date_trunc",
        "date_part",
        "format",
        "to_json",
        "to_jsonb",
        "json_build_object",
        "jsonb_build_object",
        "json_build_array",
        "jsonb_build_array",
        "txid_current",
        "pg_current_xact_id",
        "generate_series",
        "unnest",
    ];
    const MYSQL: &[&str] = &[
        "curdate",
        "curtime",
        "sysdate",
        "utc_timestamp",
        "unix_timestamp",
        "from_unixtime",
        "date_format",
        "date_add",
        "date_sub",
        "uuid_short",
        "last_insert_id",
        "values",
        "json_object",
        "json_array",
    ];
    immutable(name, dialect)
        || BOTH.contains(&name)
        || primary_functions(dialect).contains(&name)
        || pin_functions(dialect).contains(&name)
        || match dialect {
            Dialect::Postgres => POSTGRES.contains(&name),
            Dialect::MySql => MYSQL.contains(&name),
        }
}

/// SQL value functions written without parentheses, which sqlparser may
/// read as a plain identifier (`SELECT current_user`).
pub(super) fn value_function(ident: &Ident, dialect: Dialect) -> bool {
    if ident.quote_style.is_some() {
        return false;
    }
    let name = ident.value.to_ascii_lowercase();
    let both = matches!(
        name.as_str(),
        "current_timestamp"
            | "current_date"
            | "current_time"
            | "localtime"
            | "localtimestamp"
            | "current_user"
    );
    both || match dialect {
        Dialect::Postgres => matches!(
            name.as_str(),
            "user"
                | "session_user"
                | "system_user"
                | "current_role"
                | "current_catalog"
                | "current_schema"
        ),
        Dialect::MySql => matches!(name.as_str(), "utc_date" | "utc_time" | "utc_timestamp"),
    }
}

/// PostgreSQL date/time input strings that read the clock when cast
/// (`'now'::timestamp`, `date 'today'`).
pub(super) fn clock_literal(s: &str) -> bool {
    matches!(
        s.trim().to_ascii_lowercase().as_str(),
        "now" | "today" | "tomorrow" | "yesterday"
    )
}
