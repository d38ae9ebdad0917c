//! `auth_query`: the stored password of a user who is not in the config,
//! fetched from the primary as `auth_user` and cached per user for
//! `auth_cache_ttl` (an unknown user for a few seconds, so a flood of made-up
//! names does not reach the server). The login then checks the client
//! against it and keeps what the client proved (the SCRAM ClientKey, or the
//! md5 hash) to log in to the servers as that user.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use thiserror::Error;

use super::context::ClusterContext;
use crate::auth::secret::StoredSecret;
use crate::backend::{connect, Credential, ServerTarget, ServerTlsTarget};

/// How long "no such user" is remembered (or `auth_cache_ttl`, if shorter).
const NEGATIVE_TTL: Duration = Duration::from_secs(5);
/// Users cached at most; a full cache drops its expired entries, then all.
const MAX_ENTRIES: usize = 10_000;

#[derive(Debug, Error)]
pub enum AuthQueryError {
    #[error("no primary to run auth_query on")]
    NoPrimary,
    #[error("auth_user cannot log in: {0}")]
    Login(String),
    #[error("auth_query failed: {0}")]
    Query(String),
}

struct Entry {
    secret: Option<StoredSecret>,
    fetched: Instant,
}

/// A secret and whether it came from the cache (a failed login then
/// drops it, so a changed password is fetched at the next attempt).
pub struct Looked {
    pub secret: Option<StoredSecret>,
    pub cached: bool,
}

#[derive(Default)]
pub struct AuthCache {
    entries: Mutex<HashMap<String, Entry>>,
    /// What each auth_query user last proved, for the pools' logins.
    proven: Mutex<HashMap<String, Credential>>,
}

impl AuthCache {
    /// The stored secret of `user` (`None`: no such user, or no password).
    pub async fn lookup(&self, ctx: &ClusterContext, user: &str) -> Result<Looked, AuthQueryError> {
        let Some(aq) = &ctx.config.auth_query else {
            return Ok(Looked {
                secret: None,
                cached: false,
            });
        };
        {
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = entries.get(user) {
                let ttl = match e.secret {
                    Some(_) => aq.cache_ttl,
                    None => NEGATIVE_TTL.min(aq.cache_ttl),
                };
                if e.fetched.elapsed() < ttl {
                    return Ok(Looked {
                        secret: e.secret.clone(),
                        cached: true,
                    });
                }
            }
        }
        let secret = fetch(ctx, user).await?;
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= MAX_ENTRIES {
            entries.retain(|_, e| e.fetched.elapsed() < aq.cache_ttl);
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(
            user.to_owned(),
            Entry {
                secret: secret.clone(),
                fetched: Instant::now(),
            },
        );
        Ok(Looked {
            secret,
            cached: false,
        })
    }

    /// Drops `user`'s cached secret.
    pub fn forget(&self, user: &str) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(user);
    }

    /// Keeps what `user`'s client proved, for server logins.
    pub fn remember_proof(&self, user: &str, credential: Credential) {
        self.proven
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(user.to_owned(), credential);
    }

    /// What `user`'s clients last proved.
    pub fn proof(&self, user: &str) -> Option<Credential> {
        self.proven
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(user)
            .cloned()
    }
}

/// `text` as a SQL string literal (PostgreSQL's quote_literal: quotes
/// doubled; with a backslash, an E'' literal with backslashes doubled).
pub fn quote_literal(text: &str) -> String {
    let quoted = text.replace('\'', "''");
    if text.contains('\\') {
        format!("E'{}'", quoted.replace('\\', "\\\\"))
    } else {
        format!("'{quoted}'")
    }
}

/// Runs `auth_query` for `user` on the primary.
async fn fetch(ctx: &ClusterContext, user: &str) -> Result<Option<StoredSecret>, AuthQueryError> {
    let aq = ctx.config.auth_query.as_ref().expect("checked by lookup");
    // The primary the health loop knows, else the configured one (a probe
    // whose own login fails must not stop every auth_query login).
    let primary = ctx
        .router
        .primary()
        .or_else(|| {
            ctx.config
                .backends
                .iter()
                .position(|b| b.role == fulcrum_config::Role::Primary)
        })
        .ok_or(AuthQueryError::NoPrimary)?;
    let target = ServerTarget {
        address: ctx.backends[primary].clone(),
        user: aq.user.clone(),
        credential: Credential::Password(aq.password.clone()),
        database: aq.database.clone(),
        allow_cleartext: ctx.config.server_cleartext,
        tls: ctx
            .config
            .backends
            .get(primary)
            .and_then(|b| ServerTlsTarget::from_config(&b.tls)),
    };
    let mut conn = connect(&target, ctx.config.connect_timeout)
        .await
        .map_err(|e| AuthQueryError::Login(e.to_string()))?;
    // No user input reaches the query but as a quoted literal; a NUL byte
    // cannot be in a PostgreSQL name anyway.
    if user.contains('\0') {
        return Ok(None);
    }
    let sql = aq.query.replace("$1", &quote_literal(user));
    let rows = conn
        .query_rows(&sql)
        .await
        .map_err(|e| AuthQueryError::Query(e.to_string()))?;
    // (name, password) as pg_shadow gives them, or the password alone.
    let password = rows
        .first()
        .and_then(|row| row.get(if row.len() >= 2 { 1 } else { 0 }).cloned())
        .flatten();
    Ok(password.as_deref().and_then(StoredSecret::parse))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_quoted_like_quote_literal() {
        assert_eq!(quote_literal("app"), "'app'");
        assert_eq!(quote_literal("o'brien"), "'o''brien'");
        assert_eq!(quote_literal("a\\'; DROP"), "E'a\\\\''; DROP'");
    }
}
