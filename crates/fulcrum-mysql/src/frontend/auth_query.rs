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

/// SHA1(SHA1(password)) as stored, SHA1(password) as proven, and the
/// pooled `auth_user` connections.
pub type AuthCache = fulcrum_cluster::AuthCache<[u8; 20], [u8; 20], mysql_async::Conn>;

/// `user`'s stored native hash for a client at `peer`: cached, or fetched
/// (bounded as `fulcrum_cluster::AuthCache` says).
pub async fn lookup(
    ctx: &MyClusterContext,
    user: &str,
    peer: Option<std::net::IpAddr>,
) -> Result<fulcrum_cluster::Looked<[u8; 20]>, AuthQueryError> {
    ctx.auth_lookup(&ctx.auth, user, peer, |primary, conn| {
        fetch(ctx, primary, user, conn)
    })
    .await
}

/// Runs `auth_query` for `user` on `primary`, over `conn` if given (an
/// idle `auth_user` connection to it), else a new one; gives back the
/// connection unless it failed.
async fn fetch(
    ctx: &MyClusterContext,
    primary: fulcrum_pool::BackendId,
    user: &str,
    conn: Option<mysql_async::Conn>,
) -> (
    Result<Option<[u8; 20]>, AuthQueryError>,
    Option<mysql_async::Conn>,
) {
    let Some(aq) = &ctx.config.auth_query else {
        return (Ok(None), conn);
    };
    let mut conn = match conn {
        Some(c) => c,
        None => {
            let backend = &ctx.config.backends[primary];
            let connect = crate::backend::health::connect(
                &backend.address,
                &backend.tls,
                &aq.user,
                &aq.password,
                &aq.database,
            );
            match tokio::time::timeout(ctx.config.connect_timeout, connect).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => return (Err(AuthQueryError::Login(e.to_string())), None),
                Err(_) => return (Err(AuthQueryError::Login("timed out".into())), None),
            }
        }
    };
    let query = conn.exec_first(aq.query.as_str(), (user,));
    let row: Option<mysql_async::Row> =
        match tokio::time::timeout(ctx.config.connect_timeout, query).await {
            Ok(Ok(row)) => row,
            Ok(Err(e)) => return (Err(AuthQueryError::Query(e.to_string())), None),
            Err(_) => return (Err(AuthQueryError::Query("timed out".into())), None),
        };
    // The last column: `authentication_string` alone, or after the name.
    let stored: Option<String> = row.and_then(|r| {
        let last = r.len().checked_sub(1)?;
        r.get::<Option<String>, _>(last).flatten()
    });
    (
        Ok(stored
            .as_deref()
            .and_then(crate::auth::native::parse_stored_hash)),
        Some(conn),
    )
}
