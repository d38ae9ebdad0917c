//! Logs: `log_format = "json"` gives one JSON object per line, a unit of work
//! over `slow_query_threshold` is logged (without its statement text), and
//! neither passwords nor query parameters appear in the log.

use std::time::Duration;

use fulcrum_suite::{pg_connect, PgProxyConfig};
use fulcrum_testkit::{FulcrumProcess, PgCluster, APP_DB, APP_PASSWORD, APP_USER};
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
