//! TLS between Fulcrum and PostgreSQL servers, and the TLS logins only a
//! certificate or channel binding can give: a real daemon in front of a
//! TLS-only PostgreSQL (`ssl = on`, `hostssl` lines only in pg_hba.conf).
//! psql with `sslmode=verify-full` and `channel_binding=require` end to
//! end; `server_tls` from `disable` to `verify-full`, a wrong CA and an
//! expired server certificate; `server_channel_binding = "require"`;
//! client certificates (`client_auth = "cert"`); pgbench with
//! `sslmode=require` in every protocol mode; and handshakes that are
//! garbage or stop half-way. Certificates are made at test time.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use fulcrum_testkit::{
    free_port, pg_bin, FulcrumProcess, PgCluster, TestCerts, APP_DB, APP_MD5_USER, APP_PASSWORD,
    APP_TRUST_USER, APP_USER,
};

static CERTS: LazyLock<TestCerts> = LazyLock::new(|| TestCerts::new().expect("certificates"));

/// A primary that takes TCP logins over TLS only.
static CLUSTER: LazyLock<PgCluster> = LazyLock::new(|| {
    PgCluster::builder()
        .tls(&CERTS, true)
        .start()
        .expect("TLS-only cluster")
});

/// Fulcrum in front of `backend` with TLS to clients (`tls_mode = "require"`)
/// and `server` as the server-TLS keys; `cluster_extra` goes into the cluster table.
fn fulcrum(backend: &str, server: &str, cluster_extra: &str) -> FulcrumProcess {
    let config = format!(
        "[fulcrum]\nlog = \"info\"\n[[cluster]]\nname = \"tls\"\nprotocol = \"postgres\"\n\
         listen = \"127.0.0.1:{port}\"\nhealth_interval = \"200ms\"\n\
         tls_mode = \"require\"\ntls_certificate = \"{cert}\"\ntls_private_key = \"{key}\"\n\
         {server}\n{cluster_extra}\n\
         [[cluster.backend]]\naddress = \"{backend}\"\nrole = \"primary\"\n\
         [[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\"\n\
         [[cluster.user]]\nname = \"{APP_MD5_USER}\"\npassword = \"{APP_PASSWORD}\"\n",
        cert = CERTS.cert.display(),
        key = CERTS.key.display(),
        port = free_port(),
    );
    FulcrumProcess::start(&config).expect("start fulcrum")
}

fn verify_full(ca: &Path) -> String {
    format!(
        "server_tls = \"verify-full\"\nserver_tls_ca = \"{}\"",
        ca.display()
    )
}

/// psql through `f` as `user` with extra conninfo `opts` (TLS checked
/// with verify-full against the test CA): (succeeded, stdout, stderr).
fn psql(f: &FulcrumProcess, user: &str, opts: &str, sql: &str) -> (bool, String, String) {
    let addr = f.listen_addrs()[0].clone();
    let (host, port) = addr.rsplit_once(':').unwrap();
    let conninfo = format!(
        "host={host} port={port} user={user} dbname={APP_DB} connect_timeout=10 \
         sslmode=verify-full sslrootcert={} {opts}",
        CERTS.ca.display()
    );
    let out = Command::new(pg_bin("psql"))
        .args([&conninfo, "-X", "-At", "-c", sql])
        .env("PGPASSWORD", APP_PASSWORD)
        .output()
        .expect("run psql");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    )
}

/// Whether the server connection the statement ran on is TLS, as the server sees it.
const SERVER_SSL: &str = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()";

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

/// tokio-postgres over rustls (the adapter a rustls application writes,
/// with the `tls-server-end-point` binding tokio-postgres asks for).
mod rustls_tokio_postgres {
    use std::future::Future;
    use std::io;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use fulcrum_tls::rustls::pki_types::ServerName;
    use fulcrum_tls::rustls::ClientConfig;
    use fulcrum_tls::tokio_rustls::client::TlsStream;
    use fulcrum_tls::tokio_rustls::TlsConnector;
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

    pub struct MakeRustls(pub Arc<ClientConfig>);
    pub struct Connect(Arc<ClientConfig>, ServerName<'static>);
    pub struct Stream<S>(TlsStream<S>);

    impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> MakeTlsConnect<S> for MakeRustls {
        type Stream = Stream<S>;
        type TlsConnect = Connect;
        type Error = io::Error;

        fn make_tls_connect(&mut self, domain: &str) -> io::Result<Connect> {
            let name = ServerName::try_from(domain.to_owned())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            Ok(Connect(self.0.clone(), name))
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> TlsConnect<S> for Connect {
        type Stream = Stream<S>;
        type Error = io::Error;
        type Future = Pin<Box<dyn Future<Output = io::Result<Stream<S>>> + Send>>;

        fn connect(self, stream: S) -> Self::Future {
            Box::pin(async move {
                let tls = TlsConnector::from(self.0).connect(self.1, stream).await?;
                Ok(Stream(tls))
            })
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for Stream<S> {
        fn channel_binding(&self) -> ChannelBinding {
            let cert = self
                .0
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first());
            match cert.and_then(|c| fulcrum_tls::certificate_hash(c.as_ref())) {
                Some(hash) => ChannelBinding::tls_server_end_point(hash),
                None => ChannelBinding::none(),
            }
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Stream<S> {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
        }
    }

    impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Stream<S> {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
        }
        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().0).poll_flush(cx)
        }
        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
        }
    }
}

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
