//! A PgBouncer user's migration end to end (issue 48): one PgBouncer
//! config using hba rules, a Unix socket, statement pooling, a per-user
//! pool mode, a forced server login with its `connect_query` per database,
//! and an auth file holding a SCRAM verifier beside `auth_user` and
//! `auth_query`, imported with `fulcrum import pgbouncer`, passed by
//! `fulcrum check` and served by a real daemon in front of the binary's
//! shared primary, as PgBouncer would serve it.

use std::path::Path;

use fulcrum_suite::pg_primary;
use fulcrum_testkit::{
    free_port, run_fulcrum, run_psql, wait_for_unix, FulcrumProcess, ScratchDir, APP_DB,
    APP_PASSWORD, APP_USER,
};

/// A role the server stores as SCRAM: its auth-file entry is only that.
const SCRAM_ROLE: &str = "mig_scram";
const SCRAM_PASSWORD: &str = "known-to-the-client-only";
/// The login `[databases]` forces for the `owned` alias.
const OWNER: &str = "mig_owner";
const OWNER_PASSWORD: &str = "owner-secret";
/// A user an hba `reject` line refuses.
const REJECTED: &str = "mig_rejected";

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The roles, and the table the forced login's `connect_query` writes to.
fn roles() -> String {
    let c = pg_primary();
    c.primary()
        .sql(&format!(
            "SET password_encryption = 'scram-sha-256'; \
             CREATE ROLE {SCRAM_ROLE} LOGIN PASSWORD '{SCRAM_PASSWORD}'; \
             CREATE ROLE {OWNER} LOGIN PASSWORD '{OWNER_PASSWORD}'; \
             CREATE ROLE {REJECTED} LOGIN PASSWORD 'never-asked'; \
             CREATE TABLE IF NOT EXISTS mig_connects (at timestamptz DEFAULT now()); \
             GRANT INSERT, SELECT ON mig_connects TO {OWNER}"
        ))
        .expect("roles");
    c.primary()
        .sql(&format!(
            "SELECT rolpassword FROM pg_authid WHERE rolname = '{SCRAM_ROLE}'"
        ))
        .expect("the stored verifier")
}

/// Writes the PgBouncer files into `dir`; returns the ini's path.
fn pgbouncer_files(dir: &Path, verifier: &str, port: u16) -> std::path::PathBuf {
    let server = pg_primary().primary().addr();
    let (host, server_port) = server.rsplit_once(':').unwrap();
    std::fs::write(
        dir.join("userlist.txt"),
        format!(
            "\"{APP_USER}\" \"{APP_PASSWORD}\"\n\"postgres\" \"trusted-anyway\"\n\
             \"{SCRAM_ROLE}\" \"{verifier}\"\n\"{REJECTED}\" \"never-asked\"\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("hba.conf"),
        format!(
            "local all all scram-sha-256\n\
             host all {REJECTED} 127.0.0.1/32 reject\n\
             host all all 127.0.0.1/32 scram-sha-256\n"
        ),
    )
    .unwrap();
    let ini = dir.join("pgbouncer.ini");
    std::fs::write(
        &ini,
        format!(
            "[databases]\n\
             {APP_DB} = host={host} port={server_port} dbname={APP_DB}\n\
             owned = host={host} port={server_port} dbname={APP_DB} user={OWNER} password={OWNER_PASSWORD} connect_query='INSERT INTO mig_connects DEFAULT VALUES'\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir = {dir}\n\
             auth_type = hba\n\
             auth_hba_file = {dir}/hba.conf\n\
             auth_file = {dir}/userlist.txt\n\
             auth_user = postgres\n\
             auth_query = SELECT usename, passwd FROM pg_shadow WHERE usename = $1\n\
             pool_mode = statement\n\
             [users]\n\
             {APP_USER} = pool_mode=session\n",
            dir = dir.display()
        ),
    )
    .unwrap();
    ini
}

async fn login(
    port: u16,
    user: &str,
    password: &str,
    db: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(
        &format!(
            "host=127.0.0.1 port={port} user={user} password={password} dbname={db} connect_timeout=10"
        ),
        tokio_postgres::NoTls,
    )
    .await?;
    tokio::spawn(conn);
    Ok(client)
}

async fn value(client: &tokio_postgres::Client, sql: &str) -> String {
    match &client.simple_query(sql).await.unwrap()[..] {
        [tokio_postgres::SimpleQueryMessage::RowDescription(_), tokio_postgres::SimpleQueryMessage::Row(r), ..]
        | [tokio_postgres::SimpleQueryMessage::Row(r), ..] => r.get(0).unwrap().to_owned(),
        other => panic!("{sql}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pgbouncer_config_using_every_item_imports_checks_and_serves_as_pgbouncer_would() {
    let verifier = roles();
    assert!(verifier.starts_with("SCRAM-SHA-256$"), "{verifier}");
    let dir = ScratchDir::new().unwrap();
    let port = free_port();
    let ini = pgbouncer_files(dir.path(), &verifier, port);
    let out_path = dir.path().join("fulcrum.toml");
    let userlist = dir.path().join("userlist.txt");
    let imported = run_fulcrum(&[
        "import".as_ref(),
        "pgbouncer".as_ref(),
        ini.as_os_str(),
        "--userlist".as_ref(),
        userlist.as_os_str(),
        "--output".as_ref(),
        out_path.as_os_str(),
    ]);
    let notes = text(&imported.stderr);
    assert!(imported.status.success(), "{notes}");
    let toml = std::fs::read_to_string(&out_path).unwrap();
    for carried in [
        "client_auth = \"hba\"",
        "auth_hba_file = ",
        "unix_socket_dir = ",
        "pool_mode = \"statement\"",
        "pool_mode = \"session\"",
        &format!("server_user = \"{OWNER}\""),
        "connect_query = \"INSERT INTO mig_connects DEFAULT VALUES\"",
        &format!("password = \"{verifier}\""),
        "auth_query = ",
    ] {
        assert!(
            toml.contains(carried),
            "{carried} carried over:\n{toml}\n{notes}"
        );
    }
    assert!(
        !toml.contains(SCRAM_PASSWORD),
        "no password of the verifier's user"
    );
    let checked = run_fulcrum(&["check".as_ref(), "--config".as_ref(), out_path.as_os_str()]);
    assert!(
        checked.status.success(),
        "fulcrum check: {}{}",
        text(&checked.stdout),
        text(&checked.stderr)
    );
    let _daemon = FulcrumProcess::start(&toml).expect("the imported config serves");
    let socket = dir.path().join(format!(".s.PGSQL.{port}"));
    assert!(wait_for_unix(&socket, std::time::Duration::from_secs(10)));

    // A reject line refuses its user, as PostgreSQL words it.
    let Err(e) = login(port, REJECTED, "never-asked", APP_DB).await else {
        panic!("{REJECTED} is refused by its reject line");
    };
    let db = e.as_db_error().unwrap_or_else(|| panic!("{e:?}"));
    assert_eq!(db.code().code(), "28000", "{db:?}");
    assert!(db.message().contains("rejects connection"), "{db:?}");

    // psql over the socket directory (the hba `local` line).
    let host_port = format!("{}:{port}", dir.path().display());
    let out = run_psql(&host_port, APP_USER, APP_PASSWORD, APP_DB, "SELECT 40 + 2").unwrap();
    assert_eq!(out, "42");

    // The verifier's user logs in through a server rule demanding SCRAM;
    // in statement pooling a transaction block ends it, in PgBouncer's words.
    let scram = login(port, SCRAM_ROLE, SCRAM_PASSWORD, APP_DB)
        .await
        .expect("the verifier's user logs in");
    assert_eq!(value(&scram, "SELECT current_user").await, SCRAM_ROLE);
    let e = scram.batch_execute("BEGIN").await.unwrap_err();
    let db = e.as_db_error().unwrap_or_else(|| panic!("{e:?}"));
    assert_eq!(db.code().code(), "08P01", "{db:?}");
    assert_eq!(
        db.message(),
        "transaction blocks not allowed in statement pooling mode"
    );

    // The pool_mode=session user keeps its temporary table.
    let app = login(port, APP_USER, APP_PASSWORD, APP_DB).await.unwrap();
    app.batch_execute("CREATE TEMP TABLE kept (x int)")
        .await
        .unwrap();
    app.batch_execute("INSERT INTO kept VALUES (1), (2)")
        .await
        .unwrap();
    assert_eq!(value(&app, "SELECT count(*) FROM kept").await, "2");

    // The database with user= runs as that user, its connect_query ran.
    let before: i64 = pg_primary()
        .primary()
        .sql("SELECT count(*) FROM mig_connects")
        .unwrap()
        .parse()
        .unwrap();
    let owned = login(port, APP_USER, APP_PASSWORD, "owned").await.unwrap();
    assert_eq!(value(&owned, "SELECT current_user").await, OWNER);
    let after: i64 = pg_primary()
        .primary()
        .sql("SELECT count(*) FROM mig_connects")
        .unwrap()
        .parse()
        .unwrap();
    assert!(after > before, "connect_query ran: {before} -> {after}");
}
