//! `[[cluster.database]]` tables (names, aliases, a forced server login and
//! its own `connect_query`) and `connect_query` itself: the per-database
//! keys a PostgreSQL pool is made with.

use super::credentials::server_login;
use super::table::Table;
use crate::error::Problem;
use crate::raw::{RawCluster, Value};
use crate::types::{Database, Protocol};

/// `connect_query`: SQL sent as it is, so non-blank and without a NUL byte
/// (which the PostgreSQL protocol cannot carry in a query).
pub(super) fn connect_query(t: &Table, value: &Value<String>) -> Result<Option<String>, Problem> {
    let Some(v) = value else {
        return Ok(None);
    };
    let text = t.text(value, "connect_query", None)?;
    if text.contains('\0') {
        return Err(t.error(v, "connect_query", "must not contain a NUL character"));
    }
    Ok(Some(text))
}

/// `[[cluster.database]]`: names unique; `server_database` defaults to the
/// name; aliases of one server database that share pools (both forcing the
/// same `server_user`, or neither forcing one) agree on `server_password`
/// and `connect_query`. Those keys are PostgreSQL's: a MySQL connection
/// serves every schema.
pub(super) fn databases(
    t: &Table,
    c: &RawCluster,
    protocol: Protocol,
    base: &std::path::Path,
) -> Result<Vec<Database>, Problem> {
    let items = c
        .database
        .as_ref()
        .map_or(&[][..], |d| d.get_ref().0.as_slice());
    let mut out: Vec<Database> = Vec::with_capacity(items.len());
    for (i, raw) in items.iter().enumerate() {
        let dt = t.child(&format!("database[{i}]"), raw.span());
        let d = raw.get_ref();
        let name = dt.text(&d.name, "name", None)?;
        if let Some(j) = out.iter().position(|o| o.name == name) {
            let v = dt.required(&d.name, "name")?;
            return Err(dt.error(
                v,
                "name",
                format!("database {name:?} is already database[{j}]"),
            ));
        }
        let server_database = dt.text(&d.server_database, "server_database", Some(&name))?;
        if protocol == Protocol::Mysql {
            let mysql_only = [
                ("server_user", d.server_user.as_ref().map(|v| v.span())),
                (
                    "server_password",
                    d.server_password.as_ref().map(|v| v.span()),
                ),
                ("connect_query", d.connect_query.as_ref().map(|v| v.span())),
            ];
            if let Some((key, Some(span))) = mysql_only.into_iter().find(|(_, s)| s.is_some()) {
                return Err(Problem::new(
                    dt.line(&span),
                    dt.key(key),
                    "is for PostgreSQL clusters: a MySQL server connection serves every schema (set server_user on [[cluster.user]], connect_query on [[cluster]])",
                ));
            }
        }
        let server = server_login(
            &dt,
            &d.server_user,
            &d.server_password,
            base,
            Protocol::Postgres,
        )?;
        let connect_query = connect_query(&dt, &d.connect_query)?;
        let forced = server.as_ref().map(|s| &s.user);
        if let Some((j, other)) = out.iter().enumerate().find(|(_, o)| {
            o.server_database == server_database && o.server.as_ref().map(|s| &s.user) == forced
        }) {
            if other.server != server || other.connect_query != connect_query {
                let login = match forced {
                    Some(u) => format!("forcing server_user {u:?}"),
                    None => "forcing no server_user".to_owned(),
                };
                let reason = format!(
                    "database[{j}] ({:?}) is also server database {server_database:?} {login}: such aliases share its pools, so give them the same server_password and connect_query",
                    other.name
                );
                return Err(dt.error_at_header("server_database", reason));
            }
        }
        out.push(Database {
            name,
            server_database,
            server,
            connect_query,
        });
    }
    Ok(out)
}
