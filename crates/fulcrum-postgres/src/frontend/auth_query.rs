//! `auth_query` on PostgreSQL: the stored password of a user who is not in
//! the config, fetched from the primary as `auth_user` (cached by
//! `fulcrum_cluster::AuthCache`). The login then checks the client against
//! it and keeps what the client proved (the SCRAM ClientKey, or the md5
//! hash) to log in to the servers as that user.

pub use fulcrum_cluster::AuthQueryError;

use super::context::ClusterContext;
use crate::auth::secret::StoredSecret;
use crate::backend::{connect, Credential, ServerConn, ServerTarget, ServerTlsTarget};

/// The cache of fetched secrets and of what clients proved, and the
/// pooled `auth_user` connections.
pub type AuthCache = fulcrum_cluster::AuthCache<StoredSecret, Credential, ServerConn>;

/// Looks `user` up for a client at `peer`: the cached secret, or
/// `auth_query` run on the primary (bounded as `fulcrum_cluster::AuthCache`
/// says).
pub async fn lookup(
    ctx: &ClusterContext,
    user: &str,
    peer: Option<std::net::IpAddr>,
) -> Result<fulcrum_cluster::Looked<StoredSecret>, AuthQueryError> {
    ctx.auth_lookup(&ctx.auth, user, peer, |primary, conn| {
        fetch(ctx, primary, user, conn)
    })
    .await
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

/// Runs `auth_query` for `user` on `primary`, over `conn` if given (an
/// idle `auth_user` connection to it), else a new one; gives back the
/// connection unless it failed.
async fn fetch(
    ctx: &ClusterContext,
    primary: fulcrum_pool::BackendId,
    user: &str,
    conn: Option<ServerConn>,
) -> (
    Result<Option<StoredSecret>, AuthQueryError>,
    Option<ServerConn>,
) {
    let Some(aq) = ctx.config.auth_query.as_ref() else {
        return (Ok(None), conn);
    };
    // No user input reaches the query but as a quoted literal; a NUL byte
    // cannot be in a PostgreSQL name anyway.
    if user.contains('\0') {
        return (Ok(None), conn);
    }
    let mut conn = match conn {
        Some(c) => c,
        None => {
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
            match connect(&target, ctx.config.connect_timeout).await {
                Ok(c) => c,
                Err(e) => return (Err(AuthQueryError::Login(e.to_string())), None),
            }
        }
    };
    let sql = aq.query.replace("$1", &quote_literal(user));
    let rows = match tokio::time::timeout(ctx.config.connect_timeout, conn.query_rows(&sql)).await {
        Ok(Ok(rows)) => rows,
        Ok(Err(e)) => return (Err(AuthQueryError::Query(e.to_string())), None),
        Err(_) => return (Err(AuthQueryError::Query("timed out".into())), None),
    };
    // (name, password) as pg_shadow gives them, or the password alone.
    let password = rows
        .first()
        .and_then(|row| row.get(if row.len() >= 2 { 1 } else { 0 }).cloned())
        .flatten();
    (
        Ok(password.as_deref().and_then(StoredSecret::parse)),
        Some(conn),
    )
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
