//! Logs: `log_format = "json"` gives one JSON object per line, a unit of work
//! over `slow_query_threshold` is logged (without its statement text), and
//! neither passwords nor query parameters appear in the log. `FULCRUM_LOG`
//! wins over the file's `log` (SHOW CONFIG shows the filter running), and a
//! bad one stops the start.

use std::time::Duration;

use fulcrum_suite::{console_connect, pg_connect, with_console, PgProxyConfig};
use fulcrum_testkit::{
    free_port, fulcrum_bin, wait_for_tcp, FulcrumProcess, PgCluster, APP_DB, APP_PASSWORD, APP_USER,
};
use tokio_postgres::NoTls;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_slow_units_and_no_secrets() {
    let c = tokio::task::block_in_place(|| PgCluster::builder().start()).expect("cluster");
    let cfg = PgProxyConfig::new(&c.primary().addr()).client_auth("md5");
    let toml = cfg.to_toml().replacen(
        "[fulcrum]\n",
        "[fulcrum]\nlog_format = \"json\"\nslow_query_threshold = \"150ms\"\n",
        1,
    );
    let p = FulcrumProcess::start(&toml).unwrap();
    let client = pg_connect(&cfg).await;
    client.simple_query("SELECT 1").await.unwrap();
    client
        .simple_query("SELECT pg_sleep(0.3), 'a-secret-parameter'")
        .await
        .unwrap();
    p.wait_for_log("slow unit of work", Duration::from_secs(5))
        .unwrap();
    let log = p.log_contents();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty());
    for l in &lines {
        assert!(
            l.starts_with('{') && l.ends_with('}'),
            "not a JSON object per line: {l}"
        );
    }
    let slow: Vec<&&str> = lines
        .iter()
        .filter(|l| l.contains("slow unit of work"))
        .collect();
    assert_eq!(
        slow.len(),
        1,
        "only the sleeping statement was slow: {slow:?}"
    );
    assert!(slow[0].contains("\"took_ms\""), "{}", slow[0]);
    assert!(!log.contains(APP_PASSWORD), "a password reached the log");
    assert!(
        !log.contains("a-secret-parameter"),
        "a query parameter reached the log"
    );
}

/// Names a client sends before it is authenticated (user, database) are
/// logged escaped: a newline in one cannot forge a log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_from_clients_cannot_forge_log_lines() {
    let c = tokio::task::block_in_place(|| PgCluster::builder().start()).expect("cluster");
    let cfg = PgProxyConfig::new(&c.primary().addr()).client_auth("md5");
    let p = FulcrumProcess::start(&cfg.to_toml()).unwrap();
    let (host, port) = cfg.listen.rsplit_once(':').unwrap();
    let forged = "FORGED level=error fulcrum pwned";
    let mut config = tokio_postgres::Config::new();
    config
        .host(host)
        .port(port.parse().unwrap())
        .user(format!("nobody\n{forged}"))
        .password("wrong")
        .dbname(APP_DB);
    assert!(config.connect(NoTls).await.is_err(), "an unknown user");
    // An authenticated user's made-up database: the server's 3D000 names it.
    let mut config = tokio_postgres::Config::new();
    config
        .host(host)
        .port(port.parse().unwrap())
        .user(APP_USER)
        .password(APP_PASSWORD)
        .dbname(format!("nodb\n{forged}"));
    assert!(config.connect(NoTls).await.is_err(), "an unknown database");
    p.wait_for_log("client refused", Duration::from_secs(5))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = p.log_contents();
    assert!(log.contains("FORGED"), "the names were logged: {log}");
    for line in log.lines() {
        assert!(!line.starts_with("FORGED"), "a forged line:\n{log}");
    }
}

/// At `log = "debug"` the SQL parser's own debug lines (whole statements)
/// stay out of the log unless the filter names sqlparser.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_logs_do_not_carry_statements_from_the_parser() {
    let c = tokio::task::block_in_place(|| PgCluster::builder().start()).expect("cluster");
    let cfg = PgProxyConfig::new(&c.primary().addr()).client_auth("md5");
    let toml = cfg
        .to_toml()
        .replacen("log = \"info\"", "log = \"debug\"", 1);
    assert!(toml.contains("log = \"debug\""), "{toml}");
    let p = FulcrumProcess::start(&toml).unwrap();
    let client = pg_connect(&cfg).await;
    client
        .simple_query("SELECT 'a-secret-in-a-literal' AS x")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = p.log_contents();
    assert!(log.contains("DEBUG"), "debug logging is on");
    assert!(
        !log.contains("a-secret-in-a-literal"),
        "a statement reached the debug log:\n{log}"
    );
}

/// A config file of the daemon's own, in a directory that goes with it
/// (these tests run the binary with an environment of their own, which
/// `FulcrumProcess` does not take).
struct ConfigFile(std::path::PathBuf);

impl ConfigFile {
    fn new(name: &str, toml: &str) -> ConfigFile {
        let dir = std::env::temp_dir().join(format!("fulcrum-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("fulcrum.toml"), toml).unwrap();
        ConfigFile(dir)
    }

    fn path(&self) -> std::path::PathBuf {
        self.0.join("fulcrum.toml")
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The daemon started here, stopped however the test ends.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An invalid `FULCRUM_LOG` is an error at start naming the variable and
/// its value (exit 2, as a bad `log` in the file), not a silent `info`.
#[test]
fn a_bad_fulcrum_log_stops_the_start_and_names_it() {
    let file = ConfigFile::new("bad-log", &PgProxyConfig::new("127.0.0.1:1").to_toml());
    let out = std::process::Command::new(fulcrum_bin())
        .arg("--config")
        .arg(file.path())
        .env("FULCRUM_LOG", "info,fulcrum=loud")
        .output()
        .expect("fulcrum runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("FULCRUM_LOG=\"info,fulcrum=loud\" is not a log filter"),
        "{stderr}"
    );
}

/// With `FULCRUM_LOG` set, SHOW CONFIG's `fulcrum.log` is its filter (the
/// one running), not the file's; after `SET log`, the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_config_shows_the_log_filter_running() {
    let admin_port = free_port();
    let cfg = PgProxyConfig::new("127.0.0.1:1");
    let file = ConfigFile::new("env-log", &with_console(&cfg.to_toml(), admin_port));
    let child = std::process::Command::new(fulcrum_bin())
        .arg("--config")
        .arg(file.path())
        .env("FULCRUM_LOG", "fulcrum_cluster=debug,warn")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map(Running)
        .expect("fulcrum runs");
    let admin_addr = format!("127.0.0.1:{admin_port}");
    let up = tokio::task::block_in_place(|| wait_for_tcp(&admin_addr, Duration::from_secs(10)));
    let shown = async {
        assert!(up, "the console never listened");
        let admin = console_connect(admin_port).await;
        let log = || async {
            admin
                .simple_query("SHOW CONFIG")
                .await
                .unwrap()
                .iter()
                .find_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r)
                        if r.get(0) == Some("fulcrum.log") =>
                    {
                        r.get(1).map(str::to_owned)
                    }
                    _ => None,
                })
        };
        let at_start = log().await;
        admin.simple_query("SET log = 'debug'").await.unwrap();
        (at_start, log().await)
    }
    .await;
    drop(child);
    assert_eq!(
        shown,
        (
            Some("fulcrum_cluster=debug,warn".to_owned()),
            Some("debug".to_owned())
        )
    );
}
