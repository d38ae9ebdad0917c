//! `auth_query` on a real PostgreSQL: users who are not in Fulcrum's config
//! (SCRAM and md5 verifiers) log in with psql, pgbench (-C too) and
//! tokio-postgres; Fulcrum checks them against the stored secret and logs in
//! to the server with what the client proved (the SCRAM ClientKey, the md5
//! hash), never knowing the password. Wrong passwords and unknown users get
//! the same 28P01; a password changed on the server is picked up after
//! `auth_cache_ttl`; an auth user without rights gives a clear error.

use std::process::Command;
use std::sync::Once;
use std::time::{Duration, Instant};

use fulcrum_suite::{pg_conn_string, pg_connect_str, pg_primary, scrape};
use fulcrum_testkit::{
    free_port, pg_bin, FulcrumProcess, PgCluster, APP_DB, APP_MD5_USER, APP_PASSWORD,
    APP_TRUST_USER, APP_USER,
};

/// The binary's shared primary, with the role whose password a test changes.
fn cluster() -> &'static PgCluster {
    static ROLE: Once = Once::new();
    let c = pg_primary();
    ROLE.call_once(|| {
        c.primary()
            .sql(&format!(
                "CREATE ROLE rotating LOGIN PASSWORD 'first-pw'; GRANT {APP_USER} TO rotating"
            ))
            .expect("role");
    });
    c
}

/// Fulcrum whose only listed user is `listed` (if any); `auth_user` and the
/// rest come from `auth`.
fn fulcrum(auth: &str) -> FulcrumProcess {
    let config = format!(
        "[fulcrum]\nlog = \"info\"\n[[cluster]]\nname = \"aq\"\nprotocol = \"postgres\"\n\
         listen = \"127.0.0.1:{port}\"\nhealth_interval = \"200ms\"\n{auth}\n\
         [[cluster.backend]]\naddress = \"{backend}\"\nrole = \"primary\"\n",
        port = free_port(),
        backend = cluster().primary().addr(),
    );
    FulcrumProcess::start(&config).expect("start fulcrum")
}

const SUPER_AUTH: &str = "auth_user = \"postgres\"\nauth_password = \"\"";

fn psql(f: &FulcrumProcess, user: &str, password: &str, sql: &str) -> (bool, String, String) {
    let addr = f.listen_addrs()[0].clone();
    let (host, port) = addr.rsplit_once(':').unwrap();
    let out = Command::new(pg_bin("psql"))
        .args([
            "-h", host, "-p", port, "-U", user, "-d", APP_DB, "-X", "-At", "-c", sql,
        ])
        .env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "10")
        .env("PGSSLMODE", "disable")
        .output()
        .expect("psql");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    )
}

#[test]
fn unlisted_scram_and_md5_users_log_in_without_fulcrum_knowing_the_password() {
    let f = fulcrum(SUPER_AUTH);
    // SCRAM verifier: the server login replays the client's ClientKey.
    let (ok, out, err) = psql(&f, APP_USER, APP_PASSWORD, "SELECT current_user");
    assert!(ok, "{err}\n{}", f.log_contents());
    assert_eq!(out, APP_USER);
    // md5 hash: md5 on both sides, with client_auth = "md5" (SCRAM
    // cannot check an md5 hash, and the method offered never depends on
    // what is stored: see `the_method_offered_does_not_tell_who_exists`).
    let md5 = fulcrum(&format!("{SUPER_AUTH}\nclient_auth = \"md5\""));
    let (ok, out, err) = psql(&md5, APP_MD5_USER, APP_PASSWORD, "SELECT current_user");
    assert!(ok, "{err}\n{}", md5.log_contents());
    assert_eq!(out, APP_MD5_USER);
    let (ok, _, err) = psql(&f, APP_MD5_USER, APP_PASSWORD, "SELECT 1");
    assert!(
        !ok && err.contains("password authentication failed"),
        "{err}"
    );
    assert!(
        f.log_contents().contains("stored as md5"),
        "the log says why\n{}",
        f.log_contents()
    );
    // Wrong password and unknown user: the same error.
    let (ok, _, wrong) = psql(&f, APP_USER, "nope", "SELECT 1");
    assert!(!ok);
    assert!(
        wrong.contains("password authentication failed for user \"app\""),
        "{wrong}"
    );
    let (ok, _, unknown) = psql(&f, "nobody_here", "nope", "SELECT 1");
    assert!(!ok);
    assert!(
        unknown.contains("password authentication failed for user \"nobody_here\""),
        "{unknown}"
    );
    let (ok, _, wrong_md5) = psql(&md5, APP_MD5_USER, "nope", "SELECT 1");
    assert!(
        !ok && wrong_md5.contains("password authentication failed"),
        "{wrong_md5}"
    );
}

#[test]
fn pgbench_with_and_without_reconnects() {
    let f = fulcrum(SUPER_AUTH);
    let init = Command::new(pg_bin("pgbench"))
        .args(["-i", "-s", "1", "-q", "-h", "127.0.0.1"])
        .args([
            "-p",
            &cluster().primary().port().to_string(),
            "-U",
            "postgres",
            APP_DB,
        ])
        .output()
        .expect("pgbench -i");
    assert!(init.status.success());
    let addr = f.listen_addrs()[0].clone();
    let (host, port) = addr.rsplit_once(':').unwrap();
    for connect_each in [false, true] {
        let mut cmd = Command::new(pg_bin("pgbench"));
        cmd.args(["-n", "-S", "-c", "4", "-j", "2", "-t", "50"])
            .args(["-h", host, "-p", port, "-U", APP_USER, APP_DB])
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
            "-C {connect_each}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_postgres_logs_in_as_an_unlisted_user() {
    let f = fulcrum(SUPER_AUTH);
    let addr = f.listen_addrs()[0].clone();
    let conn_str = pg_conn_string(&addr, APP_USER, APP_DB);
    let client = pg_connect_str(&conn_str)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", f.log_contents()));
    let stmt = client.prepare("SELECT $1::int + 1").await.unwrap();
    for i in 0..10 {
        let row = client.query_one(&stmt, &[&i]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), i + 1);
    }
    let e = tokio_postgres::connect(
        &conn_str.replace(APP_PASSWORD, "wrong"),
        tokio_postgres::NoTls,
    )
    .await
    .err()
    .expect("refused");
    assert_eq!(
        e.code(),
        Some(&tokio_postgres::error::SqlState::INVALID_PASSWORD),
        "{e}"
    );
}

#[test]
fn a_password_changed_on_the_server_is_picked_up_after_the_ttl() {
    let f = fulcrum(&format!("{SUPER_AUTH}\nauth_cache_ttl = \"1s\""));
    let (ok, _, err) = psql(&f, "rotating", "first-pw", "SELECT 1");
    assert!(ok, "{err}");
    cluster()
        .primary()
        .sql("ALTER ROLE rotating PASSWORD 'second-pw'")
        .expect("alter role");
    std::thread::sleep(Duration::from_millis(1500));
    let (ok, out, err) = psql(&f, "rotating", "second-pw", "SELECT current_user");
    assert!(ok, "{err}\n{}", f.log_contents());
    assert_eq!(out, "rotating");
    let (ok, _, err) = psql(&f, "rotating", "first-pw", "SELECT 1");
    assert!(
        !ok && err.contains("password authentication failed"),
        "{err}"
    );
}

#[test]
fn an_auth_user_without_rights_is_a_clear_error() {
    let f = fulcrum(&format!(
        "auth_user = \"{APP_TRUST_USER}\"\nauth_password = \"{APP_PASSWORD}\""
    ));
    let (ok, _, err) = psql(&f, APP_USER, APP_PASSWORD, "SELECT 1");
    assert!(!ok);
    // Before login the client learns only that the check failed; the
    // cause is for the operator.
    assert!(err.contains("cannot check the password"), "{err}");
    assert!(
        !err.contains("permission denied") && !err.contains("pg_shadow"),
        "{err}"
    );
    let log = f.log_contents();
    assert!(
        log.contains("auth_query failed") && log.contains("permission denied"),
        "{log}"
    );
}

#[test]
fn a_listed_user_uses_the_config() {
    // The config's password for app differs from the server's: the config
    // decides the client check (and the server login then fails, as before
    // auth_query existed).
    let f = fulcrum(&format!(
        "{SUPER_AUTH}\nclient_auth = \"md5\"\n[[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"config-pw\""
    ));
    let (ok, _, err) = psql(&f, APP_USER, APP_PASSWORD, "SELECT 1");
    assert!(
        !ok && err.contains("password authentication failed"),
        "{err}"
    );
    // Unlisted users still come from the server.
    let (ok, out, err) = psql(&f, APP_MD5_USER, APP_PASSWORD, "SELECT current_user");
    assert!(ok, "{err}");
    assert_eq!(out, APP_MD5_USER);
}

#[test]
fn a_client_user_maps_to_another_server_user() {
    // Two client logins, one application role on the server.
    let f = fulcrum(&format!(
        "health_user = \"postgres\"\n\
         [[cluster.user]]\nname = \"web\"\npassword = \"web-pw\"\nserver_user = \"{APP_USER}\"\nserver_password = \"{APP_PASSWORD}\"\n\
         [[cluster.user]]\nname = \"batch\"\npassword = \"batch-pw\"\nserver_user = \"{APP_MD5_USER}\"\nserver_password = \"{APP_PASSWORD}\"\n"
    ));
    let (ok, out, err) = psql(&f, "web", "web-pw", "SELECT current_user");
    assert!(ok, "{err}\n{}", f.log_contents());
    assert_eq!(out, APP_USER);
    let (ok, out, err) = psql(&f, "batch", "batch-pw", "SELECT current_user");
    assert!(ok, "{err}");
    assert_eq!(out, APP_MD5_USER);
    // The client password is the config's, not the server's.
    let (ok, _, err) = psql(&f, "web", APP_PASSWORD, "SELECT 1");
    assert!(
        !ok && err.contains("password authentication failed"),
        "{err}"
    );
}

#[test]
fn a_probe_whose_login_is_refused_keeps_the_backend_in_service() {
    let metrics = free_port();
    let config = format!(
        "[fulcrum]\nlog = \"info\"\nmetrics = \"127.0.0.1:{metrics}\"\n\
         [[cluster]]\nname = \"refused\"\nprotocol = \"postgres\"\n\
         listen = \"127.0.0.1:{port}\"\nhealth_interval = \"100ms\"\n\
         health_user = \"{APP_USER}\"\nhealth_password = \"not-the-password\"\n\
         [[cluster.backend]]\naddress = \"{backend}\"\nrole = \"primary\"\n\
         [[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\"\n",
        port = free_port(),
        backend = cluster().primary().addr(),
    );
    let f = FulcrumProcess::start(&config).expect("start fulcrum");
    f.wait_for_log("probe login refused", Duration::from_secs(10))
        .expect("the refusal is logged");
    // Clients read and write: the primary is in service on its configured role.
    let (ok, out, err) = psql(
        &f,
        APP_USER,
        APP_PASSWORD,
        "CREATE TEMP TABLE t(x int); INSERT INTO t VALUES (1); SELECT count(*) FROM t",
    );
    assert!(ok, "{err}\n{}", f.log_contents());
    assert!(out.ends_with('1'), "{out}");
    let text = scrape(metrics);
    assert!(
        text.contains("fulcrum_probe_login_refused{backend=")
            && text
                .lines()
                .any(|l| l.starts_with("fulcrum_probe_login_refused{") && l.ends_with(" 1")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("fulcrum_backend_up{") && l.ends_with(" 1")),
        "{text}"
    );
    assert!(!f.log_contents().contains("backend down"));
}

#[test]
fn listed_databases_only_and_aliases() {
    let f = fulcrum(&format!(
        "health_user = \"postgres\"\n\
         [[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\"\n\
         [[cluster.database]]\nname = \"{APP_DB}\"\n\
         [[cluster.database]]\nname = \"shop\"\nserver_database = \"{APP_DB}\""
    ));
    let psql_db = |db: &str, password: &str| {
        let addr = f.listen_addrs()[0].clone();
        let (host, port) = addr.rsplit_once(':').unwrap();
        let out = Command::new(pg_bin("psql"))
            .args([
                "-h", host, "-p", port, "-U", APP_USER, "-d", db, "-X", "-At",
            ])
            .args(["-c", "SELECT current_database()"])
            .env("PGPASSWORD", password)
            .env("PGCONNECT_TIMEOUT", "10")
            .env("PGSSLMODE", "disable")
            .output()
            .expect("psql");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        )
    };
    let (ok, out, err) = psql_db("shop", APP_PASSWORD);
    assert!(ok, "{err}\n{}", f.log_contents());
    assert_eq!(out, APP_DB, "the alias reaches the server's database");
    let (ok, out, _) = psql_db(APP_DB, APP_PASSWORD);
    assert!(ok && out == APP_DB);
    // Not listed: 3D000 from Fulcrum, after the password check.
    let (ok, _, err) = psql_db("postgres", APP_PASSWORD);
    assert!(
        !ok && err.contains("database \"postgres\" does not exist"),
        "{err}"
    );
    let (ok, _, err) = psql_db("postgres", "wrong");
    assert!(
        !ok && err.contains("password authentication failed"),
        "{err}"
    );
}

/// An `auth_query` row whose password is empty is refused as a configured
/// user without a password is: the client that sends an empty password
/// gets 28P01, never a login (the user here is one the server trusts, so
/// only Fulcrum's check stands between the client and a session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_stored_password_is_refused_like_a_wrong_one() {
    let f = fulcrum(&format!(
        "{SUPER_AUTH}\nclient_auth = \"md5\"\n\
         auth_query = \"SELECT usename, '' FROM pg_shadow WHERE usename = $1\""
    ));
    let addr = f.listen_addrs()[0].clone();
    let conn_str = pg_conn_string(&addr, APP_TRUST_USER, APP_DB).replace(APP_PASSWORD, "''");
    let e = tokio_postgres::connect(&conn_str, tokio_postgres::NoTls)
        .await
        .err()
        .unwrap_or_else(|| panic!("an empty password logged in\n{}", f.log_contents()));
    assert_eq!(
        e.code(),
        Some(&tokio_postgres::error::SqlState::INVALID_PASSWORD),
        "{e}"
    );
}

/// The first authentication request Fulcrum sends `user` (its
/// AuthenticationRequest code: 5 md5, 10 SASL).
async fn offered_method(addr: &str, user: &str) -> i32 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let hello = fulcrum_suite::startup_message(
        fulcrum_suite::PROTOCOL_3_0,
        &[("user", user), ("database", APP_DB)],
    );
    s.write_all(&hello).await.unwrap();
    let mut head = [0u8; 9];
    s.read_exact(&mut head).await.unwrap();
    assert_eq!(head[0], b'R', "an authentication request for {user}");
    i32::from_be_bytes(head[5..9].try_into().unwrap())
}

/// The method offered depends on `client_auth` alone: a user stored as
/// SCRAM, one stored as md5 and one who does not exist are offered the
/// same, so the offer does not tell who exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_method_offered_does_not_tell_who_exists() {
    for (auth, want) in [("scram-sha-256", 10), ("md5", 5)] {
        let f = fulcrum(&format!("{SUPER_AUTH}\nclient_auth = \"{auth}\""));
        let addr = f.listen_addrs()[0].clone();
        for user in [APP_USER, APP_MD5_USER, "nobody_at_all"] {
            assert_eq!(
                offered_method(&addr, user).await,
                want,
                "{auth}: {user}\n{}",
                f.log_contents()
            );
        }
    }
}

/// A flood of logins with made-up names, from one address, while real
/// clients keep working: the primary never sees more than
/// `auth_max_connections` auth connections (they are pooled: the flood
/// opens at most that many), the address is soon refused without a
/// lookup (`auth_failed_lookups_per_minute`), and every real query
/// succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_storm_never_reaches_the_primary_past_the_cap() {
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    use std::sync::Arc;
    let primary = cluster().primary();
    primary
        .sql("DO $$ BEGIN CREATE ROLE storm_auth LOGIN SUPERUSER PASSWORD 'storm-pw'; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        .expect("auth role");
    let metrics_port = free_port();
    let config = format!(
        "[fulcrum]\nlog = \"info\"\n[[cluster]]\nname = \"aq\"\nprotocol = \"postgres\"\n\
         listen = \"127.0.0.1:{port}\"\nclient_auth = \"md5\"\n\
         auth_user = \"storm_auth\"\nauth_password = \"storm-pw\"\n\
         health_user = \"postgres\"\nhealth_password = \"\"\n\
         [[cluster.backend]]\naddress = \"{backend}\"\nrole = \"primary\"\n",
        port = free_port(),
        backend = primary.addr(),
    );
    let f = FulcrumProcess::start(&fulcrum_suite::with_metrics(&config, metrics_port))
        .expect("start fulcrum");
    let addr = f.listen_addrs()[0].clone();

    // Watches the primary's auth connections.
    let stop = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicI64::new(0));
    let watch_str = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres",
        primary.port()
    );
    let watcher = {
        let (stop, most) = (stop.clone(), most.clone());
        let watcher_client = pg_connect_str(&watch_str).await.expect("watcher");
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let row = watcher_client
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE usename = 'storm_auth'",
                        &[],
                    )
                    .await
                    .expect("count");
                most.fetch_max(row.get::<_, i64>(0), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    // Real clients: an auth_query user (looked up once before the storm,
    // then cached), logging in again and querying.
    pg_connect_str(&pg_conn_string(&addr, APP_MD5_USER, APP_DB))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", f.log_contents()));
    let real = {
        let (stop, conn_str) = (stop.clone(), pg_conn_string(&addr, APP_MD5_USER, APP_DB));
        tokio::spawn(async move {
            let mut done = 0u32;
            while !stop.load(Ordering::SeqCst) || done < 5 {
                let client = pg_connect_str(&conn_str)
                    .await
                    .expect("a real client logs in");
                let row = client.query_one("SELECT 41 + 1", &[]).await.expect("query");
                assert_eq!(row.get::<_, i32>(0), 42);
                done += 1;
            }
            done
        })
    };
    // The storm: 2,000 made-up names, 50 at a time.
    let storm_started = Instant::now();
    let mut refused = 0;
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..2000u32 {
        if tasks.len() >= 50 {
            refused += tasks.join_next().await.unwrap().unwrap() as u32;
        }
        let conn_str = pg_conn_string(&addr, &format!("storm_{n}_{}", rand_suffix(n)), APP_DB);
        tasks.spawn(async move {
            let e = tokio_postgres::connect(&conn_str, tokio_postgres::NoTls)
                .await
                .err()
                .expect("a made-up user is refused");
            e.code() == Some(&tokio_postgres::error::SqlState::INVALID_PASSWORD)
        });
    }
    while let Some(r) = tasks.join_next().await {
        refused += r.unwrap() as u32;
    }
    stop.store(true, Ordering::SeqCst);
    watcher.await.unwrap();
    let logins = real.await.expect("real clients never failed");
    assert_eq!(
        refused,
        2000,
        "each made-up user got 28P01\n{}",
        f.log_contents()
    );
    assert!(logins >= 5);
    let most = most.load(Ordering::SeqCst);
    assert!(
        (1..=2).contains(&most),
        "the primary saw {most} auth connections at once (auth_max_connections = 2)"
    );
    let text = scrape(metrics_port);
    let limited = fulcrum_suite::family_sum(
        &text,
        "fulcrum_auth_query_lookups_total",
        &[("outcome", "limited")],
    );
    let ran = fulcrum_suite::family_sum(
        &text,
        "fulcrum_auth_query_lookups_total",
        &[("outcome", "missing")],
    );
    // 30 misses per minute and address: a slow machine may spread the
    // storm over more than one window.
    let windows = 1.0 + (storm_started.elapsed().as_secs() / 60) as f64;
    assert!(
        limited > 2000.0 - 40.0 * windows,
        "the address was limited: {limited}"
    );
    assert!(
        ran <= 40.0 * windows,
        "lookups that reached the primary: {ran}"
    );
}

/// A per-name suffix, so no two storm names are alike.
fn rand_suffix(n: u32) -> u32 {
    n.wrapping_mul(2_654_435_761)
}
