//! Validates a `[[cluster]]`'s health-loop keys: probe interval, timeout
//! and login, `max_lag`, and the failover settings (`failover`,
//! `failover_max_lag`, `failover_timeout`, `failover_command`).

use super::table::Table;
use crate::error::Problem;
use crate::raw::{RawCluster, SizeValue};
use crate::types::{defaults, Failover, Health, MaxLag, Protocol, User};
use crate::units::{parse_duration, parse_size};

const FAILOVERS: &[(&str, Failover)] = &[
    ("none", Failover::None),
    ("follow", Failover::Follow),
    ("promote", Failover::Promote),
];

/// The health-loop keys. The probe logs in as `health_user` (default: the
/// cluster's first user with a password, not a hash, with that password).
pub(super) fn health(
    t: &Table,
    c: &RawCluster,
    protocol: Protocol,
    users: &[User],
    auth: Option<&crate::types::AuthQuery>,
    base: &std::path::Path,
) -> Result<Health, Problem> {
    let interval = t.duration(
        &c.health_interval,
        "health_interval",
        defaults::HEALTH_INTERVAL,
    )?;
    let timeout = t.duration(
        &c.health_timeout,
        "health_timeout",
        defaults::HEALTH_TIMEOUT,
    )?;
    let failures = t.u32_at_least(
        &c.health_failures,
        "health_failures",
        1,
        defaults::HEALTH_FAILURES,
    )?;
    // A user whose password is given as a hash cannot log in by itself
    // (the probe runs before any client): the first user with a password.
    let first = users
        .iter()
        .find(|u| u.server_hash().is_none())
        .map(|u| u.server_user())
        .or(auth.map(|a| a.user.as_str()))
        .or(users.first().map(|u| u.server_user()))
        .unwrap_or_default();
    let user = t.text(&c.health_user, "health_user", Some(first))?;
    let password = match &c.health_password {
        Some(p) => t.secret(p, "health_password", base)?,
        None => health_password(t, c, users, auth, &user)?,
    };
    let default_db = match protocol {
        Protocol::Postgres => defaults::HEALTH_DATABASE_POSTGRES,
        Protocol::Mysql => defaults::HEALTH_DATABASE_MYSQL,
    };
    let database = t.text(&c.health_database, "health_database", Some(default_db))?;
    let max_lag = match &c.max_lag {
        None => None,
        Some(v) => Some(parse_max_lag(v.get_ref()).map_err(|e| t.error(v, "max_lag", e))?),
    };
    let failover = t.choice(&c.failover, "failover", FAILOVERS, Some(defaults::FAILOVER))?;
    let failover_max_lag = match &c.failover_max_lag {
        Some(v) => parse_max_lag(v.get_ref()).map_err(|e| t.error(v, "failover_max_lag", e))?,
        None => max_lag_default(max_lag, protocol),
    };
    let failover_timeout = t.duration(
        &c.failover_timeout,
        "failover_timeout",
        defaults::FAILOVER_TIMEOUT,
    )?;
    let failover_command = match &c.failover_command {
        None => None,
        Some(_) => Some(t.text(&c.failover_command, "failover_command", None)?),
    };
    Ok(Health {
        interval,
        timeout,
        failures,
        user,
        password,
        database,
        max_lag,
        failover,
        failover_max_lag,
        failover_timeout,
        failover_command,
    })
}

/// `failover_max_lag` when not set: `max_lag` if set, else 16 MB of WAL
/// (PostgreSQL) or 16 s of replay age (MariaDB, whose distance is counted in
/// transactions, not bytes).
fn max_lag_default(max_lag: Option<MaxLag>, protocol: Protocol) -> MaxLag {
    max_lag.unwrap_or(match protocol {
        Protocol::Postgres => MaxLag::Bytes(16 * 1024 * 1024),
        Protocol::Mysql => MaxLag::Time(std::time::Duration::from_secs(16)),
    })
}

/// `max_lag`: a duration (`"2s"`) or a size (`"16MB"`, or a byte count).
fn parse_max_lag(v: &SizeValue) -> Result<MaxLag, String> {
    let lag = match v {
        SizeValue::Bytes(n) => {
            MaxLag::Bytes(u64::try_from(*n).map_err(|_| format!("must not be negative, got {n}"))?)
        }
        SizeValue::Text(text) => {
            let unit = text.trim().trim_start_matches(|c: char| c.is_ascii_digit());
            let unit = unit.trim();
            if ["us", "ms", "s", "m", "h"].contains(&unit) {
                MaxLag::Time(parse_duration(text)?)
            } else {
                MaxLag::Bytes(parse_size(text).map_err(|e| {
                    format!("{e}; or a duration such as \"2s\" for a limit in time")
                })?)
            }
        }
    };
    match lag {
        MaxLag::Bytes(0) => Err("must be greater than zero".into()),
        MaxLag::Time(d) if d.is_zero() => Err("must be greater than zero".into()),
        lag => Ok(lag),
    }
}

/// `health_user`'s password when `health_password` is not set: its
/// `[[cluster.user]]` server login's, or `auth_user`'s; none (empty) for a
/// login the file does not know. A user whose password is given as a
/// hash is refused: the probe could not log in.
fn health_password(
    t: &Table,
    c: &RawCluster,
    users: &[User],
    auth: Option<&crate::types::AuthQuery>,
    user: &str,
) -> Result<String, Problem> {
    let mine = users.iter().filter(|u| u.server_user() == user);
    if let Some(u) = mine.clone().find(|u| u.server_hash().is_none()) {
        return Ok(u.server_password().to_owned());
    }
    if let Some(a) = auth.filter(|a| a.user == user) {
        return Ok(a.password.clone());
    }
    if let Some(hash) = mine.filter_map(User::server_hash).next() {
        let reason = format!(
            "{user:?}'s [[cluster.user]] password is {}, which cannot log in by itself (the health probe runs before any client): set health_password, or a health_user with a password",
            hash.kind()
        );
        return Err(match &c.health_user {
            Some(v) => t.error(v, "health_user", reason),
            None => t.error_at_header("health_user", reason),
        });
    }
    Ok(String::new())
}
