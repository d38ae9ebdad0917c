//! `[[cluster.user]]`s whose config holds only what PostgreSQL stores
//! (PgBouncer's auth file with SCRAM secrets or md5 hashes): no password
//! is in any file. Each test creates its role on the server with a
//! password, reads the role's `pg_authid.rolpassword` and writes only that
//! into Fulcrum's config. Clients log in with tokio-postgres and the
//! password; Fulcrum checks them against the verifier (hash) and logs in
//! to a server demanding SCRAM (md5) with what they proved.

use std::sync::Once;

use fulcrum_suite::{first_value, pg_primary};
use fulcrum_testkit::{free_port, FulcrumProcess, PgCluster, APP_DB, APP_MD5_USER, APP_PASSWORD};
use tokio_postgres::error::SqlState;

/// A role stored as SCRAM, which the harness's pg_hba.conf sends to
/// `scram-sha-256` (its catch-all line), and one with the same password
/// (so another salt: another verifier).
const ROLE: &str = "verifier_only";
const TWIN: &str = "verifier_twin";
const ROLE_PASSWORD: &str = "only-the-client-knows";

fn cluster() -> &'static PgCluster {
    static ROLES: Once = Once::new();
    let c = pg_primary();
    ROLES.call_once(|| {
        c.primary()
            .sql(&format!(
                "SET password_encryption = 'scram-sha-256'; \
                 CREATE ROLE {ROLE} LOGIN PASSWORD '{ROLE_PASSWORD}'; \
                 CREATE ROLE {TWIN} LOGIN PASSWORD '{ROLE_PASSWORD}'"
            ))
            .expect("roles");
    });
    c
}

/// What the server stores for `role`.
fn stored(role: &str) -> String {
    cluster()
        .primary()
        .sql(&format!(
            "SELECT rolpassword FROM pg_authid WHERE rolname = '{role}'"
        ))
        .expect("pg_authid")
}

/// Fulcrum with one user, `user`, whose config password is `secret`; the
/// health probe logs in as the (trusted) superuser.
fn fulcrum(user: &str, secret: &str, extra: &str) -> (FulcrumProcess, String) {
    let port = free_port();
    let config = format!(
        "[[cluster]]\nname = \"stored\"\nprotocol = \"postgres\"\nlisten = \"127.0.0.1:{port}\"\n\
         pool_mode = \"transaction\"\nhealth_user = \"postgres\"\n{extra}\n\
         [[cluster.backend]]\naddress = \"{}\"\nrole = \"primary\"\n\
         [[cluster.user]]\nname = \"{user}\"\npassword = \"{secret}\"\n",
        cluster().primary().addr()
    );
    assert!(!config.contains(ROLE_PASSWORD) && !config.contains(APP_PASSWORD));
    let f = FulcrumProcess::start(&config).expect("start fulcrum");
    (f, format!("host=127.0.0.1 port={port} dbname={APP_DB}"))
}

async fn login(
    conn: &str,
    user: &str,
    password: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut config: tokio_postgres::Config = conn.parse().expect("connection string");
    config.user(user).password(password);
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// The error of a login whose server login fails: at the login, or at the
/// first statement (when the login took no server connection).
async fn server_login_error(conn: &str, user: &str, password: &str) -> String {
    let e = match login(conn, user, password).await {
        Err(e) => e,
        Ok(client) => client.simple_query("SELECT 1").await.unwrap_err(),
    };
    e.as_db_error()
        .map(|d| d.message().to_owned())
        .unwrap_or_else(|| format!("{e:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_given_by_its_scram_verifier_logs_in_and_its_keys_open_server_connections() {
    let verifier = stored(ROLE);
    assert!(verifier.starts_with("SCRAM-SHA-256$"), "{verifier}");
    let (f, conn) = fulcrum(ROLE, &verifier, "pool_size = 4");
    // The wrong password first: refused as PostgreSQL refuses it, and no
    // key is learnt from it.
    let wrong = login(&conn, ROLE, "not-the-password").await.unwrap_err();
    assert_eq!(wrong.code(), Some(&SqlState::INVALID_PASSWORD), "{wrong:?}");
    let a = login(&conn, ROLE, ROLE_PASSWORD)
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", f.log_contents()));
    assert_eq!(first_value(&a, "SELECT current_user").await, ROLE);
    // Two transactions at once: two server connections, the second opened
    // with the keys the first client proved.
    let b = login(&conn, ROLE, ROLE_PASSWORD)
        .await
        .expect("second client");
    a.batch_execute("BEGIN").await.unwrap();
    b.batch_execute("BEGIN").await.unwrap();
    // (Fulcrum answers pg_backend_pid() with the client's own pid: the
    // server connection is told by the port it comes from.)
    let port_a = first_value(&a, "SELECT inet_client_port()").await;
    let port_b = first_value(&b, "SELECT inet_client_port()").await;
    assert_ne!(port_a, port_b, "two server connections");
    let users = cluster()
        .primary()
        .sql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = '{ROLE}' AND client_port IN ({port_a}, {port_b})"
        ))
        .unwrap();
    assert_eq!(users, "2", "both logged in to the server as {ROLE}");
    a.batch_execute("COMMIT").await.unwrap();
    b.batch_execute("COMMIT").await.unwrap();
    drop((a, b));
    // The wrong password stays wrong after the keys are known, and the
    // verifier itself is no password.
    for password in ["not-the-password", verifier.as_str()] {
        let wrong = login(&conn, ROLE, password).await.unwrap_err();
        assert_eq!(wrong.code(), Some(&SqlState::INVALID_PASSWORD), "{wrong:?}");
    }
    assert!(
        !f.log_contents().contains(&verifier[14..30]),
        "the verifier is not logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verifier_the_server_does_not_hold_or_a_server_asking_for_the_password_is_a_clear_error()
{
    // The twin's verifier checks the same password, but the server holds
    // another (its salt) for ROLE: the client gets in to Fulcrum, the
    // server login is refused, saying why.
    let (_f, conn) = fulcrum(ROLE, &stored(TWIN), "");
    let text = server_login_error(&conn, ROLE, ROLE_PASSWORD).await;
    assert!(
        text.contains(&format!("user \"{ROLE}\""))
            && text.contains("salt or iteration count differs"),
        "{text}"
    );
    // app_plain is stored as SCRAM, and pg_hba.conf asks it for the
    // password in clear text, which Fulcrum does not know.
    let user = fulcrum_testkit::APP_PLAIN_USER;
    let (_f, conn) = fulcrum(user, &stored(user), "");
    let text = server_login_error(&conn, user, APP_PASSWORD).await;
    assert!(
        text.contains("clear text") && text.contains(&format!("user \"{user}\"")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_given_by_its_md5_hash_logs_in_with_md5_on_both_sides() {
    let hash = stored(APP_MD5_USER);
    assert!(hash.starts_with("md5") && hash.len() == 35, "{hash}");
    let (f, conn) = fulcrum(APP_MD5_USER, &hash, "client_auth = \"md5\"");
    let client = login(&conn, APP_MD5_USER, APP_PASSWORD)
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", f.log_contents()));
    assert_eq!(
        first_value(&client, "SELECT current_user").await,
        APP_MD5_USER
    );
    let wrong = login(&conn, APP_MD5_USER, "nope").await.unwrap_err();
    assert_eq!(wrong.code(), Some(&SqlState::INVALID_PASSWORD), "{wrong:?}");
    // The hash itself is no password.
    let hash_as_password = login(&conn, APP_MD5_USER, &hash).await.unwrap_err();
    assert_eq!(
        hash_as_password.code(),
        Some(&SqlState::INVALID_PASSWORD),
        "{hash_as_password:?}"
    );
}

/// PgBouncer's config with an auth file of SCRAM secrets (`auth_type =
/// md5`, which PgBouncer runs as SCRAM for them), imported: the users are
/// kept with their verifiers, client_auth becomes scram-sha-256, and with
/// no password in the file the health probe's comes from the environment
/// (`fulcrum check` says so until it is set). The result serves the user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_auth_file_of_scram_secrets_serves_its_users() {
    use std::process::Command;
    let verifier = stored(ROLE);
    let dir = std::env::temp_dir().join(format!("fulcrum-import-verifier-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("userlist.txt"),
        format!("\"{ROLE}\" \"{verifier}\"\n"),
    )
    .unwrap();
    let listen = free_port();
    let ini = dir.join("pgbouncer.ini");
    std::fs::write(
        &ini,
        format!(
            "[databases]\n{APP_DB} = host=127.0.0.1 port={} dbname={APP_DB}\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {listen}\nauth_type = md5\nauth_file = userlist.txt\n\
             pool_mode = transaction\n",
            cluster().primary().port()
        ),
    )
    .unwrap();
    let bin = fulcrum_testkit::fulcrum_bin();
    let out = Command::new(&bin)
        .args(["import".as_ref(), "pgbouncer".as_ref(), ini.as_os_str()])
        .output()
        .unwrap();
    let (toml, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(
        toml.contains(&format!("name = \"{ROLE}\"\npassword = \"{verifier}\""))
            && toml.contains("client_auth = \"scram-sha-256\"")
            && toml.contains("health_password = { env = \"FULCRUM_HEALTH_PASSWORD\" }"),
        "{toml}"
    );
    assert!(stderr.contains("FULCRUM_HEALTH_PASSWORD"), "{stderr}");
    let imported = dir.join("fulcrum.toml");
    std::fs::write(&imported, &toml).unwrap();
    let check = Command::new(&bin)
        .args(["check".as_ref(), "--config".as_ref(), imported.as_os_str()])
        .env_remove("FULCRUM_HEALTH_PASSWORD")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stderr);
    assert!(
        !check.status.success()
            && said.contains(
                "health_password: environment variable FULCRUM_HEALTH_PASSWORD is not set"
            ),
        "{said}"
    );
    // The daemon inherits this process's environment; no other test reads
    // the variable.
    std::env::set_var("FULCRUM_HEALTH_PASSWORD", ROLE_PASSWORD);
    let f = FulcrumProcess::start(&toml).expect("start the imported config");
    std::fs::remove_dir_all(&dir).unwrap();
    let conn = format!("host=127.0.0.1 port={listen} dbname={APP_DB}");
    let client = login(&conn, ROLE, ROLE_PASSWORD)
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", f.log_contents()));
    assert_eq!(first_value(&client, "SELECT current_user").await, ROLE);
}
