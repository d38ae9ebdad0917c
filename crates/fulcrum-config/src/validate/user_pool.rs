//! Validates the pool modes (`pool_mode` of a `[[cluster]]`, of a
//! `[[cluster.user]]`, of the `[[cluster.user_default]]`) and a user's own
//! `pool_size` and `max_user_connections` (PgBouncer's `[users]`).

use super::table::Table;
use crate::error::Problem;
use crate::raw::{Int, RawCluster, Value};
use crate::types::{defaults, PoolMode, Protocol, UserPool};

const POOL_MODES: &[(&str, PoolMode)] = &[
    ("session", PoolMode::Session),
    ("transaction", PoolMode::Transaction),
    ("statement", PoolMode::Statement),
];

/// What a user's keys are checked against: the cluster's protocol and its
/// `min_pool_size` (a user's pool must be able to reach it).
#[derive(Clone, Copy)]
pub(super) struct Rules {
    pub protocol: Protocol,
    pub min_pool_size: u32,
}

/// A `pool_mode` value; `statement` only on a PostgreSQL cluster (a
/// MySQL client's autocommit and transactions are read from the server's
/// status flags, which statement pooling would have to refuse on every
/// `SET autocommit = 0`).
pub(super) fn pool_mode(
    t: &Table,
    value: &Value<String>,
    protocol: Protocol,
    default: Option<PoolMode>,
) -> Result<Option<PoolMode>, Problem> {
    if value.is_none() {
        return Ok(default);
    }
    let mode = t.choice(value, "pool_mode", POOL_MODES, None)?;
    if let (PoolMode::Statement, Protocol::Mysql, Some(v)) = (mode, protocol, value) {
        return Err(t.error(
            v,
            "pool_mode",
            "pool_mode = statement is for postgres clusters; use \"transaction\"",
        ));
    }
    Ok(Some(mode))
}

/// The cluster's `pool_mode`.
pub(super) fn cluster_pool_mode(
    t: &Table,
    c: &RawCluster,
    protocol: Protocol,
) -> Result<PoolMode, Problem> {
    Ok(
        pool_mode(t, &c.pool_mode, protocol, Some(defaults::POOL_MODE))?
            .unwrap_or(defaults::POOL_MODE),
    )
}

/// A user's (or the user default's) three keys, each `None` when absent.
pub(super) fn user_pool(
    t: &Table,
    mode: &Value<String>,
    size: &Value<Int>,
    max_user: &Value<Int>,
    rules: Rules,
) -> Result<UserPool, Problem> {
    let pool_mode = pool_mode(t, mode, rules.protocol, None)?;
    let pool_size = match size {
        None => None,
        Some(v) => {
            let n = t.u32_at_least(size, "pool_size", 1, 0)?;
            if n < rules.min_pool_size {
                let reason = format!(
                    "must be at least the cluster's min_pool_size ({})",
                    rules.min_pool_size
                );
                return Err(t.error(v, "pool_size", reason));
            }
            Some(n)
        }
    };
    // 0, as in PgBouncer's [users]: the cluster's cap.
    let max_user_connections = match max_user {
        None => None,
        Some(v) => match t.u32_at_least(max_user, "max_user_connections", 0, 0)? {
            0 => None,
            n if n < rules.min_pool_size => {
                let reason = format!(
                    "must be 0 (the cluster's) or at least the cluster's min_pool_size ({})",
                    rules.min_pool_size
                );
                return Err(t.error(v, "max_user_connections", reason));
            }
            n => Some(n),
        },
    };
    Ok(UserPool {
        pool_mode,
        pool_size,
        max_user_connections,
    })
}

/// `[[cluster.user_default]]`: one at most, and only where `auth_query`
/// finds users (elsewhere every user is listed and it would apply to nobody).
pub(super) fn user_default(t: &Table, c: &RawCluster, rules: Rules) -> Result<UserPool, Problem> {
    let Some(tables) = &c.user_default else {
        return Ok(UserPool::default());
    };
    let items = &tables.get_ref().0;
    if let Some(second) = items.get(1) {
        return Err(Problem::new(
            t.line(&second.span()),
            t.key("user_default[1]"),
            "a cluster has one [[cluster.user_default]] at most",
        ));
    }
    let Some(first) = items.first() else {
        return Ok(UserPool::default());
    };
    if c.auth_user.is_none() {
        return Err(t.error(
            first,
            "user_default[0]",
            "applies to users auth_query finds, and this cluster has no auth_user; \
             set these keys on each [[cluster.user]]",
        ));
    }
    let ut = t.child("user_default[0]", first.span());
    let d = first.get_ref();
    user_pool(
        &ut,
        &d.pool_mode,
        &d.pool_size,
        &d.max_user_connections,
        rules,
    )
}
