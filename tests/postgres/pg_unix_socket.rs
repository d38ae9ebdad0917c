//! `unix_socket_dir`: Fulcrum also listens on `<dir>/.s.PGSQL.<port>`, so
//! psql (`-h DIR -p PORT`) and tokio-postgres (`host=DIR`) log in over it
//! through the same session as over TCP, each client recorded with its
//! process's pid and uid (SHOW CLIENTS); TLS is not offered there, so
//! `tls_mode = "require"` applies to TCP clients only. The socket file is
//! removed when Fulcrum stops (SIGTERM, SIGINT); a stale one a crash left
//! is replaced; a live one or a file that is not a socket stops the start
//! with an error naming the path. hba `local` lines apply to socket
//! clients: `peer` admits the process whose system user is the requested
//! user. A real daemon in front of the binary's shared primary; every
//! socket in a scratch directory of the test's own.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fulcrum_suite::{
    console_connect, pg_connect_str, pg_two_replicas, startup_message, with_console, PgProxyConfig,
    PROTOCOL_3_0,
};
use fulcrum_testkit::{
    free_port, pg_bin, run_psql, wait_for_unix, FulcrumProcess, ScratchDir, Signal, TestCerts,
    APP_DB, APP_PASSWORD, APP_USER,
};
use tokio_postgres::SimpleQueryMessage;

/// A config in front of the shared primary with its socket in `dir`.
fn config(dir: &Path, extra: &[&str]) -> PgProxyConfig {
    let mut cfg = PgProxyConfig::new(&pg_two_replicas().primary().addr())
        .extra(&format!("unix_socket_dir = \"{}\"", dir.display()));
    for line in extra {
        cfg = cfg.extra(line);
    }
    cfg
}

fn port(cfg: &PgProxyConfig) -> u16 {
    cfg.listen.rsplit_once(':').unwrap().1.parse().unwrap()
}

fn socket_path(dir: &Path, cfg: &PgProxyConfig) -> PathBuf {
    dir.join(format!(".s.PGSQL.{}", port(cfg)))
}

/// Fulcrum started with `toml`, its socket at `socket` accepting.
fn start(toml: &str, socket: &Path) -> FulcrumProcess {
    let p = FulcrumProcess::start(toml).expect("start fulcrum");
    assert!(
        wait_for_unix(socket, Duration::from_secs(10)),
        "no socket at {}:\n{}",
        socket.display(),
        p.log_contents()
    );
    p
}

/// The SSLRequest code of a startup packet.
const SSL_REQUEST: i32 = 80_877_103;

/// psql to `host` (a socket directory or an address) with `sslmode`:
/// (succeeded, stdout, stderr).
fn psql(host: &str, port: u16, sslmode: &str, sql: &str) -> (bool, String, String) {
    let out = Command::new(pg_bin("psql"))
        .args([
            "-h",
            host,
            "-p",
            &port.to_string(),
            "-U",
            APP_USER,
            "-d",
            APP_DB,
        ])
        .args(["-X", "-At", "-c", sql])
        .env("PGSSLMODE", sslmode)
        .env("PGCONNECT_TIMEOUT", "10")
        .env("PGPASSWORD", APP_PASSWORD)
        .output()
        .expect("run psql");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    )
}

#[tokio::test]
async fn psql_and_tokio_postgres_log_in_over_the_socket_with_their_pid_and_uid_recorded() {
    let dir = ScratchDir::new().unwrap();
    let cfg = config(dir.path(), &["unix_socket_mode = \"0660\""]);
    let admin = free_port();
    let socket = socket_path(dir.path(), &cfg);
    let _p = start(&with_console(&cfg.to_toml(), admin), &socket);
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o660, "unix_socket_mode");

    let host_port = format!("{}:{}", dir.path().display(), port(&cfg));
    let out = run_psql(&host_port, APP_USER, APP_PASSWORD, APP_DB, "SELECT 40 + 2").unwrap();
    assert_eq!(out, "42");

    // tokio-postgres: a host that is a path is a socket directory.
    let client = pg_connect_str(&format!(
        "host={} port={} user={APP_USER} password={APP_PASSWORD} dbname={APP_DB} connect_timeout=10",
        dir.path().display(),
        port(&cfg)
    ))
    .await
    .expect("tokio-postgres over the socket");
    let row = client
        .query_one("SELECT $1::int * 2", &[&21i32])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 42);
    client
        .batch_execute("BEGIN; SELECT 1; COMMIT")
        .await
        .unwrap();

    // The console lists it as PgBouncer does (addr "unix", the listener's
    // port), with this process's pid and uid from the kernel.
    let console = console_connect(admin).await;
    let rows: Vec<_> = console
        .simple_query("SHOW CLIENTS")
        .await
        .unwrap()
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        })
        .collect();
    let ours: Vec<_> = rows
        .iter()
        .filter(|r| r.get("remote_pid") == Some(&std::process::id().to_string()))
        .collect();
    assert_eq!(ours.len(), 1, "one client of this process");
    let me = std::fs::metadata("/proc/self").unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(ours[0].get("addr"), Some("unix"));
    assert_eq!(ours[0].get("port"), Some(&*port(&cfg).to_string()));
    assert_eq!(ours[0].get("uid"), Some(&*me.uid().to_string()));
    assert_eq!(ours[0].get("user"), Some(APP_USER));
}

/// `client_auth = "hba"` with a `local ... peer` line: the socket client
/// whose system user (the kernel's SO_PEERCRED uid, named by the system's
/// user list) is the requested user logs in without a password; another
/// user over the socket gets PostgreSQL's 28000 "Peer authentication
/// failed"; a `host` line still asks TCP clients for their password.
#[tokio::test]
async fn hba_peer_admits_the_socket_client_whose_system_user_it_is() {
    let dir = ScratchDir::new().unwrap();
    let me = Command::new("id").arg("-un").output().expect("id -un");
    let me = String::from_utf8_lossy(&me.stdout).trim().to_owned();
    assert!(!me.is_empty() && me != APP_USER, "system user {me:?}");
    let hba = dir.path().join("hba.conf");
    std::fs::write(
        &hba,
        "local all all peer\nhost all all 127.0.0.1/32 scram-sha-256\n",
    )
    .unwrap();
    let cfg = config(
        dir.path(),
        &[&format!("auth_hba_file = \"{}\"", hba.display())],
    )
    .client_auth("hba")
    .user_keys(
        &me,
        &format!("server_user = \"{APP_USER}\"\nserver_password = \"{APP_PASSWORD}\""),
    );
    let socket = socket_path(dir.path(), &cfg);
    let _p = start(&cfg.to_toml(), &socket);
    let over_socket = |user: &str| {
        format!(
            "host={} port={} user={user} dbname={APP_DB} connect_timeout=10",
            dir.path().display(),
            port(&cfg)
        )
    };
    let client = pg_connect_str(&over_socket(&me))
        .await
        .expect("peer: the system user logs in with no password");
    let row = client.query_one("SELECT current_user", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), APP_USER, "as its server_user");
    let refused = pg_connect_str(&format!(
        "{} password={APP_PASSWORD}",
        over_socket(APP_USER)
    ))
    .await;
    let Err(e) = refused else {
        panic!("another user over the socket is refused");
    };
    let db = e.as_db_error().unwrap_or_else(|| panic!("{e:?}"));
    assert_eq!(db.code().code(), "28000", "{db:?}");
    assert_eq!(
        db.message(),
        format!("Peer authentication failed for user \"{APP_USER}\"")
    );
    let tcp = pg_connect_str(&cfg.conn_string(APP_USER, APP_DB))
        .await
        .expect("TCP with the password, by the host line");
    tcp.simple_query("SELECT 1").await.unwrap();
}

#[tokio::test]
async fn tls_is_not_offered_over_the_socket_and_require_holds_for_tcp_only() {
    let certs = TestCerts::new().expect("certificates");
    let dir = ScratchDir::new().unwrap();
    let cert = format!("tls_certificate = \"{}\"", certs.cert.display());
    let key = format!("tls_private_key = \"{}\"", certs.key.display());
    let cfg = config(dir.path(), &["tls_mode = \"require\"", &cert, &key]);
    let _p = start(&cfg.to_toml(), &socket_path(dir.path(), &cfg));
    // libpq never asks for TLS over a socket; a client that does gets 'N'
    // (not 'S'), and its login goes on in the clear, require or not.
    let mut raw = std::os::unix::net::UnixStream::connect(socket_path(dir.path(), &cfg)).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut request = 8i32.to_be_bytes().to_vec();
    request.extend_from_slice(&SSL_REQUEST.to_be_bytes());
    raw.write_all(&request).unwrap();
    let mut answer = [0u8; 1];
    raw.read_exact(&mut answer).unwrap();
    assert_eq!(answer[0], b'N', "TLS is not offered over the socket");
    raw.write_all(&startup_message(
        PROTOCOL_3_0,
        &[("user", APP_USER), ("database", APP_DB)],
    ))
    .unwrap();
    raw.read_exact(&mut answer).unwrap();
    assert_eq!(
        answer[0], b'R',
        "the login asks for the password, no FATAL for missing TLS"
    );
    drop(raw);
    let host = dir.path().display().to_string();
    let (ok, out, err) = psql(&host, port(&cfg), "prefer", "SELECT 7");
    assert!(ok && out == "7", "{out} {err}");
    // Over TCP, require still refuses a plain client.
    let (ok, _, err) = psql("127.0.0.1", port(&cfg), "disable", "SELECT 1");
    assert!(!ok);
    assert!(err.contains("this listener requires TLS"), "{err}");
}

#[test]
fn the_socket_file_is_removed_when_fulcrum_stops() {
    for signal in [Signal::Term, Signal::Int] {
        let dir = ScratchDir::new().unwrap();
        let cfg = config(dir.path(), &[]);
        let socket = socket_path(dir.path(), &cfg);
        let p = start(&cfg.to_toml(), &socket);
        let host_port = format!("{}:{}", dir.path().display(), port(&cfg));
        run_psql(&host_port, APP_USER, APP_PASSWORD, APP_DB, "SELECT 1").unwrap();
        p.signal(signal).unwrap();
        let status = p.wait_exit(Duration::from_secs(15));
        assert!(
            status.is_some_and(|s| s.success()),
            "{signal:?}: {status:?}"
        );
        assert!(
            !socket.exists(),
            "{signal:?}: {} left behind",
            socket.display()
        );
    }
}

#[test]
fn a_stale_socket_file_left_by_a_crash_is_replaced() {
    let dir = ScratchDir::new().unwrap();
    let cfg = config(dir.path(), &[]);
    let socket = socket_path(dir.path(), &cfg);
    // What a killed process leaves: the file, with nobody listening.
    let p = start(&cfg.to_toml(), &socket);
    p.signal(Signal::Kill).unwrap();
    p.wait_exit(Duration::from_secs(10)).expect("killed");
    assert!(socket.exists(), "SIGKILL leaves the file");
    drop(p);
    let p = start(&cfg.to_toml(), &socket);
    let host_port = format!("{}:{}", dir.path().display(), port(&cfg));
    let out = run_psql(&host_port, APP_USER, APP_PASSWORD, APP_DB, "SELECT 'again'").unwrap();
    assert_eq!(out, "again");
    assert!(
        p.log_contents().contains("replaced a stale socket file"),
        "{}",
        p.log_contents()
    );
}

#[test]
fn a_live_socket_or_a_file_that_is_not_one_stops_the_start_untouched() {
    let dir = ScratchDir::new().unwrap();
    let cfg = config(dir.path(), &[]);
    let socket = socket_path(dir.path(), &cfg);
    let refused = |why: &str| {
        let p = FulcrumProcess::spawn(&cfg.to_toml()).unwrap();
        let status = p.wait_exit(Duration::from_secs(10)).expect("fulcrum exits");
        assert!(!status.success());
        let log = p.log_contents();
        let want = format!(
            "cluster \"main\": cannot listen on the Unix socket {}: {why}",
            socket.display()
        );
        assert!(log.contains(&want), "want {want:?} in:\n{log}");
    };
    std::fs::write(&socket, "not a socket").unwrap();
    refused("the path exists and is not a socket; Fulcrum never removes it");
    assert_eq!(std::fs::read_to_string(&socket).unwrap(), "not a socket");
    std::fs::remove_file(&socket).unwrap();

    let other = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    refused("another process is listening on this socket");
    assert!(socket.exists(), "the other process keeps its socket");
    drop(other);
}
