//! `unix_socket` on a MySQL cluster: the mariadb client (`-S PATH`) and
//! mysql_async (`OptsBuilder::socket`) log in over it through the same
//! session as over TCP; with `tls_mode = "require"` the greeting there
//! offers no SSL and a plain login is served (require is for TCP, where a
//! plain login still gets ERR 3159); the file is removed when Fulcrum
//! stops. In front of the binary's shared MariaDB primary and replica.

use std::path::Path;
use std::time::Duration;

use fulcrum_suite::{maria_one_replica, maria_opts, maria_toml};
use fulcrum_testkit::{
    free_port, run_mariadb_socket, wait_for_unix, FulcrumProcess, ScratchDir, Signal, TestCerts,
    APP_DB, APP_PASSWORD, APP_USER,
};
use mysql_async::prelude::Queryable;

/// Fulcrum in front of the shared servers with its socket at `socket`
/// (and `extra` keys); its TCP port.
fn start(socket: &Path, extra: &str) -> (FulcrumProcess, u16) {
    let port = free_port();
    let keys = format!("unix_socket = \"{}\"\n{extra}", socket.display());
    let p = FulcrumProcess::start(&maria_toml(maria_one_replica(), port, &keys)).expect("fulcrum");
    assert!(
        wait_for_unix(socket, Duration::from_secs(10)),
        "no socket at {}:\n{}",
        socket.display(),
        p.log_contents()
    );
    (p, port)
}

async fn socket_login(socket: &Path) -> mysql_async::Result<mysql_async::Conn> {
    let opts = mysql_async::OptsBuilder::default()
        .socket(Some(socket.display().to_string()))
        .user(Some(APP_USER))
        .pass(Some(APP_PASSWORD))
        .db_name(Some(APP_DB));
    mysql_async::Conn::new(opts).await
}

#[tokio::test]
async fn the_mariadb_client_and_mysql_async_log_in_over_the_socket() {
    let dir = ScratchDir::new().unwrap();
    let socket = dir.path().join("fulcrum.sock");
    let (p, _) = start(&socket, "");
    let out = run_mariadb_socket(&socket, APP_USER, APP_PASSWORD, APP_DB, "SELECT 40 + 2").unwrap();
    assert_eq!(out, "42");

    let mut conn = socket_login(&socket)
        .await
        .expect("mysql_async over the socket");
    let n: Option<i64> = conn.exec_first("SELECT ? * 2", (21,)).await.unwrap();
    assert_eq!(n, Some(42));
    // The id Fulcrum gave it at login, as over TCP.
    let id: Option<u64> = conn.query_first("SELECT CONNECTION_ID()").await.unwrap();
    assert_eq!(id, Some(u64::from(conn.id())));
    conn.disconnect().await.unwrap();

    p.signal(Signal::Term).unwrap();
    let status = p.wait_exit(Duration::from_secs(15));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert!(!socket.exists(), "{} left behind", socket.display());
}

#[tokio::test]
async fn no_tls_is_offered_over_the_socket_and_require_holds_for_tcp_only() {
    let certs = TestCerts::new().expect("certificates");
    let dir = ScratchDir::new().unwrap();
    let socket = dir.path().join("tls.sock");
    let tls = format!(
        "tls_mode = \"require\"\ntls_certificate = \"{}\"\ntls_private_key = \"{}\"",
        certs.cert.display(),
        certs.key.display()
    );
    let (_p, port) = start(&socket, &tls);
    let mut conn = socket_login(&socket)
        .await
        .expect("a plain login over the socket");
    let v: Option<String> = conn.query_first("SELECT 'local'").await.unwrap();
    assert_eq!(v.as_deref(), Some("local"));
    conn.disconnect().await.unwrap();
    let out = run_mariadb_socket(&socket, APP_USER, APP_PASSWORD, APP_DB, "SELECT 1").unwrap();
    assert_eq!(out, "1");
    // Over TCP a plain login is still refused.
    let err = mysql_async::Conn::new(maria_opts(port))
        .await
        .expect_err("require refuses a plain TCP login")
        .to_string();
    assert!(err.contains("3159"), "{err}");
}
