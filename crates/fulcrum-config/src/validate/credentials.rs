//! The credential keys of one `[[cluster]]`: `client_auth` in its
//! protocol's names, the `[[cluster.user]]` tables (passwords from the
//! text, a file or the environment; `server_user`), and `auth_user` with
//! its companions.

use super::cluster::non_empty;
use super::table::Table;
use crate::error::Problem;
use crate::raw::{RawCluster, RawUser, SecretText, Tables, Value};
use crate::types::{defaults, ClientAuth, PasswordHash, Protocol, User};

const CLIENT_AUTHS: &[(&str, ClientAuth)] = &[
    ("scram-sha-256", ClientAuth::ScramSha256),
    ("md5", ClientAuth::Md5),
    ("trust", ClientAuth::Trust),
    ("cert", ClientAuth::Cert),
    ("hba", ClientAuth::Hba),
];
const MYSQL_CLIENT_AUTHS: &[(&str, ClientAuth)] = &[
    ("mysql_native_password", ClientAuth::MysqlNativePassword),
    ("caching_sha2_password", ClientAuth::CachingSha2Password),
    ("trust", ClientAuth::Trust),
];

/// `client_auth`, in the names of the cluster's protocol: the other
/// protocol's names are refused with an error naming the right ones.
pub(super) fn client_auth(
    t: &Table,
    c: &RawCluster,
    protocol: Protocol,
) -> Result<ClientAuth, Problem> {
    let (ours, theirs, default, refusal) = match protocol {
        Protocol::Postgres => (
            CLIENT_AUTHS,
            MYSQL_CLIENT_AUTHS,
            defaults::CLIENT_AUTH,
            "is a MySQL method; PostgreSQL clusters take \"scram-sha-256\", \"md5\", \"trust\", \"cert\" or \"hba\"",
        ),
        Protocol::Mysql => (
            MYSQL_CLIENT_AUTHS,
            CLIENT_AUTHS,
            ClientAuth::MysqlNativePassword,
            "is a PostgreSQL method; MySQL clusters take \"mysql_native_password\", \"caching_sha2_password\" or \"trust\"",
        ),
    };
    // `trust` is in both lists.
    let wrong = c.client_auth.as_ref().filter(|v| {
        theirs
            .iter()
            .any(|(n, a)| n == v.get_ref() && *a != ClientAuth::Trust)
    });
    if let Some(v) = wrong {
        let reason = format!("{:?} {refusal}", v.get_ref());
        return Err(t.error(v, "client_auth", reason));
    }
    t.choice(&c.client_auth, "client_auth", ours, Some(default))
}

/// `auth_user` and its companions; `None` when `auth_user` is not set.
pub(super) fn auth_query(
    t: &Table,
    c: &RawCluster,
    protocol: Protocol,
    users: &[User],
    base: &std::path::Path,
) -> Result<Option<crate::types::AuthQuery>, Problem> {
    let Some(user_value) = &c.auth_user else {
        let needs = "needs auth_user (the login that runs auth_query)";
        if let Some(v) = &c.auth_password {
            return Err(t.error(v, "auth_password", needs));
        }
        for (value, name) in [
            (&c.auth_query, "auth_query"),
            (&c.auth_database, "auth_database"),
        ] {
            if let Some(v) = value {
                return Err(t.error(v, name, needs));
            }
        }
        for (value, name) in [
            (&c.auth_max_connections, "auth_max_connections"),
            (
                &c.auth_failed_lookups_per_minute,
                "auth_failed_lookups_per_minute",
            ),
        ] {
            if let Some(v) = value {
                return Err(t.error(v, name, needs));
            }
        }
        return Ok(None);
    };
    let user = t.text(&c.auth_user, "auth_user", None)?;
    let password = match &c.auth_password {
        Some(p) => t.secret(p, "auth_password", base)?,
        None => match users.iter().find(|u| u.name == user) {
            Some(u) => match &u.hash {
                // The auth user logs in by itself, before any client.
                Some(hash) => {
                    let reason = format!(
                        "{user:?}'s [[cluster.user]] password is {}, which cannot log in by itself: set auth_password",
                        hash.kind()
                    );
                    return Err(t.error(user_value, "auth_user", reason));
                }
                None => u.password.clone(),
            },
            None => {
                let reason =
                    format!("{user:?} is not a [[cluster.user]]; add one or set auth_password");
                return Err(t.error(user_value, "auth_user", reason));
            }
        },
    };
    let (default_query, placeholder, default_db) = match protocol {
        Protocol::Postgres => (defaults::AUTH_QUERY_PG, "$1", defaults::AUTH_DATABASE_PG),
        Protocol::Mysql => (defaults::AUTH_QUERY_MYSQL, "?", ""),
    };
    let query = t.text(&c.auth_query, "auth_query", Some(default_query))?;
    if !query.contains(placeholder) {
        let v = c
            .auth_query
            .as_ref()
            .expect("the default has its placeholder");
        return Err(t.error(
            v,
            "auth_query",
            format!("must use {placeholder} for the login name"),
        ));
    }
    let database = match &c.auth_database {
        Some(_) => t.text(&c.auth_database, "auth_database", None)?,
        None => default_db.to_owned(),
    };
    let cache_ttl = t.duration(
        &c.auth_cache_ttl,
        "auth_cache_ttl",
        defaults::AUTH_CACHE_TTL,
    )?;
    let max_connections = t.u32_at_least(
        &c.auth_max_connections,
        "auth_max_connections",
        1,
        defaults::AUTH_MAX_CONNECTIONS,
    )? as usize;
    let failed_lookups_per_minute = t.u32_at_least(
        &c.auth_failed_lookups_per_minute,
        "auth_failed_lookups_per_minute",
        0,
        defaults::AUTH_FAILED_LOOKUPS_PER_MINUTE,
    )?;
    Ok(Some(crate::types::AuthQuery {
        user,
        password,
        query,
        database,
        cache_ttl,
        max_connections,
        failed_lookups_per_minute,
    }))
}

pub(super) fn users(
    t: &Table,
    raw: &Value<Tables<RawUser>>,
    cluster: &str,
    protocol: Protocol,
    auth: ClientAuth,
    base: &std::path::Path,
    pool_rules: super::user_pool::Rules,
) -> Result<Vec<User>, Problem> {
    let reason = format!("cluster {cluster:?} has no users; add a [[cluster.user]]");
    let items = non_empty(t, raw, "user", reason)?;
    let mut out: Vec<User> = Vec::with_capacity(items.len());
    let mut lines: Vec<usize> = Vec::with_capacity(items.len()); // line of each name
    for (i, raw) in items.iter().enumerate() {
        let ut = t.child(&format!("user[{i}]"), raw.span());
        let u = raw.get_ref();

        let name = ut.text(&u.name, "name", None)?;
        let name_value = ut.required(&u.name, "name")?;
        if let Some(j) = out.iter().position(|o| o.name == name) {
            let reason = format!(
                "user {name:?} is already defined by user[{j}] (line {})",
                lines[j]
            );
            return Err(ut.error(name_value, "name", reason));
        }
        lines.push(ut.line(&name_value.span()));

        let password_value = ut.required(&u.password, "password")?;
        let password = ut.secret(password_value, "password", base)?;
        // An empty password with password authentication would let anyone in as this user.
        if password.is_empty() && !matches!(auth, ClientAuth::Trust | ClientAuth::Cert) {
            let password = password_value;
            let reason = format!("must not be empty when client_auth is {:?}", auth.name());
            return Err(ut.error(password, "password", reason));
        }
        let server = server_login(&ut, &u.server_user, &u.server_password, base, protocol)?;
        let hash = match protocol {
            Protocol::Postgres => {
                password_hash(&ut, password_value, &password, auth, server.is_some())?
            }
            Protocol::Mysql => None,
        };
        let pool = super::user_pool::user_pool(
            &ut,
            &u.pool_mode,
            &u.pool_size,
            &u.max_user_connections,
            pool_rules,
        )?;
        out.push(User {
            name,
            password,
            hash,
            server,
            pool,
        });
    }
    Ok(out)
}

/// `server_user` and `server_password` of a `[[cluster.user]]` or a
/// `[[cluster.database]]`: the login used on the servers, if one is set
/// (the password takes the same forms as a user's; none: empty).
pub(super) fn server_login(
    t: &Table,
    user: &Value<String>,
    password: &Value<SecretText>,
    base: &std::path::Path,
    protocol: Protocol,
) -> Result<Option<crate::types::ServerLogin>, Problem> {
    Ok(match (user, password) {
        (None, None) => None,
        (None, Some(v)) => return Err(t.error(v, "server_password", "needs server_user")),
        (Some(_), p) => Some(crate::types::ServerLogin {
            user: t.text(user, "server_user", None)?,
            password: match p {
                Some(p) => server_password(t, p, base, protocol)?,
                None => String::new(),
            },
        }),
    })
}

/// A PostgreSQL user's `password` given as the server stores it: checked,
/// and refused where nothing could use it. SCRAM cannot check an md5 hash,
/// nor md5 a verifier; and a verifier logs in to the servers only with the
/// keys a client proves in a SCRAM login, which `trust` and `cert` never
/// run (unless `server_user` logs in with a password of its own).
fn password_hash(
    ut: &Table,
    value: &toml::Spanned<crate::raw::SecretText>,
    password: &str,
    auth: ClientAuth,
    own_server_login: bool,
) -> Result<Option<PasswordHash>, Problem> {
    let hash = match PasswordHash::detect(password) {
        None => return Ok(None),
        Some(Err(why)) => return Err(ut.error(value, "password", why)),
        Some(Ok(hash)) => hash,
    };
    let refusal = match (&hash, auth) {
        (PasswordHash::Scram(_), ClientAuth::Md5) => Some(
            "is a SCRAM-SHA-256 verifier, which client_auth = \"md5\" cannot check (md5 needs the password or its md5 hash): use client_auth = \"scram-sha-256\"".to_owned(),
        ),
        (PasswordHash::Scram(_), ClientAuth::Trust | ClientAuth::Cert) if !own_server_login => Some(format!(
            "is a SCRAM-SHA-256 verifier: Fulcrum logs in to the servers with the keys a client proves in a SCRAM login, which client_auth = {:?} never runs: use client_auth = \"scram-sha-256\", or set server_user and server_password",
            auth.name()
        )),
        (PasswordHash::Md5(_), ClientAuth::ScramSha256) => Some(
            "is an md5 hash, which client_auth = \"scram-sha-256\" cannot check (SCRAM needs the password or a SCRAM verifier): use client_auth = \"md5\", or give the password or the SCRAM verifier the server stores".to_owned(),
        ),
        _ => None,
    };
    match refusal {
        Some(reason) => Err(ut.error(value, "password", reason)),
        None => Ok(Some(hash)),
    }
}

/// `server_password`: the password itself. A hash cannot be passed
/// through to another login than the client's own (PostgreSQL clusters;
/// MySQL takes the text as it is).
fn server_password(
    ut: &Table,
    value: &toml::Spanned<crate::raw::SecretText>,
    base: &std::path::Path,
    protocol: Protocol,
) -> Result<String, Problem> {
    let password = ut.secret(value, "server_password", base)?;
    if protocol == Protocol::Postgres {
        if let Some(hash) = PasswordHash::detect(&password) {
            let kind = hash.map_or("a malformed SCRAM-SHA-256 verifier", |h| h.kind());
            let reason = format!("is {kind}: Fulcrum logs in as server_user with its password itself (a stored hash passes through only for the client's own login)");
            return Err(ut.error(value, "server_password", reason));
        }
    }
    Ok(password)
}
