//! TLS on both sides of Fulcrum's MySQL listeners, with a real daemon in
//! front of real MariaDB servers: the mariadb client with `--ssl` (the
//! certificate checked against the test CA) gets TLS from `tls_mode =
//! "require"`, and without TLS it is refused with ERR 3159; Fulcrum reaches a
//! TLS-only MariaDB (`require_secure_transport`) with `server_tls =
//! "verify-full"` (probes included), refuses a wrong CA with the reason, and
//! plain text gets the server's refusal; sysbench `--mysql-ssl=on` and
//! mysql_async with TLS run through it; caching_sha2_password full
//! authentication over TLS. Certificates are made at test time.

use std::process::Command;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use fulcrum_testkit::{
    free_port, maria_bin, FulcrumProcess, MariaCluster, TestCerts, APP_DB, APP_PASSWORD, APP_USER,
};

static CERTS: LazyLock<TestCerts> = LazyLock::new(|| TestCerts::new().expect("certificates"));

/// A MariaDB primary that takes TCP logins over TLS only.
static TLS_ONLY: LazyLock<MariaCluster> = LazyLock::new(|| {
    MariaCluster::builder()
        .setting("ssl_cert", &CERTS.cert.display().to_string())
        .setting("ssl_key", &CERTS.key.display().to_string())
        .setting("ssl_ca", &CERTS.ca.display().to_string())
        .setting("require_secure_transport", "ON")
        .start()
        .expect("TLS-only MariaDB")
});

/// Fulcrum with `tls_mode = "require"` in front of `backend`, `server` as
/// the server-TLS keys.
fn fulcrum_tls(backend: &str, server: &str) -> (FulcrumProcess, u16) {
    let port = free_port();
    let config = format!(
        "[fulcrum]\nlog = \"info\"\n[[cluster]]\nname = \"tls\"\nprotocol = \"mysql\"\n\
         listen = \"127.0.0.1:{port}\"\nhealth_interval = \"200ms\"\n\
         tls_mode = \"require\"\ntls_certificate = \"{cert}\"\ntls_private_key = \"{key}\"\n\
         health_user = \"root\"\nhealth_password = \"\"\n{server}\n\
         [[cluster.backend]]\naddress = \"{backend}\"\nrole = \"primary\"\n\
         [[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\"\n",
        cert = CERTS.cert.display(),
        key = CERTS.key.display(),
    );
    (FulcrumProcess::start(&config).expect("start fulcrum"), port)
}

fn verified() -> Vec<String> {
    vec![
        "--ssl".into(),
        format!("--ssl-ca={}", CERTS.ca.display()),
        "--ssl-verify-server-cert".into(),
    ]
}

/// The mariadb client through `port`: (succeeded, stdout, stderr).
fn mariadb(port: u16, tls: &[&str], sql: &str) -> (bool, String, String) {
    let out = Command::new(maria_bin("mariadb"))
        .arg("--no-defaults")
        .args(["--protocol=TCP", "-h", "127.0.0.1", "-P", &port.to_string()])
        .args(["-u", APP_USER, &format!("-p{APP_PASSWORD}")])
        .args(["--batch", "--skip-column-names", "--connect-timeout=10"])
        .args(tls)
        .args([APP_DB, "-e", sql])
        .output()
        .expect("run mariadb");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    )
}

#[test]
fn require_serves_tls_clients_and_refuses_plain_ones_with_3159() {
    let c = MariaCluster::builder().start().expect("MariaDB");
    let certs = TestCerts::new().expect("certificates");
    let port = free_port();
    let config = format!(
        "[fulcrum]\nlog = \"info\"\n[[cluster]]\nname = \"tls\"\nprotocol = \"mysql\"\n\
         listen = \"127.0.0.1:{port}\"\n\
         tls_mode = \"require\"\ntls_certificate = \"{cert}\"\ntls_private_key = \"{key}\"\n\
         health_user = \"root\"\nhealth_password = \"\"\n\
         [[cluster.backend]]\naddress = \"{backend}\"\nrole = \"primary\"\n\
         [[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\"\n",
        cert = certs.cert.display(),
        key = certs.key.display(),
        backend = c.primary().addr(),
    );
    let _p = FulcrumProcess::start(&config).expect("start fulcrum");
    let ca = format!("--ssl-ca={}", certs.ca.display());
    let verified = ["--ssl", ca.as_str(), "--ssl-verify-server-cert"];
    let (ok, out, err) = mariadb(port, &verified, "SELECT 40 + 2");
    assert!(ok, "{err}");
    assert_eq!(out, "42");
    let (ok, out, err) = mariadb(port, &verified, "status");
    assert!(ok && out.contains("Cipher in use"), "{out}\n{err}");
    let (ok, _, err) = mariadb(port, &["--skip-ssl"], "SELECT 1");
    assert!(!ok);
    assert!(
        err.contains("3159") && err.contains("requires TLS"),
        "{err}"
    );
}

#[test]
fn verify_full_to_a_tls_only_server_probes_included() {
    let (f, port) = fulcrum_tls(
        &TLS_ONLY.primary().addr(),
        &format!(
            "server_tls = \"verify-full\"\nserver_tls_ca = \"{}\"",
            CERTS.ca.display()
        ),
    );
    let tls = verified();
    let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
    // The server sees TLS on Fulcrum's connection.
    let (ok, out, err) = mariadb(port, &tls, "SHOW SESSION STATUS LIKE 'Ssl_version'");
    assert!(ok, "{err}\n{}", f.log_contents());
    assert!(out.contains("TLS"), "{out}");
    // A write: the probe found the primary over TLS too.
    let (ok, out, err) = mariadb(
        port,
        &tls,
        "CREATE TABLE IF NOT EXISTS tls_t (x int); INSERT INTO tls_t VALUES (7); SELECT sum(x) FROM tls_t",
    );
    assert!(ok, "{err}\n{}", f.log_contents());
    assert!(!out.is_empty(), "{out}");
    // The probes logged in over TLS too (a plain probe is refused by this server).
    let log = f.log_contents();
    assert!(
        !log.contains("backend down") && !log.contains("probe login refused"),
        "{log}"
    );
}

#[test]
fn plain_text_and_a_wrong_ca_are_clear_errors() {
    let other = TestCerts::new().expect("another CA");
    for (server, needle) in [
        // MariaDB answers a plain login under require_secure_transport
        // with its own 1045, which reaches the client as the server's refusal
        // (its code and words).
        ("server_tls = \"disable\"".to_string(), "access denied"),
        (
            format!(
                "server_tls = \"verify-full\"\nserver_tls_ca = \"{}\"",
                other.ca.display()
            ),
            "invalid peer certificate",
        ),
    ] {
        let (f, port) = fulcrum_tls(&TLS_ONLY.primary().addr(), &server);
        let tls = verified();
        let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
        let started = Instant::now();
        let (ok, _, err) = mariadb(port, &tls, "SELECT 1");
        assert!(!ok, "{server}");
        assert!(started.elapsed() < Duration::from_secs(30), "no hang");
        let log = f.log_contents();
        assert!(
            err.to_lowercase().contains(needle) || log.to_lowercase().contains(needle),
            "{server}: {err}\n{log}"
        );
    }
}

#[test]
fn sysbench_and_mysql_async_over_tls() {
    // Server side: the default (prefer) against a server without TLS.
    let c = MariaCluster::builder().start().expect("MariaDB");
    let (f, port) = fulcrum_tls(&c.primary().addr(), "");
    // sysbench 1.0's --mysql-ssl=on reads cacert.pem, client-cert.pem and
    // client-key.pem from its working directory.
    let work = CERTS.dir.join("sysbench");
    std::fs::create_dir_all(&work).unwrap();
    let (client_cert, client_key) = CERTS.client(APP_USER).expect("client certificate");
    std::fs::copy(&CERTS.ca, work.join("cacert.pem")).unwrap();
    std::fs::copy(&client_cert, work.join("client-cert.pem")).unwrap();
    std::fs::copy(&client_key, work.join("client-key.pem")).unwrap();
    let sysbench = |args: &[&str]| {
        let out = Command::new(fulcrum_testkit::tool("/usr/bin/sysbench", "sysbench"))
            .current_dir(&work)
            .args([
                "--db-driver=mysql",
                "--mysql-host=127.0.0.1",
                &format!("--mysql-port={port}"),
                &format!("--mysql-user={APP_USER}"),
                &format!("--mysql-password={APP_PASSWORD}"),
                &format!("--mysql-db={APP_DB}"),
                "--mysql-ssl=on",
                "--tables=1",
                "--table-size=200",
            ])
            .args(args)
            .output()
            .expect("sysbench");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{args:?}: {stdout}\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            f.log_contents()
        );
        stdout
    };
    sysbench(&["oltp_point_select", "prepare"]);
    let out = sysbench(&[
        "oltp_point_select",
        "--threads=2",
        "--time=3",
        "--events=2000",
        "run",
    ]);
    assert!(out.contains("transactions:"), "{out}");
    sysbench(&["oltp_point_select", "cleanup"]);

    // mysql_async, checking Fulcrum's certificate against the test CA.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use mysql_async::prelude::Queryable;
        let ssl = mysql_async::SslOpts::default()
            .with_root_certs(vec![CERTS.ca.clone().into()])
            .with_disable_built_in_roots(true);
        let opts = mysql_async::OptsBuilder::default()
            .ip_or_hostname("localhost")
            .tcp_port(port)
            .user(Some(APP_USER))
            .pass(Some(APP_PASSWORD))
            .db_name(Some(APP_DB))
            .prefer_socket(false)
            .ssl_opts(Some(ssl));
        let mut conn = mysql_async::Conn::new(opts).await.expect("TLS login");
        let n: Option<i64> = conn.query_first("SELECT 6 * 7").await.unwrap();
        assert_eq!(n, Some(42));
        let cipher: Option<(String, String)> = conn
            .query_first("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
            .await
            .unwrap();
        // That is the server's session (Fulcrum to MariaDB, plain here);
        // the client's own TLS is what the login above required.
        assert!(cipher.is_some());
        conn.disconnect().await.unwrap();
    });
}

/// A socket whose first write carries `pending` in front of it.
struct Coalesce {
    pending: Option<Vec<u8>>,
    tcp: tokio::net::TcpStream,
}

impl tokio::io::AsyncRead for Coalesce {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().tcp).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Coalesce {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let me = self.get_mut();
        if let Some(mut all) = me.pending.take() {
            all.extend_from_slice(buf);
            // A few hundred bytes on loopback: written whole.
            let n = me.tcp.try_write(&all).expect("one write");
            assert_eq!(n, all.len());
            return std::task::Poll::Ready(Ok(buf.len()));
        }
        std::pin::Pin::new(&mut me.tcp).poll_write(cx, buf)
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

/// How the raw client answers the caching_sha2 challenge in its first packet.
enum FastPath {
    /// Not the answer for this scramble: full authentication follows.
    Garbage,
    /// The real fast-path answer for the password.
    Real,
}

/// A raw caching_sha2_password login as `user` over TLS (the SSL request
/// and the ClientHello in one segment), answering full authentication with
/// `password` when asked. Returns every packet the server sent after the
/// HandshakeResponse up to the OK or ERR, and, after an OK, the first packet
/// of the answer to `SELECT CURRENT_USER()`.
fn raw_caching_sha2_login(
    port: u16,
    user: &str,
    password: &str,
    fast: FastPath,
) -> (Vec<Vec<u8>>, Option<Vec<u8>>) {
    use fulcrum_mysql::codec::handshake::{
        build_handshake_response, build_ssl_request, parse_server_handshake, HandshakeResponse,
    };
    use fulcrum_mysql::CapabilityFlags as C;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn packet<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> (u8, Vec<u8>) {
        let mut head = [0u8; 4];
        s.read_exact(&mut head).await.unwrap();
        let len = u32::from_le_bytes([head[0], head[1], head[2], 0]) as usize;
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).await.unwrap();
        (head[3], body)
    }
    fn framed(seq: u8, body: &[u8]) -> Vec<u8> {
        let mut out = (body.len() as u32).to_le_bytes()[..3].to_vec();
        out.push(seq);
        out.extend_from_slice(body);
        out
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let mut tcp = tcp;
        let (seq, greeting) = packet(&mut tcp).await;
        let hs = parse_server_handshake(&greeting).unwrap();
        let caps = C::CLIENT_PROTOCOL_41
            | C::CLIENT_SECURE_CONNECTION
            | C::CLIENT_PLUGIN_AUTH
            | C::CLIENT_TRANSACTIONS
            | C::CLIENT_LONG_PASSWORD;
        assert!(hs.capabilities.contains(C::CLIENT_SSL));
        // The SSL request and the ClientHello in one segment, as a fast
        // client sends them (it waits for no answer in between).
        let tcp = Coalesce {
            pending: Some(framed(seq + 1, &build_ssl_request(caps, 1 << 24, 45))),
            tcp,
        };
        let config =
            fulcrum_tls::client_config(fulcrum_tls::Verify::Full, Some(&CERTS.ca), None, &[])
                .unwrap();
        let mut tls = fulcrum_tls::tokio_rustls::TlsConnector::from(config)
            .connect(fulcrum_tls::server_name("localhost").unwrap(), tcp)
            .await
            .unwrap();
        let auth_response = match fast {
            FastPath::Garbage => vec![0x5a; 32],
            FastPath::Real => fulcrum_mysql::auth::caching_sha2::client_response(
                password.as_bytes(),
                &hs.scramble,
            ),
        };
        let hello = build_handshake_response(&HandshakeResponse {
            capabilities: caps | C::CLIENT_SSL,
            max_packet: 1 << 24,
            charset: 45,
            username: user.into(),
            auth_response,
            database: Some(APP_DB.into()),
            auth_plugin: Some("caching_sha2_password".into()),
            connect_attrs: None,
            mariadb_capabilities: 0,
        });
        tls.write_all(&framed(seq + 2, &hello)).await.unwrap();
        let mut seen = Vec::new();
        loop {
            let (seq, p) = packet(&mut tls).await;
            seen.push(p.clone());
            match p.first() {
                Some(0x01) if p.get(1) == Some(&0x04) => {
                    let mut cleartext = password.as_bytes().to_vec();
                    cleartext.push(0);
                    tls.write_all(&framed(seq + 1, &cleartext)).await.unwrap();
                }
                Some(0x01) => {}
                _ => break,
            }
        }
        if seen.last().and_then(|p| p.first()) != Some(&0x00) {
            return (seen, None);
        }
        let mut query = vec![0x03];
        query.extend_from_slice(b"SELECT CURRENT_USER()");
        tls.write_all(&framed(0, &query)).await.unwrap();
        let (_, first) = packet(&mut tls).await;
        (seen, Some(first))
    })
}

/// caching_sha2_password full authentication over TLS: a fast-path answer
/// that does not verify (as from a client without a cache entry) makes
/// Fulcrum ask for the password, inside TLS.
#[test]
fn caching_sha2_full_authentication_over_tls() {
    let c = MariaCluster::builder().start().expect("MariaDB");
    let (_f, port) = fulcrum_tls(&c.primary().addr(), "");
    let (seen, query) = raw_caching_sha2_login(port, APP_USER, APP_PASSWORD, FastPath::Garbage);
    assert_eq!(seen[0], vec![0x01, 0x04], "perform full authentication");
    assert_eq!(seen.last().unwrap()[0], 0x00, "OK: {seen:?}");
    assert_ne!(query.unwrap()[0], 0xff, "the session works");
    let (seen, _) = raw_caching_sha2_login(port, APP_USER, "wrong", FastPath::Garbage);
    let denied = seen.last().unwrap();
    assert_eq!(denied[0], 0xff, "{seen:?}");
    assert_eq!(u16::from_le_bytes([denied[1], denied[2]]), 1045);
}

/// An `auth_query` user (known to the server only) with caching_sha2 over
/// TLS: the first login is a full authentication, checked against the stored
/// native hash; it fills the cache, so the next login takes the fast path.
#[test]
fn caching_sha2_fast_path_after_a_full_authentication_for_auth_query_users() {
    let c = MariaCluster::builder().start().expect("MariaDB");
    let addr = c.primary().addr();
    let (host, mport) = addr.rsplit_once(':').unwrap();
    let created = Command::new(maria_bin("mariadb"))
        .arg("--no-defaults")
        .args(["--protocol=TCP", "-h", host, "-P", mport, "-u", "root", "-e"])
        .arg(format!(
            "CREATE USER 'analyst'@'%' IDENTIFIED BY 'an-pw'; GRANT ALL ON {APP_DB}.* TO 'analyst'@'%'"
        ))
        .status()
        .unwrap();
    assert!(created.success());
    let (f, port) = fulcrum_tls(&addr, "auth_user = \"root\"\nauth_password = \"\"");
    // No cache entry yet: the real fast-path answer still gets 0x04.
    let (seen, query) = raw_caching_sha2_login(port, "analyst", "an-pw", FastPath::Real);
    assert_eq!(seen[0], vec![0x01, 0x04], "{seen:?}\n{}", f.log_contents());
    assert_eq!(seen.last().unwrap()[0], 0x00, "{seen:?}");
    assert_ne!(
        query.unwrap()[0],
        0xff,
        "the server login with SHA1(password) works"
    );
    // Now the fast path: 0x03, then OK.
    let (seen, query) = raw_caching_sha2_login(port, "analyst", "an-pw", FastPath::Real);
    assert_eq!(seen[0], vec![0x01, 0x03], "fast auth success: {seen:?}");
    assert_eq!(seen.last().unwrap()[0], 0x00);
    assert_ne!(query.unwrap()[0], 0xff);
    // A wrong password never passes.
    let (seen, _) = raw_caching_sha2_login(port, "analyst", "nope", FastPath::Real);
    assert_eq!(seen.last().unwrap()[0], 0xff, "{seen:?}");
}

/// A mirror lane to a `cluster` target uses that cluster's server TLS, as
/// its ordinary server connections do: a plain cluster mirrored into the
/// TLS-only MariaDB (`server_tls = "verify-full"` there) gets its units
/// there, none dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_lane_uses_the_target_clusters_server_tls() {
    use fulcrum_suite::{maria_connect, maria_toml, show_mirror, with_console};
    use mysql_async::prelude::Queryable;
    let main = fulcrum_suite::maria_one_replica();
    let (port, admin) = (free_port(), free_port());
    let tls = format!(
        "server_tls = \"verify-full\"\nserver_tls_ca = \"{}\"",
        CERTS.ca.display()
    );
    let shadow = maria_toml(&TLS_ONLY, free_port(), &tls).replacen(
        "name = \"shop\"",
        "name = \"shadow\"",
        1,
    );
    let (_, shadow_cluster) = shadow.split_once("[[cluster]]").unwrap();
    let toml = format!(
        "{}\n[[cluster.mirror]]\ncluster = \"shadow\"\n\n[[cluster]]{shadow_cluster}",
        maria_toml(main, port, "")
    );
    let _p = FulcrumProcess::start(&with_console(&toml, admin)).expect("start fulcrum");
    let mut c = maria_connect(port).await;
    for _ in 0..5 {
        c.query_drop("SELECT 42").await.unwrap();
    }
    let start = Instant::now();
    let rows = loop {
        let rows = show_mirror(admin).await;
        let done: u64 = rows
            .iter()
            .filter(|r| r.0.contains("select ?"))
            .map(|r| r.1 + r.2)
            .sum();
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
