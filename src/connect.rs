//! Logins through Fulcrum (or straight to a server) with the drivers the
//! tests use: tokio-postgres without TLS, its connection task spawned on
//! the current runtime, and mysql_async over TCP. The plain variants fail
//! the test with the driver's error; the `try_` ones return it.

use fulcrum_testkit::{APP_DB, APP_PASSWORD, APP_USER};
use mysql_async::{Conn, OptsBuilder};
use tokio_postgres::{Client, NoTls};

use crate::config::{PgProxyConfig, CONSOLE_PASSWORD, CONSOLE_USER};

/// Logs in with `conn_string` (no TLS) and spawns the connection task.
pub async fn pg_connect_str(conn_string: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(conn_string, NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

/// A login through `cfg`'s listener as `user` to `db`.
pub async fn try_pg_connect_as(
    cfg: &PgProxyConfig,
    user: &str,
    db: &str,
) -> Result<Client, tokio_postgres::Error> {
    pg_connect_str(&cfg.conn_string(user, db)).await
}

/// A login through `cfg`'s listener as the testkit's `app` user to its
/// database.
pub async fn try_pg_connect(cfg: &PgProxyConfig) -> Result<Client, tokio_postgres::Error> {
    try_pg_connect_as(cfg, APP_USER, APP_DB).await
}

/// [`try_pg_connect_as`], failing the test if the login fails.
pub async fn pg_connect_as(cfg: &PgProxyConfig, user: &str, db: &str) -> Client {
    try_pg_connect_as(cfg, user, db).await.unwrap_or_else(|e| {
        panic!(
            "connect through fulcrum as {user} to {db}: {e}: {:?}",
            e.as_db_error()
        )
    })
}

/// [`try_pg_connect`], failing the test if the login fails.
pub async fn pg_connect(cfg: &PgProxyConfig) -> Client {
    pg_connect_as(cfg, APP_USER, APP_DB).await
}

/// [`pg_connect`] with `options` in the startup packet (e.g. `-c role=r`).
pub async fn pg_connect_with_options(cfg: &PgProxyConfig, options: &str) -> Client {
    let mut config: tokio_postgres::Config = cfg
        .conn_string(APP_USER, APP_DB)
        .parse()
        .expect("a valid connection string");
    config.options(options);
    let (client, conn) = config
        .connect(NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect through fulcrum with options {options:?}: {e}"));
    tokio::spawn(conn);
    client
}

/// A login to the admin console on `127.0.0.1:admin_port` (database
/// `fulcrum`) as [`CONSOLE_USER`] with `password`.
pub async fn try_console_connect(
    admin_port: u16,
    password: &str,
) -> Result<Client, tokio_postgres::Error> {
    pg_connect_str(&format!(
        "host=127.0.0.1 port={admin_port} user={CONSOLE_USER} password={password} dbname=fulcrum connect_timeout=10"
    ))
    .await
}

/// A login to the admin console [`with_console`](crate::with_console)
/// configured, failing the test if it fails.
pub async fn console_connect(admin_port: u16) -> Client {
    try_console_connect(admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap_or_else(|e| panic!("admin console on :{admin_port}: {e}"))
}

/// mysql_async options for `127.0.0.1:port` over TCP as the testkit's `app`
/// user, its database selected.
pub fn maria_opts(port: u16) -> OptsBuilder {
    OptsBuilder::default()
        .ip_or_hostname("127.0.0.1")
        .tcp_port(port)
        .user(Some(APP_USER))
        .pass(Some(APP_PASSWORD))
        .db_name(Some(APP_DB))
        .prefer_socket(false)
}

/// A MySQL-protocol login on `127.0.0.1:port` ([`maria_opts`]).
pub async fn try_maria_connect(port: u16) -> mysql_async::Result<Conn> {
    Conn::new(maria_opts(port)).await
}

/// [`try_maria_connect`], failing the test if the login fails.
pub async fn maria_connect(port: u16) -> Conn {
    try_maria_connect(port)
        .await
        .unwrap_or_else(|e| panic!("connect through fulcrum on :{port}: {e}"))
}

/// The first column of the first row `sql` returns (panics, naming the
/// query, on an error or no row).
pub async fn first_value(client: &Client, sql: &str) -> String {
    client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{sql}: no row"))
}
