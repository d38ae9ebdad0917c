//! A fleet of Fulcrum instances over one PostgreSQL cluster, each with its
//! own listener and metrics port, and what the tests read off them.

use std::time::{Duration, Instant};

use fulcrum_suite::{family_sum, try_pg_connect, try_scrape, with_metrics, PgProxyConfig};
use fulcrum_testkit::{FulcrumProcess, PgCluster};
use tokio_postgres::SimpleQueryMessage;

pub struct Instance {
    pub cfg: PgProxyConfig,
    pub process: FulcrumProcess,
    pub metrics: u16,
}

/// The config of one instance in front of `c` (probing as the superuser,
/// which promotion needs), plus `extra` lines.
pub fn instance_config(c: &PgCluster, extra: &[String]) -> PgProxyConfig {
    let mut cfg = PgProxyConfig::new(&c.primary().addr()).client_auth("md5");
    for r in c.replicas() {
        cfg = cfg.replica(&r.addr());
    }
    cfg = cfg
        .extra("health_user = \"postgres\"")
        .extra("health_password = \"\"");
    for e in extra {
        cfg = cfg.extra(e);
    }
    cfg
}

/// Starts `n` instances named f1..fn with the same `extra` lines.
pub fn start_fleet(c: &PgCluster, n: usize, extra: &[String]) -> Vec<Instance> {
    (1..=n)
        .map(|i| start_instance(c, &format!("f{i}"), extra))
        .collect()
}

/// Starts one instance; under etcd it is named `name`.
pub fn start_instance(c: &PgCluster, name: &str, extra: &[String]) -> Instance {
    let mut lines = extra.to_vec();
    if lines.iter().any(|l| l.starts_with("topology = \"etcd\"")) {
        lines.push(format!("instance_name = \"{name}\""));
    }
    let cfg = instance_config(c, &lines);
    let metrics = fulcrum_testkit::free_port();
    let process = FulcrumProcess::start(&with_metrics(&cfg.to_toml(), metrics))
        .unwrap_or_else(|e| panic!("instance {name}: {e}"));
    Instance {
        cfg,
        process,
        metrics,
    }
}

/// One gauge of one instance (0 when absent or unreachable).
pub fn gauge(i: &Instance, family: &str) -> f64 {
    try_scrape(i.metrics).map_or(0.0, |t| family_sum(&t, family, &[]))
}

/// Waits until `cond` holds, polling every 50 ms; panics with `what`.
pub async fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if tokio::task::block_in_place(&mut cond) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The port of the server a write-routed statement reaches through `cfg`,
/// or `None` (no connection, or an error).
pub async fn write_port(cfg: &PgProxyConfig) -> Option<u16> {
    let client = try_pg_connect(cfg).await.ok()?;
    let msgs = tokio::time::timeout(
        Duration::from_secs(5),
        client.simple_query("/* fulcrum:primary */ SELECT inet_server_port()"),
    )
    .await
    .ok()?
    .ok()?;
    msgs.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => r.get(0).and_then(|p| p.parse().ok()),
        _ => None,
    })
}

/// `SWITCHOVER main TO <to>` on `console`, asked again (twice at most) when
/// Patroni refuses for a moment (its candidate's health check under load),
/// as an operator would. A last refusal panics, naming `what`, with `log()`.
pub async fn switchover_through_patroni(
    console: &tokio_postgres::Client,
    to: &str,
    what: &str,
    log: impl Fn() -> String,
) {
    let mut tries = 0;
    loop {
        tries += 1;
        match console
            .simple_query(&format!("SWITCHOVER main TO {to}"))
            .await
        {
            Ok(_) => return,
            Err(e) if tries < 3 => {
                eprintln!("SWITCHOVER try {tries}: {e}");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(e) => panic!("SWITCHOVER through Patroni{what}: {e}\n{}", log()),
        }
    }
}
