//! Helpers shared by the failover tests: the daemon config (also used by
//! `pg_cache_failover`), the port a query ran on, and scalar queries.

use fulcrum_suite::PgProxyConfig;
use fulcrum_testkit::{PgCluster, PgNode, APP_DB};
use tokio_postgres::{Client, SimpleQueryMessage};

/// Fulcrum in front of `c`, probing as the superuser (promotion needs it).
pub(crate) fn config(c: &PgCluster, extra: &[&str]) -> PgProxyConfig {
    let mut cfg = PgProxyConfig::new(&c.primary().addr()).client_auth("md5");
    for r in c.replicas() {
        cfg = cfg.replica(&r.addr());
    }
    cfg = cfg
        .extra("health_user = \"postgres\"")
        .extra("health_password = \"\"");
    if !extra.iter().any(|e| e.starts_with("pool_timeout")) {
        cfg = cfg.extra("pool_timeout = \"10s\"");
    }
    for e in extra {
        cfg = cfg.extra(e);
    }
    cfg
}

pub(crate) async fn port_of(client: &Client, sql: &str) -> Result<u16, tokio_postgres::Error> {
    let msgs = client.simple_query(sql).await?;
    Ok(msgs
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(|p| p.parse().unwrap()),
            _ => None,
        })
        .expect("a row"))
}

pub(super) fn scalar(node: &PgNode, sql: &str) -> String {
    node.sql_db(APP_DB, sql).unwrap().trim().to_string()
}
