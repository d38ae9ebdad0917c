//! TLS from other clients and to other servers: tokio-postgres over rustls
//! with channel binding, Fulcrum presenting its client certificate, a reload
//! with a broken server CA, and a mirror lane's server TLS.

use std::process::Command;
use std::time::{Duration, Instant};

use fulcrum_testkit::{
    free_port, pg_bin, FulcrumProcess, PgCluster, TestCerts, APP_DB, APP_PASSWORD, APP_TRUST_USER,
    APP_USER,
};

use super::helpers::{fulcrum, psql, verify_full, CERTS, CLUSTER, SERVER_SSL};

use fulcrum_suite::rustls_tokio_postgres;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_postgres_over_rustls_with_channel_binding_required() {
    let f = fulcrum(&CLUSTER.primary().addr(), &verify_full(&CERTS.ca), "");
    let config = fulcrum_tls::client_config(fulcrum_tls::Verify::Full, Some(&CERTS.ca), None, &[])
        .expect("client config");
    let addr = f.listen_addrs()[0].clone();
    let (host, port) = addr.rsplit_once(':').unwrap();
    let conn_str = format!(
        "host={host} port={port} user={APP_USER} password={APP_PASSWORD} dbname={APP_DB} \
         sslmode=require channel_binding=require connect_timeout=10"
    );
    let (client, conn) =
        tokio_postgres::connect(&conn_str, rustls_tokio_postgres::MakeRustls(config.clone()))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", f.log_contents()));
    tokio::spawn(conn);
    let row = client.query_one(SERVER_SSL, &[]).await.unwrap();
    assert!(row.get::<_, bool>(0), "Fulcrum to the server is TLS");
    let stmt = client.prepare("SELECT $1::int * 2").await.unwrap();
    for i in 0..20 {
        let row = client.query_one(&stmt, &[&i]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), i * 2);
    }
    // A certificate Fulcrum does not present: the client's check fails.
    let other = TestCerts::new().expect("another CA");
    let wrong =
        fulcrum_tls::client_config(fulcrum_tls::Verify::Full, Some(&other.ca), None, &[]).unwrap();
    let e = tokio_postgres::connect(&conn_str, rustls_tokio_postgres::MakeRustls(wrong))
        .await
        .err()
        .expect("refused");
    let source = std::error::Error::source(&e).map(|s| s.to_string());
    assert!(
        source.as_deref().unwrap_or("").contains("certificate"),
        "{e}: {source:?}"
    );
}

/// Fulcrum's own client certificate (`server_tls_certificate`,
/// `server_tls_private_key`) for a server whose pg_hba.conf authenticates
/// that user by certificate (`hostssl ... cert`): present it and the login
/// works; leave it out and the server's refusal reaches the client.
#[test]
fn fulcrum_presents_its_client_certificate_to_the_server() {
    let certs = TestCerts::new().expect("certificates");
    let cluster = PgCluster::builder()
        .tls(&certs, true)
        .start()
        .expect("TLS-only cluster");
    // Certificate authentication for app_trust, before every other line.
    let hba = cluster.primary().data_dir().join("pg_hba.conf");
    let old = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(
        &hba,
        format!("hostssl all {APP_TRUST_USER} 127.0.0.1/32 cert\n{old}"),
    )
    .unwrap();
    cluster
        .primary()
        .sql("SELECT pg_reload_conf()")
        .expect("reload");
    std::thread::sleep(Duration::from_millis(300));
    let (cert, key) = certs.client(APP_TRUST_USER).expect("client certificate");
    let config = |identity: &str| {
        format!(
            "[fulcrum]\nlog = \"info\"\n[[cluster]]\nname = \"cert\"\nprotocol = \"postgres\"\n\
             listen = \"127.0.0.1:{port}\"\nhealth_user = \"postgres\"\n\
             server_tls = \"verify-full\"\nserver_tls_ca = \"{ca}\"\n{identity}\n\
             [[cluster.backend]]\naddress = \"{backend}\"\nrole = \"primary\"\n\
             [[cluster.user]]\nname = \"{APP_TRUST_USER}\"\npassword = \"{APP_PASSWORD}\"\n",
            port = free_port(),
            ca = certs.ca.display(),
            backend = cluster.primary().addr(),
        )
    };
    let psql_plain = |f: &FulcrumProcess| {
        let addr = f.listen_addrs()[0].clone();
        let (host, port) = addr.rsplit_once(':').unwrap();
        let out = Command::new(pg_bin("psql"))
            .args(["-h", host, "-p", port, "-U", APP_TRUST_USER, "-d", APP_DB])
            .args(["-X", "-At", "-c", "SELECT current_user"])
            .env("PGPASSWORD", APP_PASSWORD)
            .env("PGSSLMODE", "disable")
            .env("PGCONNECT_TIMEOUT", "10")
            .output()
            .expect("psql");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        )
    };
    let with_cert = FulcrumProcess::start(&config(&format!(
        "server_tls_certificate = \"{}\"\nserver_tls_private_key = \"{}\"",
        cert.display(),
        key.display()
    )))
    .expect("start fulcrum");
    let (ok, out, err) = psql_plain(&with_cert);
    assert!(ok, "{err}\n{}", with_cert.log_contents());
    assert_eq!(out, APP_TRUST_USER);
    let without = FulcrumProcess::start(&config("")).expect("start fulcrum");
    let (ok, _, err) = psql_plain(&without);
    assert!(!ok);
    let log = without.log_contents();
    assert!(
        err.contains("certificate") || log.contains("certificate"),
        "{err}\n{log}"
    );
}

/// The server-side CA file rotated by SIGHUP: a broken file keeps the
/// running settings (the reload fails, a connected client goes on), a good
/// one is taken by new server connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_with_a_broken_server_ca_keeps_the_running_one() {
    let dir = std::env::temp_dir().join(format!("fulcrum-server-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::copy(&CERTS.ca, &ca).unwrap();
    let f = fulcrum(&CLUSTER.primary().addr(), &verify_full(&ca), "");
    let addr = f.listen_addrs()[0].clone();
    let (host, port) = addr.rsplit_once(':').unwrap();
    let config =
        fulcrum_tls::client_config(fulcrum_tls::Verify::Full, Some(&CERTS.ca), None, &[]).unwrap();
    let conn_str = format!(
        "host={host} port={port} user={APP_USER} password={APP_PASSWORD} dbname={APP_DB} \
         sslmode=require connect_timeout=10"
    );
    let (client, conn) =
        tokio_postgres::connect(&conn_str, rustls_tokio_postgres::MakeRustls(config.clone()))
            .await
            .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute("BEGIN; CREATE TEMP TABLE rot(x int) ON COMMIT DROP")
        .await
        .unwrap();
    std::fs::write(&ca, "not a certificate\n").unwrap();
    f.signal(fulcrum_testkit::Signal::Hup).unwrap();
    f.wait_for_log("config not reloaded", Duration::from_secs(10))
        .expect("the broken file is refused");
    assert!(
        f.log_contents().contains("server_tls_ca"),
        "{}",
        f.log_contents()
    );
    // The client in its transaction goes on, on its server connection.
    client
        .batch_execute("INSERT INTO rot VALUES (1)")
        .await
        .unwrap();
    let row = client
        .query_one("SELECT count(*) FROM rot", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 1);
    client.batch_execute("COMMIT").await.unwrap();
    // New clients still reach the server with the running settings.
    let (ok, out, err) = psql(&f, APP_USER, "", SERVER_SSL);
    assert!(ok, "{err}");
    assert_eq!(out, "t");
    // A good file again: the reload takes it.
    std::fs::copy(&CERTS.ca, &ca).unwrap();
    f.signal(fulcrum_testkit::Signal::Hup).unwrap();
    f.wait_for_log("config reloaded", Duration::from_secs(10))
        .expect("the good file is taken");
    let (ok, _, err) = psql(&f, APP_USER, "", "SELECT 1");
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A mirror lane to a `cluster` target uses that cluster's server TLS, as
/// its ordinary server connections do: a plain cluster mirrored into the
/// TLS-only one (`server_tls = "verify-full"` there) gets its units there,
/// none dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_lane_uses_the_target_clusters_server_tls() {
    use fulcrum_suite::{pg_connect, show_mirror, with_console, PgProxyConfig};
    let main = fulcrum_suite::pg_primary();
    let cfg = PgProxyConfig::new(&main.primary().addr()).client_auth("md5");
    let shadow = PgProxyConfig::new(&CLUSTER.primary().addr())
        .client_auth("md5")
        .extra(&verify_full(&CERTS.ca))
        .to_toml()
        .replacen("name = \"main\"", "name = \"shadow\"", 1);
    let (_, shadow_cluster) = shadow.split_once("[[cluster]]").unwrap();
    let toml = format!(
        "{}\n[[cluster.mirror]]\ncluster = \"shadow\"\n\n[[cluster]]{shadow_cluster}",
        cfg.to_toml()
    );
    let admin = free_port();
    let _p = FulcrumProcess::start(&with_console(&toml, admin)).expect("start fulcrum");
    let client = pg_connect(&cfg).await;
    for _ in 0..5 {
        client.simple_query("SELECT 42").await.unwrap();
    }
    let start = Instant::now();
    let rows = loop {
        let rows = show_mirror(admin).await;
        let done: u64 = rows.iter().map(|r| r.1 + r.2).sum();
        if done >= 5 || start.elapsed() > Duration::from_secs(30) {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (sent, dropped): (u64, u64) = rows.iter().fold((0, 0), |a, r| (a.0 + r.1, a.1 + r.2));
    assert!(
        sent >= 5 && dropped == 0,
        "the TLS-only target took the mirrored units: {rows:?}"
    );
}
