//! TLS logins end to end: verify-full with channel binding, prefer, plain
//! text refused, a wrong CA and an expired certificate, client certificates,
//! pgbench in every protocol mode, and garbage or stalled handshakes.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use fulcrum_testkit::{
    pg_bin, FulcrumProcess, PgCluster, TestCerts, APP_DB, APP_MD5_USER, APP_PASSWORD, APP_USER,
};

use super::helpers::{fulcrum, psql, verify_full, CERTS, CLUSTER, SERVER_SSL};

#[test]
fn verify_full_to_a_tls_only_server_with_channel_binding_on_both_sides() {
    let f = fulcrum(
        &CLUSTER.primary().addr(),
        &format!(
            "{}\nserver_channel_binding = \"require\"",
            verify_full(&CERTS.ca)
        ),
        "",
    );
    // The client side binds to Fulcrum's certificate; the server side,
    // with `require`, fails unless Fulcrum's login used SCRAM-SHA-256-PLUS.
    let (ok, out, err) = psql(&f, APP_USER, "channel_binding=require", SERVER_SSL);
    assert!(ok, "{err}\n{}", f.log_contents());
    assert_eq!(out, "t");
    // Writes go through too: the health probes reached the primary over TLS.
    let (ok, out, err) = psql(
        &f,
        APP_USER,
        "",
        "CREATE TEMP TABLE t(x int); INSERT INTO t VALUES (7); SELECT sum(x) FROM t",
    );
    assert!(ok, "{err}");
    assert!(out.ends_with('7'), "{out}");
    // An md5 user cannot bind: with `require` the server login is refused, clearly.
    let (ok, _, err) = psql(&f, APP_MD5_USER, "", "SELECT 1");
    assert!(!ok);
    assert!(
        err.contains("channel binding") || f.log_contents().contains("channel binding"),
        "{err}"
    );
}

#[test]
fn prefer_uses_tls_when_the_server_offers_it() {
    // The default is `prefer`: no server_tls key at all.
    let f = fulcrum(&CLUSTER.primary().addr(), "", "");
    let (ok, out, err) = psql(&f, APP_USER, "", SERVER_SSL);
    assert!(ok, "{err}\n{}", f.log_contents());
    assert_eq!(out, "t");
}

#[test]
fn plain_text_to_a_tls_only_server_is_a_clear_error() {
    let f = fulcrum(&CLUSTER.primary().addr(), "server_tls = \"disable\"", "");
    let started = Instant::now();
    let (ok, _, err) = psql(&f, APP_USER, "", "SELECT 1");
    assert!(!ok);
    assert!(started.elapsed() < Duration::from_secs(20), "no hang");
    // The server's own refusal reaches the client or the log.
    let log = f.log_contents();
    assert!(
        err.contains("no encryption") || log.contains("no encryption"),
        "{err}\n{log}"
    );
}

#[test]
fn a_wrong_ca_is_refused_with_the_reason() {
    let other = TestCerts::new().expect("another CA");
    let f = fulcrum(&CLUSTER.primary().addr(), &verify_full(&other.ca), "");
    let (ok, _, err) = psql(&f, APP_USER, "", "SELECT 1");
    assert!(!ok);
    let log = f.log_contents();
    assert!(
        err.contains("invalid peer certificate") || log.contains("invalid peer certificate"),
        "{err}\n{log}"
    );
    // verify-ca with the right CA but a name the certificate does not carry
    // still works; verify-full with that name does not.
    let port = CLUSTER.primary().port();
    let ca_only = format!(
        "server_tls = \"verify-ca\"\nserver_tls_ca = \"{}\"",
        CERTS.ca.display()
    );
    let alias = format!("127.0.0.2:{port}");
    if TcpStream::connect(&alias).is_ok() {
        let f = fulcrum(&alias, &ca_only, "");
        let (ok, out, err) = psql(&f, APP_USER, "", SERVER_SSL);
        assert!(ok, "{err}");
        assert_eq!(out, "t");
        let f = fulcrum(&alias, &verify_full(&CERTS.ca), "");
        let (ok, _, _) = psql(&f, APP_USER, "", "SELECT 1");
        assert!(!ok, "127.0.0.2 is not in the certificate");
        assert!(f.log_contents().contains("NotValidForName"));
    }
}

#[test]
fn an_expired_server_certificate_is_refused() {
    let certs = TestCerts::new().expect("certificates");
    certs
        .expire_server_certificate()
        .expect("expired certificate");
    let cluster = PgCluster::builder()
        .tls(&certs, true)
        .start()
        .expect("cluster with an expired certificate");
    let f = fulcrum(&cluster.primary().addr(), &verify_full(&certs.ca), "");
    let (ok, _, err) = psql(&f, APP_USER, "", "SELECT 1");
    assert!(!ok);
    let log = f.log_contents();
    assert!(
        err.contains("certificate expired") || log.contains("certificate expired"),
        "{err}\n{log}"
    );
    // `require` encrypts without checking: it connects.
    let f = fulcrum(&cluster.primary().addr(), "server_tls = \"require\"", "");
    let (ok, out, err) = psql(&f, APP_USER, "", SERVER_SSL);
    assert!(ok, "{err}");
    assert_eq!(out, "t");
}

#[test]
fn client_certificates_name_the_user() {
    let extra = format!(
        "client_auth = \"cert\"\ntls_client_ca = \"{}\"",
        CERTS.ca.display()
    );
    let f = fulcrum(&CLUSTER.primary().addr(), "", &extra);
    let (cert, key) = CERTS.client(APP_USER).expect("client certificate");
    let with_cert = format!("sslcert={} sslkey={}", cert.display(), key.display());
    let (ok, out, err) = psql(&f, APP_USER, &with_cert, "SELECT current_user");
    assert!(ok, "{err}\n{}", f.log_contents());
    assert_eq!(out, APP_USER);
    // The same certificate for another user.
    let (ok, _, err) = psql(&f, APP_MD5_USER, &with_cert, "SELECT 1");
    assert!(!ok);
    assert!(err.contains("certificate authentication failed"), "{err}");
    // No certificate at all.
    let (ok, _, err) = psql(&f, APP_USER, "sslcert=/nonexistent", "SELECT 1");
    assert!(!ok);
    assert!(err.contains("requires a valid client certificate"), "{err}");
    // A certificate from another CA fails in the handshake.
    let other = TestCerts::new().expect("another CA");
    let (cert, key) = other.client(APP_USER).expect("client certificate");
    let foreign = format!("sslcert={} sslkey={}", cert.display(), key.display());
    let (ok, _, err) = psql(&f, APP_USER, &foreign, "SELECT 1");
    assert!(!ok, "{err}");
}

#[test]
fn pgbench_with_tls_on_both_sides_in_every_protocol_mode() {
    let f = fulcrum(&CLUSTER.primary().addr(), &verify_full(&CERTS.ca), "");
    let init = Command::new(pg_bin("pgbench"))
        .args(["-i", "-s", "1", "-q", "-h", "127.0.0.1"])
        .args(["-p", &CLUSTER.primary().port().to_string()])
        .args(["-U", "postgres", APP_DB])
        .env("PGSSLMODE", "require")
        .output()
        .expect("pgbench -i");
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let addr = f.listen_addrs()[0].clone();
    let (host, port) = addr.rsplit_once(':').unwrap();
    for mode in ["simple", "extended", "prepared"] {
        for connect_each in [false, true] {
            let mut cmd = Command::new(pg_bin("pgbench"));
            cmd.args(["-n", "-S", "-M", mode, "-c", "4", "-j", "2", "-t", "50"])
                .args(["-h", host, "-p", port, "-U", APP_USER, APP_DB])
                .env("PGSSLMODE", "require")
                .env("PGPASSWORD", APP_PASSWORD)
                .env("PGCONNECT_TIMEOUT", "10");
            if connect_each {
                cmd.arg("-C");
            }
            let out = cmd.output().expect("pgbench");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success()
                    && stdout.contains("number of transactions actually processed: 200/200"),
                "-M {mode} -C {connect_each}: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Sends an SSLRequest to `f`, reads the `S`: the socket, ready for a handshake.
fn ssl_requested(f: &FulcrumProcess) -> TcpStream {
    let mut s = TcpStream::connect(&f.listen_addrs()[0]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]).unwrap();
    let mut answer = [0u8; 1];
    s.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"S");
    s
}

#[test]
fn garbage_and_stalled_handshakes_are_closed_and_harm_no_one() {
    let f = fulcrum(
        &CLUSTER.primary().addr(),
        "",
        "client_login_timeout = \"1s\"",
    );
    // Garbage where the ClientHello should be: Fulcrum closes the socket.
    let mut s = ssl_requested(&f);
    s.write_all(&[0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5])
        .unwrap();
    s.write_all(b"this is not TLS at all").unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    // Whatever came back (an alert at most), the connection is over.
    assert!(rest.len() < 64, "{rest:?}");
    // Half a ClientHello, then nothing: the login timeout closes it.
    let mut s = ssl_requested(&f);
    s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).unwrap();
    let started = Instant::now();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(8),
        "closed after {waited:?}"
    );
    // A proper client is served throughout.
    let (ok, out, err) = psql(&f, APP_USER, "", "SELECT 40 + 2");
    assert!(ok, "{err}");
    assert_eq!(out, "42");
    assert!(f.try_wait().is_none(), "fulcrum is still running");
}
