//! The MariaDB health probe's login, on a real server: it connects without a
//! default database, so a health user with no rights on `mysql` (the
//! application's own user) probes fine; and a probe whose login is refused
//! leaves the backend in service (logged, `fulcrum_probe_login_refused`)
//! instead of marking it down and refusing every client.

use std::process::Command;
use std::sync::LazyLock;
use std::time::Duration;

use fulcrum_testkit::{
    free_port, maria_bin, FulcrumProcess, MariaCluster, APP_DB, APP_PASSWORD, APP_USER,
};

static CLUSTER: LazyLock<MariaCluster> = LazyLock::new(|| {
    let c = MariaCluster::builder().start().expect("MariaDB");
    // A user only the server knows, with a mysql_native_password hash.
    root_sql(
        &c,
        &format!(
            "CREATE USER 'reporter'@'%' IDENTIFIED BY 'report-pw'; \
             GRANT ALL ON {APP_DB}.* TO 'reporter'@'%'"
        ),
    );
    c
});

/// `sql` as the server's root (no password) over TCP.
fn root_sql(c: &MariaCluster, sql: &str) {
    let addr = c.primary().addr();
    let (host, port) = addr.rsplit_once(':').unwrap();
    let out = Command::new(maria_bin("mariadb"))
        .arg("--no-defaults")
        .args([
            "--protocol=TCP",
            "-h",
            host,
            "-P",
            port,
            "-u",
            "root",
            "-e",
            sql,
        ])
        .output()
        .expect("mariadb");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn fulcrum(health: &str) -> (FulcrumProcess, u16) {
    let port = free_port();
    let config = format!(
        "[fulcrum]\nlog = \"info\"\n[[cluster]]\nname = \"shop\"\nprotocol = \"mysql\"\n\
         listen = \"127.0.0.1:{port}\"\nhealth_interval = \"100ms\"\n{health}\n\
         [[cluster.backend]]\naddress = \"{}\"\nrole = \"primary\"\n\
         [[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\"\n",
        CLUSTER.primary().addr()
    );
    (FulcrumProcess::start(&config).expect("start fulcrum"), port)
}

fn mariadb(port: u16, sql: &str) -> (bool, String, String) {
    let out = Command::new(maria_bin("mariadb"))
        .arg("--no-defaults")
        .args(["--protocol=TCP", "-h", "127.0.0.1", "-P", &port.to_string()])
        .args(["-u", APP_USER, &format!("-p{APP_PASSWORD}")])
        .args(["--batch", "--skip-column-names", "--connect-timeout=10"])
        .args([APP_DB, "-e", sql])
        .output()
        .expect("run mariadb");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    )
}

const WRITE_AND_READ: &str =
    "CREATE TABLE IF NOT EXISTS probe_t (x int); INSERT INTO probe_t VALUES (1); SELECT count(*) > 0 FROM probe_t";

#[test]
fn the_application_user_can_be_the_health_user() {
    // `app` has no rights on the `mysql` database: the probe used to log in
    // there and was refused, so the primary was "down".
    let (f, port) = fulcrum("");
    std::thread::sleep(Duration::from_millis(500));
    let (ok, out, err) = mariadb(port, WRITE_AND_READ);
    assert!(ok, "{err}\n{}", f.log_contents());
    assert_eq!(out, "1");
    let log = f.log_contents();
    assert!(
        !log.contains("probe login refused") && !log.contains("backend down"),
        "{log}"
    );
}

#[test]
fn a_refused_probe_login_keeps_the_backend_in_service() {
    let (f, port) = fulcrum("health_user = \"root\"\nhealth_password = \"wrong\"");
    f.wait_for_log("probe login refused", Duration::from_secs(10))
        .expect("the refusal is logged");
    let (ok, out, err) = mariadb(port, WRITE_AND_READ);
    assert!(ok, "{err}\n{}", f.log_contents());
    assert_eq!(out, "1");
    assert!(!f.log_contents().contains("backend down"));
}

#[test]
fn a_client_user_maps_to_another_server_user() {
    let port = free_port();
    let config = format!(
        "[fulcrum]\nlog = \"info\"\n[[cluster]]\nname = \"shop\"\nprotocol = \"mysql\"\n\
         listen = \"127.0.0.1:{port}\"\nhealth_user = \"root\"\nhealth_password = \"\"\n\
         [[cluster.backend]]\naddress = \"{}\"\nrole = \"primary\"\n\
         [[cluster.user]]\nname = \"web\"\npassword = \"web-pw\"\n\
         server_user = \"{APP_USER}\"\nserver_password = \"{APP_PASSWORD}\"\n",
        CLUSTER.primary().addr()
    );
    let f = FulcrumProcess::start(&config).expect("start fulcrum");
    let run = |password: &str| {
        let out = Command::new(maria_bin("mariadb"))
            .arg("--no-defaults")
            .args(["--protocol=TCP", "-h", "127.0.0.1", "-P", &port.to_string()])
            .args(["-u", "web", &format!("-p{password}")])
            .args(["--batch", "--skip-column-names", "--connect-timeout=10"])
            .args([APP_DB, "-e", "SELECT CURRENT_USER()"])
            .output()
            .expect("run mariadb");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        )
    };
    let (ok, out, err) = run("web-pw");
    assert!(ok, "{err}\n{}", f.log_contents());
    assert!(out.starts_with(&format!("{APP_USER}@")), "{out}");
    let (ok, _, err) = run(APP_PASSWORD);
    assert!(!ok && err.contains("1045"), "{err}");
}

/// mariadb as `user` through `port`: (succeeded, stdout, stderr).
fn mariadb_as(port: u16, user: &str, password: &str, sql: &str) -> (bool, String, String) {
    let out = Command::new(maria_bin("mariadb"))
        .arg("--no-defaults")
        .args(["--protocol=TCP", "-h", "127.0.0.1", "-P", &port.to_string()])
        .args(["-u", user, &format!("-p{password}")])
        .args(["--batch", "--skip-column-names", "--connect-timeout=10"])
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
fn auth_query_logs_in_a_native_user_fulcrum_does_not_list() {
    let (f, port) = fulcrum(
        "health_user = \"root\"\nhealth_password = \"\"\nauth_user = \"root\"\nauth_password = \"\"",
    );
    let (ok, out, err) = mariadb_as(port, "reporter", "report-pw", "SELECT CURRENT_USER()");
    assert!(ok, "{err}\n{}", f.log_contents());
    assert!(out.starts_with("reporter@"), "{out}");
    // Wrong password and unknown user: the same 1045.
    let (ok, _, wrong) = mariadb_as(port, "reporter", "nope", "SELECT 1");
    assert!(!ok && wrong.contains("1045"), "{wrong}");
    let (ok, _, unknown) = mariadb_as(port, "nobody_here", "nope", "SELECT 1");
    assert!(!ok && unknown.contains("1045"), "{unknown}");
    // sysbench as that user, prepared statements and all.
    let sysbench = |args: &[&str]| {
        let out = Command::new(fulcrum_testkit::tool("/usr/bin/sysbench", "sysbench"))
            .args([
                "--db-driver=mysql",
                "--mysql-host=127.0.0.1",
                &format!("--mysql-port={port}"),
                "--mysql-user=reporter",
                "--mysql-password=report-pw",
                &format!("--mysql-db={APP_DB}"),
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
    sysbench(&["oltp_read_write", "prepare"]);
    let out = sysbench(&[
        "oltp_read_write",
        "--threads=2",
        "--time=3",
        "--events=300",
        "run",
    ]);
    assert!(out.contains("transactions:"), "{out}");
    sysbench(&["oltp_read_write", "cleanup"]);
}

/// `client_auth = "caching_sha2_password"`: the greeting offers it (MySQL
/// 8's default), a driver logs in with its fast path, and a wrong password
/// is refused.
#[test]
fn caching_sha2_password_is_offered_when_configured() {
    let (f, port) = fulcrum(
        "client_auth = \"caching_sha2_password\"\nhealth_user = \"root\"\nhealth_password = \"\"",
    );
    // The greeting names the plugin.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut head = [0u8; 4];
    std::io::Read::read_exact(&mut s, &mut head).unwrap();
    let mut body = vec![0u8; u32::from_le_bytes([head[0], head[1], head[2], 0]) as usize];
    std::io::Read::read_exact(&mut s, &mut body).unwrap();
    let hs = fulcrum_mysql::codec::handshake::parse_server_handshake(&body).unwrap();
    assert_eq!(hs.auth_plugin.as_deref(), Some("caching_sha2_password"));
    drop(s);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use mysql_async::prelude::Queryable;
        let opts = |password: &str| {
            mysql_async::OptsBuilder::default()
                .ip_or_hostname("127.0.0.1")
                .tcp_port(port)
                .user(Some(APP_USER))
                .pass(Some(password.to_owned()))
                .db_name(Some(APP_DB))
                .prefer_socket(false)
        };
        let mut conn = mysql_async::Conn::new(opts(APP_PASSWORD))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", f.log_contents()));
        let n: Option<i64> = conn.query_first("SELECT 40 + 2").await.unwrap();
        assert_eq!(n, Some(42));
        conn.disconnect().await.unwrap();
        let Err(e) = mysql_async::Conn::new(opts("wrong")).await else {
            panic!("a wrong password must be refused");
        };
        assert!(e.to_string().contains("1045"), "{e}");
    });
}

#[test]
fn listed_databases_only_and_aliases() {
    let (f, port) = fulcrum(&format!(
        "health_user = \"root\"\nhealth_password = \"\"\n\
         [[cluster.database]]\nname = \"{APP_DB}\"\n\
         [[cluster.database]]\nname = \"shop\"\nserver_database = \"{APP_DB}\""
    ));
    let run = |db: &str, sql: &str| {
        let out = Command::new(maria_bin("mariadb"))
            .arg("--no-defaults")
            .args(["--protocol=TCP", "-h", "127.0.0.1", "-P", &port.to_string()])
            .args(["-u", APP_USER, &format!("-p{APP_PASSWORD}")])
            .args(["--batch", "--skip-column-names", "--connect-timeout=10"])
            .args(["-D", db, "-e", sql])
            .output()
            .expect("run mariadb");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        )
    };
    // The alias at login, and through COM_INIT_DB (the client's `use`).
    let (ok, out, err) = run("shop", "SELECT DATABASE()");
    assert!(ok, "{err}\n{}", f.log_contents());
    assert_eq!(out, APP_DB);
    let (ok, out, err) = run(APP_DB, "use shop\nSELECT DATABASE()");
    assert!(ok, "{err}");
    assert_eq!(out, APP_DB);
    // Not listed: ERR 1049 from Fulcrum, at login and at COM_INIT_DB.
    let (ok, _, err) = run("mysql", "SELECT 1");
    assert!(
        !ok && err.contains("1049") && err.contains("Unknown database 'mysql'"),
        "{err}"
    );
    let (ok, _, err) = run(APP_DB, "use mysql\nSELECT 1");
    assert!(!ok && err.contains("1049"), "{err}");
    // COM_CHANGE_USER's schema goes through the same list and aliases.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use mysql_async::prelude::Queryable;
        use mysql_async::ChangeUserOpts;
        let opts = fulcrum_suite::maria_opts(port);
        let change = |db: &str| {
            ChangeUserOpts::default()
                .with_user(Some(APP_USER.into()))
                .with_pass(Some(APP_PASSWORD.into()))
                .with_db_name(Some(db.into()))
        };
        let mut conn = mysql_async::Conn::new(opts.clone()).await.expect("login");
        conn.change_user(change("shop")).await.expect("an alias");
        let db: Option<String> = conn.query_first("SELECT DATABASE()").await.unwrap();
        assert_eq!(db.as_deref(), Some(APP_DB));
        let mut conn = mysql_async::Conn::new(opts).await.expect("login");
        let e = conn
            .change_user(change("mysql"))
            .await
            .expect_err("an unlisted schema");
        assert!(e.to_string().contains("1049"), "{e}");
    });
}

/// A flood of logins with made-up names from one address, while a real
/// `auth_query` user keeps logging in: MariaDB never sees more than
/// `auth_max_connections` (2) connections of the auth user at once, and
/// the address is soon refused without a lookup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_storm_never_reaches_the_primary_past_the_cap() {
    use mysql_async::prelude::Queryable;
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    use std::sync::Arc;
    root_sql(
        &CLUSTER,
        "CREATE USER IF NOT EXISTS 'storm_auth'@'%' IDENTIFIED BY 'storm-pw'; \
         GRANT SELECT ON mysql.user TO 'storm_auth'@'%'",
    );
    let metrics_port = free_port();
    let (f, port) = {
        let port = free_port();
        let config = format!(
            "[fulcrum]\nlog = \"info\"\nmetrics = \"127.0.0.1:{metrics_port}\"\n\
             [[cluster]]\nname = \"shop\"\nprotocol = \"mysql\"\n\
             listen = \"127.0.0.1:{port}\"\nhealth_user = \"root\"\nhealth_password = \"\"\n\
             auth_user = \"storm_auth\"\nauth_password = \"storm-pw\"\n\
             [[cluster.backend]]\naddress = \"{}\"\nrole = \"primary\"\n",
            CLUSTER.primary().addr()
        );
        (FulcrumProcess::start(&config).expect("start fulcrum"), port)
    };
    let opts = |user: &str, password: &str| {
        fulcrum_suite::maria_opts(port)
            .user(Some(user.to_owned()))
            .pass(Some(password.to_owned()))
    };
    // The real user, looked up once before the storm (then cached).
    let mut real = mysql_async::Conn::new(opts("reporter", "report-pw"))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", f.log_contents()));
    let _: Option<i64> = real.query_first("SELECT 1").await.unwrap();
    drop(real);
    let stop = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicI64::new(0));
    let watcher = {
        let (stop, most) = (stop.clone(), most.clone());
        let addr = CLUSTER.primary().addr();
        let (_, server_port) = addr.rsplit_once(':').unwrap();
        let root = fulcrum_suite::maria_opts(server_port.parse().unwrap())
            .user(Some("root"))
            .pass(Some(""));
        let mut c = mysql_async::Conn::new(root).await.expect("watcher");
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let n: Option<i64> = c
                    .query_first(
                        "SELECT COUNT(*) FROM information_schema.processlist WHERE user = 'storm_auth'",
                    )
                    .await
                    .expect("count");
                most.fetch_max(n.unwrap_or(0), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let reals = {
        let stop = stop.clone();
        let o = opts("reporter", "report-pw");
        tokio::spawn(async move {
            let mut done = 0;
            while !stop.load(Ordering::SeqCst) || done < 3 {
                let mut c = mysql_async::Conn::new(o.clone()).await.expect("real login");
                let one: Option<i64> = c.query_first("SELECT 1").await.expect("query");
                assert_eq!(one, Some(1));
                let _ = c.disconnect().await;
                done += 1;
            }
            done
        })
    };
    let mut tasks = tokio::task::JoinSet::new();
    let storm_started = std::time::Instant::now();
    let mut denied = 0;
    for n in 0..600u32 {
        if tasks.len() >= 30 {
            denied += tasks.join_next().await.unwrap().unwrap() as u32;
        }
        let o = opts(&format!("storm_{n}"), "nope");
        tasks.spawn(async move {
            match mysql_async::Conn::new(o).await {
                Err(mysql_async::Error::Server(e)) => e.code == 1045,
                _ => false,
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        denied += r.unwrap() as u32;
    }
    stop.store(true, Ordering::SeqCst);
    watcher.await.unwrap();
    assert!(reals.await.expect("real clients never failed") >= 3);
    assert_eq!(
        denied,
        600,
        "each made-up user got 1045\n{}",
        f.log_contents()
    );
    let most = most.load(Ordering::SeqCst);
    assert!(
        (1..=2).contains(&most),
        "MariaDB saw {most} auth connections at once"
    );
    let text = fulcrum_suite::scrape(metrics_port);
    let count = |outcome| {
        fulcrum_suite::family_sum(
            &text,
            "fulcrum_auth_query_lookups_total",
            &[("outcome", outcome)],
        )
    };
    // 30 misses per minute and address: a slow machine may spread the
    // storm over more than one window.
    let windows = 1.0 + (storm_started.elapsed().as_secs() / 60) as f64;
    assert!(count("limited") > 600.0 - 40.0 * windows, "{text}");
    assert!(count("missing") <= 40.0 * windows, "{text}");
}
