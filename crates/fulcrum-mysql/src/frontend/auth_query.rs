//! `auth_query` on MariaDB / MySQL: the `mysql_native_password` hash
//! (`*` and 40 hex digits: SHA1(SHA1(password))) of a user who is not in
//! the config, fetched from the primary as `auth_user` with the login name
//! bound as a parameter, cached by `fulcrum_cluster::AuthCache`. The login
//! checks the client's scramble reply against it and keeps the SHA1(password)
//! the reply reveals, which answers the servers' native challenges as that
//! user (ProxySQL's method). Other stored plugins are not supported.

pub use fulcrum_cluster::AuthQueryError;
use mysql_async::prelude::Queryable;

use super::context::MyClusterContext;

/// SHA1(SHA1(password)) as stored, and SHA1(password) as proven.
pub type AuthCache = fulcrum_cluster::AuthCache<[u8; 20], [u8; 20]>;

/// `user`'s stored native hash: cached, or fetched.
pub async fn lookup(
    ctx: &MyClusterContext,
    user: &str,
) -> Result<fulcrum_cluster::Looked<[u8; 20]>, AuthQueryError> {
    let Some(aq) = &ctx.config.auth_query else {
        return Ok(fulcrum_cluster::Looked {
            secret: None,
            cached: false,
        });
    };
    ctx.auth.lookup(user, aq.cache_ttl, fetch(ctx, user)).await
}

async fn fetch(ctx: &MyClusterContext, user: &str) -> Result<Option<[u8; 20]>, AuthQueryError> {
    let Some(aq) = &ctx.config.auth_query else {
        return Ok(None);
    };
    let primary = fulcrum_cluster::auth_query_backend(&ctx.router, &ctx.config)?;
    let backend = &ctx.config.backends[primary];
    let connect = crate::backend::health::connect(
        &backend.address,
        &backend.tls,
        &aq.user,
        &aq.password,
        &aq.database,
    );
    let mut conn = tokio::time::timeout(ctx.config.connect_timeout, connect)
        .await
        .map_err(|_| AuthQueryError::Login("timed out".into()))?
        .map_err(|e| AuthQueryError::Login(e.to_string()))?;
    let row: Option<mysql_async::Row> = conn
        .exec_first(aq.query.as_str(), (user,))
        .await
        .map_err(|e| AuthQueryError::Query(e.to_string()))?;
    let _ = conn.disconnect().await;
    // The last column: `authentication_string` alone, or after the name.
    let stored: Option<String> = row.and_then(|r| {
        let last = r.len().checked_sub(1)?;
        r.get::<Option<String>, _>(last).flatten()
    });
    Ok(stored
        .as_deref()
        .and_then(crate::auth::native::parse_stored_hash))
}
