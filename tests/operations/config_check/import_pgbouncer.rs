//! `fulcrum import-pgbouncer`: Debian's example converted, includes and
//! `max_prepared_statements` handled, and a converted config with several
//! databases serving clients.

use std::path::Path;

use fulcrum_testkit::run_fulcrum;

use super::helpers::{check, text, TempDir};

/// `fulcrum import pgbouncer` on PgBouncer's own example (Debian's
/// /etc/pgbouncer/pgbouncer.ini, from the package, `auth_type = md5`) with
/// an auth file: a config `fulcrum check` accepts, the md5 hash kept, and
/// every setting or user it could not carry over (a SCRAM secret, which md5
/// cannot check) named on stderr.
#[test]
fn import_pgbouncer_converts_debians_example() {
    let pgbouncer = fulcrum_testkit::tool("/usr/sbin/pgbouncer", "pgbouncer");
    assert!(pgbouncer.exists());
    let ini = Path::new("/etc/pgbouncer/pgbouncer.ini");
    let dir = TempDir::new();
    let userlist = dir.write(
        "userlist.txt",
        "\"app\" \"secret\"\n\"hashed\" \"md5d41d8cd98f00b204e9800998ecf8427e\"\n\
         \"scrammed\" \"SCRAM-SHA-256$4096:3Gzs3CMeVwGOnDpOPN0t1w==$IzrC80OShm1c9hPUIu//DMHJilWT3RDB5PkKtTzQ7X0=:aeom++Gc31b0VaQjEwZCJMCTTuItEBoTrxO6LjkwbTU=\"\n",
    );
    // An existing output file readable by all: replaced by one only its
    // owner can read (it holds the auth file's passwords).
    let out_path = dir.write("imported.toml", "old\n");
    std::fs::set_permissions(
        &out_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let out = run_fulcrum(&[
        "import".as_ref(),
        "pgbouncer".as_ref(),
        ini.as_os_str(),
        "--userlist".as_ref(),
        userlist.as_os_str(),
        "--output".as_ref(),
        out_path.as_os_str(),
    ]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for said in [
        "logfile",
        "pidfile",
        "user \"scrammed\": the auth file holds a SCRAM secret, which client_auth = \"md5\" cannot check",
        "[databases] is empty",
    ] {
        assert!(stderr.contains(said), "{said} in:\n{stderr}");
    }
    assert!(!stderr.contains("\"hashed\""), "{stderr}");
    // Debian's unix_socket_dir is carried over, not noted.
    assert!(!stderr.contains("unix_socket_dir"), "{stderr}");
    let toml = std::fs::read_to_string(&out_path).unwrap();
    assert!(
        toml.contains("unix_socket_dir = \"/var/run/postgresql\""),
        "{toml}"
    );
    assert!(
        toml.contains("name = \"hashed\"\npassword = \"md5d41d8cd98f00b204e9800998ecf8427e\""),
        "{toml}"
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&out_path).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the output is the owner's only");
    let checked = check(&out_path);
    assert!(
        checked.status.success(),
        "{}{}",
        text(&checked.stdout),
        text(&checked.stderr)
    );
}

/// `%include` lines are named on stderr (file and line), not dropped in
/// silence; `max_prepared_statements` is carried over only when `fulcrum
/// check` would take it; a new output file is created 0600; the result
/// passes `fulcrum check`.
#[test]
fn import_pgbouncer_names_includes_and_validates_max_prepared_statements() {
    let dir = TempDir::new();
    dir.write("userlist.txt", "\"app\" \"secret\"\n");
    for (value, carried) in [
        ("250", true),
        ("-1", false),
        ("1e3", false),
        ("1 ; x", false),
    ] {
        let ini = dir.write(
            "pgbouncer.ini",
            &format!(
                "[databases]\napp = host=127.0.0.1 port=5432\n[pgbouncer]\nlisten_port = 16432\nauth_file = userlist.txt\n\
                 %include /etc/pgbouncer/extra.ini\nmax_prepared_statements = {value}\n"
            ),
        );
        let out_path = dir.0.join(format!("imported-{}.toml", carried as u8));
        let _ = std::fs::remove_file(&out_path);
        let out = run_fulcrum(&[
            "import".as_ref(),
            "pgbouncer".as_ref(),
            ini.as_os_str(),
            "--output".as_ref(),
            out_path.as_os_str(),
        ]);
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "{}:6: %include /etc/pgbouncer/extra.ini: not followed",
                ini.display()
            )),
            "{stderr}"
        );
        let toml = std::fs::read_to_string(&out_path).unwrap();
        if carried {
            assert!(
                toml.contains(&format!("max_prepared_statements = {value}\n")),
                "{toml}"
            );
        } else {
            assert!(!toml.contains("max_prepared_statements"), "{value}: {toml}");
            assert!(stderr.contains("max_prepared_statements = "), "{stderr}");
        }
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&out_path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "{value}");
        let checked = check(&out_path);
        assert!(
            checked.status.success(),
            "{value}: {}{}",
            text(&checked.stdout),
            text(&checked.stderr)
        );
    }
}

/// A PgBouncer config with several databases on two servers, imported:
/// two clusters on one port, the aliases kept, and clients served through
/// the result reach the server each alias names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_pgbouncer_with_several_databases_serves_clients() {
    use fulcrum_testkit::{FulcrumProcess, PgCluster, APP_DB, APP_PASSWORD, APP_USER};
    let one = fulcrum_suite::pg_primary();
    let two =
        tokio::task::block_in_place(|| PgCluster::builder().start()).expect("a second server");
    let (p1, p2) = (one.primary().port(), two.primary().port());
    let listen = fulcrum_testkit::free_port();
    let dir = TempDir::new();
    let certs = fulcrum_testkit::TestCerts::new().expect("certificates");
    dir.write(
        "userlist.txt",
        &format!(
            "\"{APP_USER}\" \"{APP_PASSWORD}\"\n\"ops\" \"ops-secret\"\n\"watcher\" \"watch-secret\"\n"
        ),
    );
    let ini = dir.write(
        "pgbouncer.ini",
        &format!(
            "[databases]\n{APP_DB} = host=127.0.0.1 port={p1} dbname={APP_DB}\nsales = host=127.0.0.1 port={p1} dbname={APP_DB} pool_size=4\n\
             ledger = host=localhost port={p2} dbname={APP_DB}\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {listen}\n\
             auth_type = md5\nauth_file = userlist.txt\npool_mode = transaction\ndefault_pool_size = 5\nadmin_users = ops\n\
             server_idle_timeout = 60\nclient_login_timeout = 0\nlogfile = /var/log/pgbouncer.log\nstats_period = 60\n\
             stats_users = watcher\nclient_tls_sslmode = require\nclient_tls_cert_file = {}\nclient_tls_key_file = {}\n",
            certs.cert.display(),
            certs.key.display()
        ),
    );
    let out = run_fulcrum(&["import".as_ref(), "pgbouncer".as_ref(), ini.as_os_str()]);
    let (toml, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("stats_period") && stderr.contains("logfile"),
        "{stderr}"
    );
    assert_eq!(toml.matches("[[cluster]]").count(), 2, "{toml}");
    // The console's port is the client port + 1: make it a free one.
    let admin = fulcrum_testkit::free_port();
    let toml = toml.replace(
        &format!("127.0.0.1:{}", listen + 1),
        &format!("127.0.0.1:{admin}"),
    );
    let imported = dir.write("fulcrum.toml", &toml);
    let checked = check(&imported);
    assert!(checked.status.success(), "{}", text(&checked.stderr));
    assert!(
        toml.contains("tls_mode = \"require\"") && toml.contains("stats_users = [\"watcher\"]"),
        "{toml}"
    );
    let p = FulcrumProcess::start(&toml).unwrap();
    // psql as PgBouncer's clients would connect: TLS required.
    let psql = |database: &str, sslmode: &str| {
        let out = std::process::Command::new("psql")
            .arg(format!(
                "host=127.0.0.1 port={listen} user={APP_USER} dbname={database} sslmode={sslmode}"
            ))
            .args([
                "-XAt",
                "-c",
                "SELECT inet_server_port(), ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            ])
            .env("PGPASSWORD", APP_PASSWORD)
            .output()
            .expect("psql");
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    };
    for (database, port) in [(APP_DB, p1), ("sales", p1), ("ledger", p2)] {
        let (ok, out, err) = tokio::task::block_in_place(|| psql(database, "require"));
        assert!(ok, "{database}: {err}\n{}", p.log_contents());
        let got: Option<u16> = out.trim().split('|').next().and_then(|v| v.parse().ok());
        assert_eq!(got, Some(port), "{database} reaches its server: {out}");
    }
    let (ok, _, err) = tokio::task::block_in_place(|| psql(APP_DB, "disable"));
    assert!(
        !ok && err.contains("TLS"),
        "a client without TLS is refused: {err}"
    );
    let console = fulcrum_suite::try_console_connect(admin, "ops-secret").await;
    assert!(
        console.is_ok(),
        "PgBouncer's admin user logs in to the console"
    );
    // stats_users: SHOW, but no commands.
    let watcher = fulcrum_suite::pg_connect_str(&format!(
        "host=127.0.0.1 port={admin} user=watcher password=watch-secret dbname=fulcrum"
    ))
    .await
    .expect("the stats user logs in to the console");
    watcher
        .simple_query("SHOW STATS")
        .await
        .expect("a stats user may SHOW");
    assert!(
        watcher.simple_query("PAUSE").await.is_err(),
        "a stats user may not PAUSE"
    );
}
