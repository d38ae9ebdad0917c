//! `client_auth = "hba"` end to end, through a real daemon in front of a
//! real PostgreSQL: each line's method applied (reject, scram-sha-256,
//! password, trust, cert), a login no line takes refused in PostgreSQL's words,
//! `hostssl` / `hostnossl` by the connection's TLS (psql), rules changed by
//! a reload and kept when the new file is bad, and a bad line that stops the
//! start naming the hba file and its line.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fulcrum_suite::{pg_primary, startup_message, PgProxyConfig, PROTOCOL_3_0};
use fulcrum_testkit::{
    pg_bin, FulcrumProcess, Signal, TestCerts, APP_DB, APP_MD5_USER, APP_PASSWORD, APP_TRUST_USER,
    APP_USER,
};

/// A directory holding the test's `hba.conf`, removed on drop.
struct Rules(PathBuf);

impl Rules {
    fn new(text: &str) -> Rules {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("fulcrum-hba-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        let rules = Rules(dir);
        rules.write(text);
        rules
    }

    fn path(&self) -> PathBuf {
        self.0.join("hba.conf")
    }

    fn write(&self, text: &str) {
        std::fs::write(self.path(), text).expect("write hba.conf");
    }
}

impl Drop for Rules {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The testkit's proxy config (its four `app*` users) with the hba rules.
fn config(rules: &Rules) -> PgProxyConfig {
    PgProxyConfig::new(&pg_primary().primary().addr())
        .client_auth("hba")
        .extra(&format!("auth_hba_file = \"{}\"", rules.path().display()))
}

/// A tokio-postgres login as `user` to `db`, with `password` if any: the
/// server's answer to `SELECT 1`, or the refusal's (SQLSTATE, message).
fn login(
    cfg: &PgProxyConfig,
    user: &str,
    db: &str,
    password: Option<&str>,
) -> Result<i32, (String, String)> {
    let (host, port) = cfg.listen.rsplit_once(':').unwrap();
    let mut conn = format!("host={host} port={port} user={user} dbname={db} connect_timeout=10");
    if let Some(p) = password {
        conn.push_str(&format!(" password={p}"));
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(&conn, tokio_postgres::NoTls)
            .await
            .map_err(|e| match e.as_db_error() {
                Some(db) => (db.code().code().to_owned(), db.message().to_owned()),
                None => ("(no SQLSTATE)".to_owned(), e.to_string()),
            })?;
        tokio::spawn(connection);
        let row = client.query_one("SELECT 1", &[]).await.expect("SELECT 1");
        Ok(row.get(0))
    })
}

/// The code of the first Authentication request Fulcrum sends `user`
/// asking for `db` (3: cleartext password, 5: md5, 10: SASL).
fn first_auth_request(cfg: &PgProxyConfig, user: &str, db: &str) -> i32 {
    let mut s = std::net::TcpStream::connect(&cfg.listen).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let params = [("user", user), ("database", db)];
    s.write_all(&startup_message(PROTOCOL_3_0, &params))
        .unwrap();
    let mut head = [0u8; 9];
    s.read_exact(&mut head).expect("an answer");
    assert_eq!(
        head[0], b'R',
        "an Authentication request, got {:?}",
        head[0] as char
    );
    i32::from_be_bytes([head[5], head[6], head[7], head[8]])
}

fn refused(code: &str, message: &str) -> Result<i32, (String, String)> {
    Err((code.to_owned(), message.to_owned()))
}

#[test]
fn each_line_picks_its_method_and_no_line_is_refused_in_postgresql_words() {
    let rules = Rules::new(&format!(
        "# TYPE DATABASE USER ADDRESS METHOD\n\
         host all {APP_TRUST_USER} 127.0.0.1/32 reject\n\
         host postgres {APP_USER} 127.0.0.1/32 password\n\
         host all {APP_USER} 127.0.0.1/32 scram-sha-256\n\
         host {APP_DB} {APP_MD5_USER} 127.0.0.1/32 trust\n\
         host all all 10.0.0.0/8 trust\n"
    ));
    let cfg = config(&rules);
    let _fulcrum = FulcrumProcess::start(&cfg.to_toml()).expect("start fulcrum");
    assert_eq!(
        login(&cfg, APP_TRUST_USER, APP_DB, Some(APP_PASSWORD)),
        refused(
            "28000",
            &format!("pg_hba.conf rejects connection for host \"127.0.0.1\", user \"{APP_TRUST_USER}\", database \"{APP_DB}\", no encryption")
        ),
        "a reject line refuses even the right password"
    );
    assert_eq!(
        login(&cfg, APP_USER, APP_DB, Some(APP_PASSWORD)),
        Ok(1),
        "scram-sha-256"
    );
    assert_eq!(
        login(&cfg, APP_USER, APP_DB, Some("wrong")),
        refused(
            "28P01",
            &format!("password authentication failed for user \"{APP_USER}\"")
        ),
        "the scram line checks the password"
    );
    assert_eq!(
        login(&cfg, APP_MD5_USER, APP_DB, None),
        Ok(1),
        "trust asks no password"
    );
    // The password line: the password asked in clear (AuthenticationCleartextPassword).
    assert_eq!(first_auth_request(&cfg, APP_USER, "postgres"), 3);
    assert_eq!(
        first_auth_request(&cfg, APP_USER, APP_DB),
        10,
        "SASL on the scram line"
    );
    assert_eq!(login(&cfg, APP_USER, "postgres", Some(APP_PASSWORD)), Ok(1));
    assert_eq!(
        login(&cfg, APP_USER, "postgres", Some("wrong")),
        refused(
            "28P01",
            &format!("password authentication failed for user \"{APP_USER}\"")
        )
    );
    assert_eq!(
        login(&cfg, APP_MD5_USER, "postgres", None),
        refused(
            "28000",
            &format!("no pg_hba.conf entry for host \"127.0.0.1\", user \"{APP_MD5_USER}\", database \"postgres\", no encryption")
        ),
        "the trust line is for database {APP_DB} only"
    );
    assert_eq!(
        login(&cfg, "nobody", APP_DB, Some(APP_PASSWORD)),
        refused(
            "28000",
            &format!("no pg_hba.conf entry for host \"127.0.0.1\", user \"nobody\", database \"{APP_DB}\", no encryption")
        )
    );
}

#[test]
fn reload_changes_the_rules_and_a_bad_file_keeps_the_running_ones() {
    let rules = Rules::new(&format!("host all {APP_USER} 127.0.0.1/32 scram-sha-256\n"));
    let cfg = config(&rules);
    let fulcrum = FulcrumProcess::start(&cfg.to_toml()).expect("start fulcrum");
    assert_eq!(login(&cfg, APP_USER, APP_DB, Some(APP_PASSWORD)), Ok(1));

    rules.write(&format!("host all {APP_USER} 127.0.0.1/32 reject\n"));
    fulcrum.signal(Signal::Hup).unwrap();
    fulcrum
        .wait_for_log("config reloaded", Duration::from_secs(10))
        .unwrap();
    let rejected = refused(
        "28000",
        &format!("pg_hba.conf rejects connection for host \"127.0.0.1\", user \"{APP_USER}\", database \"{APP_DB}\", no encryption"),
    );
    assert_eq!(login(&cfg, APP_USER, APP_DB, Some(APP_PASSWORD)), rejected);

    // A bad line: reported with the file and line; the running rules stay.
    rules.write(&format!(
        "host all {APP_USER} 127.0.0.1/32 trust\nhost all all all ident\n"
    ));
    fulcrum.signal(Signal::Hup).unwrap();
    fulcrum
        .wait_for_log("config not reloaded", Duration::from_secs(10))
        .unwrap();
    let want = format!(
        "auth_hba_file: {}:2: unknown authentication method \"ident\"",
        rules.path().display()
    );
    assert!(
        fulcrum.log_contents().contains(&want),
        "{want} in {}",
        fulcrum.log_contents()
    );
    assert_eq!(login(&cfg, APP_USER, APP_DB, Some(APP_PASSWORD)), rejected);
}

#[test]
fn a_bad_line_stops_the_start_naming_the_file_and_line() {
    let rules = Rules::new("host all all 127.0.0.1/32 trust\n\nhost all +admins all md5\n");
    let fulcrum = FulcrumProcess::spawn(&config(&rules).to_toml()).expect("spawn fulcrum");
    let status = fulcrum
        .wait_exit(Duration::from_secs(10))
        .expect("fulcrum exits");
    assert_eq!(status.code(), Some(2), "{}", fulcrum.log_contents());
    let want = format!(
        "auth_hba_file: {}:3: +admins: +group (role membership) is not supported",
        rules.path().display()
    );
    assert!(
        fulcrum.log_contents().contains(&want),
        "{want} in {}",
        fulcrum.log_contents()
    );
}

/// psql as `user` to the app database with `sslmode`, no password, and a
/// client certificate when given: (succeeded, stdout, stderr).
fn psql(
    cfg: &PgProxyConfig,
    user: &str,
    sslmode: &str,
    cert: Option<&(PathBuf, PathBuf)>,
) -> (bool, String, String) {
    let (host, port) = cfg.listen.rsplit_once(':').unwrap();
    let mut cmd = Command::new(pg_bin("psql"));
    cmd.args([
        "-h",
        host,
        "-p",
        port,
        "-U",
        user,
        "-d",
        APP_DB,
        "-X",
        "-At",
        "-w",
        "-c",
        "SELECT 6 * 7",
    ])
    .env("PGSSLMODE", sslmode)
    .env("PGCONNECT_TIMEOUT", "10")
    .env_remove("PGPASSWORD")
    .env("PGPASSFILE", "/nonexistent");
    if let Some((c, k)) = cert {
        cmd.env("PGSSLCERT", c).env("PGSSLKEY", k);
    }
    let out = cmd.output().expect("run psql");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    )
}

#[test]
fn hostssl_and_hostnossl_follow_the_connections_tls_and_cert_lines_take_certificates() {
    let certs = TestCerts::new().expect("certificates");
    let client = certs.client(APP_MD5_USER).expect("client certificate");
    let rules = Rules::new(&format!(
        "hostssl all {APP_USER} 127.0.0.1/32 trust\n\
         hostnossl all {APP_USER} 127.0.0.1/32 reject\n\
         hostssl all {APP_MD5_USER} 127.0.0.1/32 cert\n"
    ));
    let cfg = config(&rules).extra(&format!(
        "tls_mode = \"allow\"\ntls_certificate = \"{}\"\ntls_private_key = \"{}\"\ntls_client_ca = \"{}\"",
        certs.cert.display(),
        certs.key.display(),
        certs.ca.display()
    ));
    let _fulcrum = FulcrumProcess::start(&cfg.to_toml()).expect("start fulcrum");
    let (ok, out, err) = psql(&cfg, APP_USER, "require", None);
    assert!(ok, "hostssl trust: {err}");
    assert_eq!(out, "42");
    let (ok, _, err) = psql(&cfg, APP_USER, "disable", None);
    assert!(!ok);
    let want = format!("pg_hba.conf rejects connection for host \"127.0.0.1\", user \"{APP_USER}\", database \"{APP_DB}\", no encryption");
    assert!(err.contains(&want), "{want} in {err}");

    let (ok, out, err) = psql(&cfg, APP_MD5_USER, "require", Some(&client));
    assert!(ok, "cert line with a certificate for the user: {err}");
    assert_eq!(out, "42");
    let (ok, _, err) = psql(&cfg, APP_MD5_USER, "require", None);
    assert!(!ok);
    assert!(
        err.contains("connection requires a valid client certificate"),
        "{err}"
    );
    let (ok, _, err) = psql(&cfg, APP_MD5_USER, "disable", None);
    assert!(!ok);
    let want = format!("no pg_hba.conf entry for host \"127.0.0.1\", user \"{APP_MD5_USER}\", database \"{APP_DB}\", no encryption");
    assert!(err.contains(&want), "{want} in {err}");
}
