//! TLS between PostgreSQL clients and Fulcrum, through a real daemon in
//! front of a real PostgreSQL: psql with each `sslmode` against
//! `tls_mode = "allow"` and `"require"` (certificate checked with
//! `verify-full`), PostgreSQL 17's direct TLS negotiation (a rustls client
//! that opens with a ClientHello and ALPN `postgresql`), and certificates
//! renewed by a reload while an earlier TLS client keeps working. The
//! certificates are made at test time (`fulcrum_testkit::TestCerts`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use fulcrum_suite::{pg_primary, startup_message, PROTOCOL_3_0};
use fulcrum_testkit::{
    free_port, pg_bin, FulcrumProcess, Signal, TestCerts, APP_DB, APP_PASSWORD, APP_USER,
};
use fulcrum_tls::rustls;

/// Fulcrum with `tls_mode = mode`, presenting `certs`, trust auth (so the
/// raw clients below log in without a password exchange).
fn start(mode: &str, certs: &TestCerts) -> FulcrumProcess {
    let config = format!(
        "[fulcrum]\nlog = \"info\"\n[[cluster]]\nname = \"tls\"\nprotocol = \"postgres\"\n\
         listen = \"127.0.0.1:{port}\"\nclient_auth = \"trust\"\n\
         tls_mode = \"{mode}\"\ntls_certificate = \"{cert}\"\ntls_private_key = \"{key}\"\n\
         [[cluster.backend]]\naddress = \"{backend}\"\nrole = \"primary\"\n\
         [[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\"\n",
        port = free_port(),
        cert = certs.cert.display(),
        key = certs.key.display(),
        backend = pg_primary().primary().addr(),
    );
    FulcrumProcess::start(&config).expect("start fulcrum")
}

/// psql through `fulcrum` with `sslmode` (checking the server certificate
/// against `ca` when given): (succeeded, stdout, stderr).
fn psql(
    fulcrum: &FulcrumProcess,
    sslmode: &str,
    ca: Option<&Path>,
    sql: &str,
) -> (bool, String, String) {
    let addr = fulcrum.listen_addrs()[0].clone();
    let (host, port) = addr.rsplit_once(':').unwrap();
    let mut cmd = Command::new(pg_bin("psql"));
    cmd.args([
        "-h", host, "-p", port, "-U", APP_USER, "-d", APP_DB, "-X", "-At", "-c", sql,
    ])
    .env("PGSSLMODE", sslmode)
    .env("PGCONNECT_TIMEOUT", "10")
    .env("PGPASSWORD", APP_PASSWORD);
    if let Some(ca) = ca {
        cmd.env("PGSSLROOTCERT", ca);
    }
    let out = cmd.output().expect("run psql");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    )
}

#[test]
fn require_serves_tls_clients_and_refuses_plain_ones_with_28000() {
    let certs = TestCerts::new().expect("certificates");
    let fulcrum = start("require", &certs);
    let (ok, out, err) = psql(&fulcrum, "verify-full", Some(&certs.ca), "SELECT 40 + 2");
    assert!(ok, "{err}");
    assert_eq!(out, "42");
    let (ok, out, err) = psql(&fulcrum, "require", None, "\\conninfo");
    assert!(ok && out.contains("SSL connection"), "{out} {err}");
    let (ok, _, err) = psql(&fulcrum, "disable", None, "SELECT 1");
    assert!(!ok);
    assert!(err.contains("requires TLS"), "{err}");
    // The SQLSTATE, as a driver sees it.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let addr = fulcrum.listen_addrs()[0].clone();
    let (host, port) = addr.rsplit_once(':').unwrap();
    let conn = format!("host={host} port={port} user={APP_USER} dbname={APP_DB} sslmode=disable");
    let e = rt
        .block_on(tokio_postgres::connect(&conn, tokio_postgres::NoTls))
        .err()
        .expect("refused");
    assert_eq!(e.code().map(|c| c.code()), Some("28000"), "{e:?}");
    // A certificate from another CA is not trusted.
    let other = TestCerts::new().expect("other certificates");
    let (ok, _, err) = psql(&fulcrum, "verify-full", Some(&other.ca), "SELECT 1");
    assert!(!ok, "an unknown CA must fail verification");
    assert!(err.contains("certificate"), "{err}");
}

#[test]
fn allow_serves_both() {
    let certs = TestCerts::new().expect("certificates");
    let fulcrum = start("allow", &certs);
    let (ok, out, err) = psql(&fulcrum, "prefer", None, "\\conninfo");
    assert!(
        ok && out.contains("SSL connection"),
        "prefer gets TLS: {out} {err}"
    );
    let (ok, out, err) = psql(&fulcrum, "disable", None, "\\conninfo");
    assert!(ok && !out.contains("SSL connection"), "{out} {err}");
    let (ok, out, err) = psql(&fulcrum, "disable", None, "SELECT 7");
    assert!(ok, "{err}");
    assert_eq!(out, "7");
}

/// A rustls client trusting `ca`, offering ALPN `postgresql`.
fn tls_client(ca: &Path) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(ca).unwrap();
    for cert in rustls_pemfile_certs(&pem) {
        roots.add(cert).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Arc::new(config)
}

fn rustls_pemfile_certs(pem: &[u8]) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .unwrap()
}

/// A direct-TLS session (no SSLRequest: TLS from the first byte), logged in
/// (trust) up to its first ReadyForQuery.
struct DirectClient {
    tls: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
}

impl DirectClient {
    fn connect(fulcrum: &FulcrumProcess, ca: &Path) -> DirectClient {
        let addr = fulcrum.listen_addrs()[0].clone();
        let tcp = TcpStream::connect(&addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let conn = rustls::ClientConnection::new(tls_client(ca), name).unwrap();
        let mut c = DirectClient {
            tls: rustls::StreamOwned::new(conn, tcp),
        };
        c.tls
            .write_all(&startup_message(
                PROTOCOL_3_0,
                &[("user", APP_USER), ("database", APP_DB)],
            ))
            .unwrap();
        c.until_ready();
        c
    }

    /// Reads messages up to ReadyForQuery; returns the DataRow values seen.
    fn until_ready(&mut self) -> Vec<String> {
        let mut values = Vec::new();
        loop {
            let mut header = [0u8; 5];
            self.tls.read_exact(&mut header).expect("a message");
            let len = u32::from_be_bytes(header[1..5].try_into().unwrap()) as usize;
            let mut body = vec![0u8; len - 4];
            self.tls.read_exact(&mut body).unwrap();
            match header[0] {
                b'E' => panic!("error: {}", String::from_utf8_lossy(&body)),
                b'D' => {
                    let n = u32::from_be_bytes(body[2..6].try_into().unwrap()) as usize;
                    values.push(String::from_utf8_lossy(&body[6..6 + n]).into_owned());
                }
                b'Z' => return values,
                _ => {}
            }
        }
    }

    fn query(&mut self, sql: &str) -> Vec<String> {
        let mut msg = vec![b'Q'];
        msg.extend_from_slice(&((sql.len() + 5) as u32).to_be_bytes());
        msg.extend_from_slice(sql.as_bytes());
        msg.push(0);
        self.tls.write_all(&msg).unwrap();
        self.until_ready()
    }

    /// The server certificate this session was given.
    fn server_certificate(&self) -> Vec<u8> {
        self.tls.conn.peer_certificates().unwrap()[0].to_vec()
    }
}

/// As PostgreSQL 17: a direct TLS connection that did not agree on
/// `postgresql` by ALPN is refused (FATAL 08P01) before any login.
#[test]
fn direct_tls_without_alpn_is_refused() {
    let certs = TestCerts::new().expect("certificates");
    let fulcrum = start("require", &certs);
    let addr = fulcrum.listen_addrs()[0].clone();
    let tcp = TcpStream::connect(&addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut config = (*tls_client(&certs.ca)).clone();
    config.alpn_protocols.clear();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(&startup_message(
        PROTOCOL_3_0,
        &[("user", APP_USER), ("database", APP_DB)],
    ))
    .unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer);
    assert_eq!(answer.first(), Some(&b'E'), "an ErrorResponse: {answer:?}");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.contains("08P01") && text.contains("ALPN"), "{text}");
    // With ALPN, the same direct connection logs in.
    let mut ok = DirectClient::connect(&fulcrum, &certs.ca);
    assert_eq!(ok.query("SELECT 1"), vec!["1"]);
}

#[test]
fn direct_tls_negotiation_and_certificates_renewed_by_reload() {
    let certs = TestCerts::new().expect("certificates");
    let fulcrum = start("require", &certs);
    let mut early = DirectClient::connect(&fulcrum, &certs.ca);
    assert_eq!(early.query("SELECT 1 + 1"), vec!["2"]);
    let first = early.server_certificate();

    // Renewed in place: same paths, a new CA and certificate.
    let renewed = TestCerts::in_dir(&certs.dir, "renewed").unwrap();
    std::fs::copy(&renewed.cert, &certs.cert).unwrap();
    std::fs::copy(&renewed.key, &certs.key).unwrap();
    fulcrum.signal(Signal::Hup).unwrap();
    fulcrum
        .wait_for_log("config reloaded", Duration::from_secs(10))
        .unwrap();
    let mut late = DirectClient::connect(&fulcrum, &renewed.ca);
    assert_ne!(
        late.server_certificate(),
        first,
        "new clients get the new certificate"
    );
    assert_eq!(late.query("SELECT 3"), vec!["3"]);
    assert_eq!(
        early.query("SELECT 4"),
        vec!["4"],
        "the earlier client keeps working"
    );

    // A broken file at the next reload: reported, and the running
    // certificate stays.
    std::fs::write(&certs.cert, "not a certificate").unwrap();
    fulcrum.signal(Signal::Hup).unwrap();
    fulcrum
        .wait_for_log("config not reloaded", Duration::from_secs(10))
        .unwrap();
    assert!(
        fulcrum.log_contents().contains("tls_certificate"),
        "{}",
        fulcrum.log_contents()
    );
    let (ok, out, err) = psql(&fulcrum, "verify-full", Some(&renewed.ca), "SELECT 5");
    assert!(ok, "{err}");
    assert_eq!(out, "5");
}
