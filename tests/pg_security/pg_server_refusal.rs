//! Logins the server refuses, through a real Fulcrum in front of a real
//! PostgreSQL: a listed user whose password the server does not take, one
//! the server has no role for, and one whose role may not log in. Fulcrum
//! takes each client's login (the config's password); the server refuses
//! Fulcrum's, and the client gets the server's SQLSTATE (28P01, 28000) and
//! words saying the server refused that user's login, never that the
//! server may be down; a login Fulcrum cannot make with what it holds (a
//! cleartext request with `server_cleartext` off) is 28000 too.

use std::sync::Once;

use fulcrum_suite::{pg_primary, PgProxyConfig};
use fulcrum_testkit::{FulcrumProcess, PgCluster, APP_DB, APP_PLAIN_USER};

/// The shared primary, with a role whose password is not the config's
/// and one that may not log in.
fn cluster() -> &'static PgCluster {
    static ROLES: Once = Once::new();
    let c = pg_primary();
    ROLES.call_once(|| {
        c.primary()
            .sql(
                "CREATE ROLE refused_password LOGIN PASSWORD 'only-the-server-knows'; \
                 CREATE ROLE refused_nologin NOLOGIN PASSWORD 'secret'",
            )
            .expect("roles");
    });
    c
}

/// The first error `user` gets logging in through `cfg` and running
/// `SELECT 1`: (SQLSTATE, message); `None` when both worked.
async fn first_error(cfg: &PgProxyConfig, user: &str) -> Option<(String, String)> {
    let as_pair = |e: tokio_postgres::Error| match e.as_db_error() {
        Some(db) => (db.code().code().to_owned(), db.message().to_owned()),
        None => ("(no SQLSTATE)".to_owned(), e.to_string()),
    };
    let (client, connection) = match tokio_postgres::connect(
        &cfg.conn_string(user, APP_DB),
        tokio_postgres::NoTls,
    )
    .await
    {
        Ok(c) => c,
        Err(e) => return Some(as_pair(e)),
    };
    tokio::spawn(connection);
    client.simple_query("SELECT 1").await.err().map(as_pair)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_the_server_refuses_reaches_the_client_as_its_refusal() {
    let server = cluster().primary().addr();
    let cfg = PgProxyConfig::new(&server)
        .extra("health_user = \"postgres\"")
        .user_keys("refused_password", "")
        .user_keys("no_such_role", "")
        .user_keys("refused_nologin", "");
    let f = tokio::task::block_in_place(|| FulcrumProcess::start(&cfg.to_toml()))
        .expect("start fulcrum");
    for (user, code, words) in [
        (
            "refused_password",
            "28P01",
            "password authentication failed for user \"refused_password\"",
        ),
        (
            "no_such_role",
            "28P01",
            "password authentication failed for user \"no_such_role\"",
        ),
        (
            "refused_nologin",
            "28000",
            "role \"refused_nologin\" is not permitted to log in",
        ),
    ] {
        let (got_code, message) = first_error(&cfg, user)
            .await
            .unwrap_or_else(|| panic!("{user}: the server refuses its login"));
        let log = f.log_contents();
        assert_eq!(got_code, code, "{user}: {message}\n{log}");
        assert!(
            message.contains(&format!("{server} refused the login of user \"{user}\""))
                && message.contains(words),
            "{user}: the server's refusal, in its words: {message}\n{log}"
        );
        assert!(!message.contains("may be down"), "{user}: {message}");
    }
    // A login Fulcrum itself cannot make with what it holds (the server
    // asks for the password in clear text, server_cleartext is off): a
    // login failure too, not a server that may be down.
    let (code, message) = first_error(&cfg, APP_PLAIN_USER)
        .await
        .expect("the cleartext request is refused");
    assert_eq!(code, "28000", "{message}");
    assert!(
        message.contains(&format!("cannot log in to {server}"))
            && message.contains("server_cleartext")
            && !message.contains("may be down"),
        "{message}"
    );
}
