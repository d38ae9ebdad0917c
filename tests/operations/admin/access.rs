//! Who gets into the admin console and what they get: login mechanisms and
//! clear errors for bad commands, the connection cap and login timeout, TLS
//! and stats users through psql, and the pgbouncer exporter reading it.

use std::time::Duration;

use fulcrum_suite::{
    pg_connect, startup_message, try_console_connect, PgProxyConfig, CONSOLE_PASSWORD,
    CONSOLE_USER, PROTOCOL_3_0,
};
use fulcrum_testkit::{free_port, FulcrumProcess, APP_DB, APP_USER};

use super::helpers::{console_toml, setup, show};

/// The console's first answer to a startup packet for `user`: the
/// authentication request code (10 SASL, 5 md5) and the rest of its body
/// (the SASL mechanisms, or the md5 salt).
async fn auth_request(port: u16, user: &str) -> (i32, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let msg = startup_message(PROTOCOL_3_0, &[("user", user), ("database", "fulcrum")]);
    stream.write_all(&msg).await.unwrap();
    let mut header = [0u8; 5];
    stream.read_exact(&mut header).await.unwrap();
    assert_eq!(header[0], b'R', "an authentication request");
    let len = i32::from_be_bytes(header[1..5].try_into().unwrap()) as usize;
    let mut rest = vec![0u8; len - 4];
    stream.read_exact(&mut rest).await.unwrap();
    let code = i32::from_be_bytes(rest[..4].try_into().unwrap());
    (code, rest[4..].to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_commands_get_errors_and_the_session_goes_on() {
    let s = tokio::task::block_in_place(setup);
    // Logins: SCRAM-SHA-256 by default, for known and unknown users alike.
    for user in [CONSOLE_USER, "nobody"] {
        let (code, mechanisms) = auth_request(s.admin_port, user).await;
        assert_eq!(code, 10, "SASL for {user}");
        assert!(
            mechanisms.starts_with(b"SCRAM-SHA-256\0"),
            "{:?}",
            String::from_utf8_lossy(&mechanisms)
        );
    }
    let wrong = try_console_connect(s.admin_port, "nope")
        .await
        .err()
        .map(|e| format!("{e:?}"));
    assert!(
        wrong.is_some_and(|e| e.contains("28P01")),
        "wrong password refused"
    );
    // `admin_auth = "md5"` for older clients: md5 is asked, and works.
    // A second daemon: its own client listener, its own console.
    let md5_port = free_port();
    let mut md5_cfg = s.cfg.clone();
    md5_cfg.listen = format!("127.0.0.1:{}", free_port());
    let md5_daemon =
        FulcrumProcess::start(&console_toml(&md5_cfg, md5_port, "admin_auth = \"md5\"\n")).unwrap();
    assert_eq!(auth_request(md5_port, CONSOLE_USER).await.0, 5, "md5 asked");
    let via_md5 = try_console_connect(md5_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    assert!(!show(&via_md5, "SHOW VERSION").await.1.is_empty());
    let wrong = try_console_connect(md5_port, "nope")
        .await
        .err()
        .map(|e| format!("{e:?}"));
    assert!(
        wrong.is_some_and(|e| e.contains("28P01")),
        "md5: wrong password refused"
    );
    drop(md5_daemon);
    let a = try_console_connect(s.admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    for bad in [
        "SHOW TABLES",
        "DROP TABLE x",
        "DISABLE",
        "DISABLE 10.9.9.9:1",
        "SWITCHOVER main",
        "SET work_mem = 1",
        "PAUSE nosuch",
    ] {
        let e = a.simple_query(bad).await.unwrap_err();
        assert!(e.as_db_error().is_some(), "{bad}: a clear error, got {e:?}");
    }
    let e = a.simple_query("SET log = '[['").await.unwrap_err();
    assert!(format!("{e:?}").contains("invalid log filter"), "{e:?}");
    a.simple_query("SET log = 'debug'").await.unwrap();
    a.simple_query("SET log = 'info'").await.unwrap();
    let (_, v) = show(&a, "SHOW VERSION").await;
    assert!(v[0][0].starts_with("Fulcrum"), "still answering: {v:?}");
}

/// The console caps its connections and its login time like the data
/// listeners: idle connections that never log in cannot lock operators
/// out (at most 16 are kept logging in; a new one closes the oldest), a
/// real login among 64 idle sockets is served at once, and an idle
/// connection is closed at the login timeout with FATAL 08P01.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_connections_are_capped_and_logins_time_out() {
    use tokio::io::AsyncReadExt;
    let s = tokio::task::block_in_place(setup);
    let mut idle = Vec::new();
    for _ in 0..64 {
        idle.push(
            tokio::net::TcpStream::connect(("127.0.0.1", s.admin_port))
                .await
                .unwrap(),
        );
    }
    let started = std::time::Instant::now();
    // An operator still gets in, at once.
    let console = tokio::time::timeout(
        Duration::from_secs(5),
        try_console_connect(s.admin_port, CONSOLE_PASSWORD),
    )
    .await
    .expect("a login among idle sockets is served at once")
    .unwrap();
    show(&console, "SHOW POOLS").await;
    // The oldest idle sockets were closed to make room.
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), idle[0].read_to_end(&mut reply))
        .await
        .expect("the oldest idle socket was closed")
        .unwrap();
    // The newest is closed at the login timeout, told why.
    let mut last = idle.pop().unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(25), last.read_to_end(&mut reply))
        .await
        .expect("closed at the login timeout")
        .unwrap();
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(14), "{waited:?}");
    let text = String::from_utf8_lossy(&reply);
    assert!(
        text.contains("08P01") && text.contains("login not finished"),
        "{text}"
    );
    drop(idle);
    // And the console still serves.
    show(&console, "SHOW POOLS").await;
}

/// psql to the console on `port` as `user` with `sslmode` (and the CA for
/// verify-ca): (success, stdout, stderr).
fn console_psql(
    port: u16,
    user: &str,
    password: &str,
    sslmode: &str,
    ca: &std::path::Path,
    sql: &str,
) -> (bool, String, String) {
    let out = std::process::Command::new(fulcrum_testkit::pg_bin("psql"))
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", user])
        .args(["-d", "fulcrum", "-X", "-At", "-c", sql])
        .env("PGPASSWORD", password)
        .env("PGSSLMODE", sslmode)
        .env("PGSSLROOTCERT", ca)
        .env("PGCONNECT_TIMEOUT", "10")
        .output()
        .expect("psql");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    )
}

/// With `[fulcrum] tls_mode = "require"` and a certificate, the console
/// speaks TLS (psql verifies its certificate) and refuses plain logins;
/// a `stats_users` login runs SHOW commands and nothing else.
#[test]
fn console_tls_and_stats_users() {
    let certs = fulcrum_testkit::TestCerts::new().expect("certificates");
    let admin_port = free_port();
    let cfg = PgProxyConfig::new(&fulcrum_suite::pg_primary().primary().addr());
    // ([fulcrum]'s tls_* keys are the clusters' defaults too: this
    // cluster's listener requires TLS as well; the test does not use it.)
    let global = format!(
        "tls_mode = \"require\"\ntls_certificate = \"{}\"\ntls_private_key = \"{}\"\n\
         stats_users = [\"watcher\"]\n",
        certs.cert.display(),
        certs.key.display()
    );
    let toml = console_toml(&cfg, admin_port, &global).replacen(
        "[[cluster]]",
        "[[fulcrum.admin_user]]\nname = \"watcher\"\npassword = \"watch-pw\"\n\n[[cluster]]",
        1,
    );
    let f = FulcrumProcess::start(&toml).expect("start fulcrum");
    let (ok, out, err) = console_psql(
        admin_port,
        CONSOLE_USER,
        CONSOLE_PASSWORD,
        "verify-ca",
        &certs.ca,
        "SHOW VERSION",
    );
    assert!(ok, "{err}\n{}", f.log_contents());
    assert!(out.contains("ulcrum"), "{out}");
    let (ok, _, err) = console_psql(
        admin_port,
        CONSOLE_USER,
        CONSOLE_PASSWORD,
        "disable",
        &certs.ca,
        "SHOW VERSION",
    );
    assert!(!ok && err.contains("requires TLS"), "{err}");
    // The stats user reads...
    let (ok, out, err) = console_psql(
        admin_port,
        "watcher",
        "watch-pw",
        "require",
        &certs.ca,
        "SHOW POOLS",
    );
    assert!(ok, "{err}");
    let _ = out;
    // ...and changes nothing.
    for command in ["PAUSE", "RELOAD", "SET log = 'debug'", "SHOW QUERIES RESET"] {
        let (ok, _, err) = console_psql(
            admin_port, "watcher", "watch-pw", "require", &certs.ca, command,
        );
        assert!(!ok && err.contains("stats user"), "{command}: {err}");
    }
    // The full admin still can.
    let (ok, _, err) = console_psql(
        admin_port,
        CONSOLE_USER,
        CONSOLE_PASSWORD,
        "require",
        &certs.ca,
        "RESUME",
    );
    assert!(ok, "{err}");
}

/// Debian's `prometheus-pgbouncer-exporter`, pointed at Fulcrum's console
/// as at PgBouncer's, exports its pool, stats, databases and lists series
/// with Fulcrum's real figures; then the console's SHUTDOWN drains and
/// stops the daemon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pgbouncer_exporter_reads_the_console_and_shutdown_stops() {
    let c = fulcrum_suite::pg_primary();
    let admin_port = free_port();
    let cfg = PgProxyConfig::new(&c.primary().addr()).client_auth("md5");
    let p = FulcrumProcess::start(&console_toml(&cfg, admin_port, "")).unwrap();
    // Up by now (start returns once it listens).
    let daemon_started = std::time::Instant::now();
    // Traffic to count, and a client holding a transaction (active).
    let client = pg_connect(&cfg).await;
    for _ in 0..200 {
        client.simple_query("SELECT 1").await.unwrap();
    }
    let holder = pg_connect(&cfg).await;
    holder.batch_execute("BEGIN; SELECT 1").await.unwrap();
    let exporter = fulcrum_testkit::tool(
        "/usr/bin/prometheus-pgbouncer-exporter",
        "prometheus-pgbouncer-exporter",
    );
    let port = free_port();
    let mut child = std::process::Command::new(exporter)
        .args([
            "--pgbouncer-host",
            "127.0.0.1",
            "--pgbouncer-port",
            &admin_port.to_string(),
            "--pgbouncer-user",
            CONSOLE_USER,
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .env("PGPASSWORD", CONSOLE_PASSWORD)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the exporter starts");
    let mut text = String::new();
    for _ in 0..100 {
        // The exporter answers HTTP/1.0: read it whole.
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::{Read, Write};
            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
            let mut t = String::new();
            let _ = s.read_to_string(&mut t);
            if t.contains("pgbouncer_active_clients") {
                text = t;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    assert!(
        !text.is_empty(),
        "the exporter never served its series: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let value = |series: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
    };
    assert_eq!(
        value(&format!(
            "pgbouncer_active_clients{{database=\"{APP_DB}\",user=\"{APP_USER}\"}}"
        )),
        1.0,
        "the client in its transaction"
    );
    // SHOW STATS names the database as SHOW POOLS does: the labels match.
    assert!(
        value(&format!(
            "pgbouncer_requests_total{{database=\"{APP_DB}\"}}"
        )) >= 200.0
    );
    assert!(
        value(&format!(
            "pgbouncer_received_bytes_total{{database=\"{APP_DB}\"}}"
        )) > 0.0
    );
    assert_eq!(
        value(&format!("pgbouncer_pool_size{{database=\"{APP_DB}\"}}")),
        20.0
    );
    assert_eq!(
        value("pgbouncer_used_clients "),
        2.0,
        "two clients logged in"
    );
    assert!(value("pgbouncer_used_servers ") >= 1.0);
    holder.batch_execute("COMMIT").await.unwrap();

    // PgBouncer's averages: within the first stats period they run from
    // the daemon's start: at least 2 s ago (waited for, so a per-second
    // figure is below its total), 200 units make at least one a second,
    // and each took some time.
    if let Some(rest) = Duration::from_secs(2).checked_sub(daemon_started.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let console = try_console_connect(admin_port, CONSOLE_PASSWORD)
        .await
        .unwrap();
    let (columns, rows) = show(&console, "SHOW STATS").await;
    let row = rows
        .iter()
        .find(|r| r[0] == APP_DB)
        .unwrap_or_else(|| panic!("a row for {APP_DB}: {rows:?}"));
    let stat = |name: &str| -> u64 {
        let i = columns.iter().position(|c| c == name).unwrap();
        row[i].parse().unwrap()
    };
    for avg in [
        "avg_xact_count",
        "avg_query_count",
        "avg_recv",
        "avg_sent",
        "avg_xact_time",
        "avg_query_time",
    ] {
        assert!(stat(avg) > 0, "{avg}: {columns:?} {row:?}");
    }
    assert!(
        stat("avg_recv") < stat("total_received"),
        "per second: {row:?}"
    );

    // SHUTDOWN drains: the daemon exits by itself.
    console.simple_query("SHUTDOWN").await.unwrap();
    let status = tokio::task::block_in_place(|| p.wait_exit(Duration::from_secs(30)));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}
