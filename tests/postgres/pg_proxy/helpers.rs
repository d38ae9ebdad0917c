//! Helpers shared by the pg_proxy tests: the shared cluster, the daemon in
//! front of it, its configs and one-string queries.

use std::sync::Once;

use fulcrum_suite::{pg_two_replicas, PgProxyConfig};
use fulcrum_testkit::{FulcrumProcess, PgCluster};
use tokio_postgres::{Client, SimpleQueryMessage};

/// The binary's shared primary with two replicas, with this module's table.
pub(super) fn cluster() -> &'static PgCluster {
    static TABLE: Once = Once::new();
    let c = pg_two_replicas();
    TABLE.call_once(|| {
        c.primary()
            .sql("CREATE TABLE IF NOT EXISTS items (id serial PRIMARY KEY, tag text, n int); GRANT ALL ON items TO PUBLIC; GRANT ALL ON SEQUENCE items_id_seq TO PUBLIC")
            .expect("create table");
    });
    c
}

/// Fulcrum in front of the shared cluster (primary and both replicas configured).
pub(super) fn proxy(config: PgProxyConfig) -> (FulcrumProcess, PgProxyConfig) {
    let p = FulcrumProcess::start(&config.to_toml()).expect("start fulcrum");
    (p, config)
}

/// Fulcrum with the primary only (tests that need every query on one server).
pub(super) fn primary_only_config() -> PgProxyConfig {
    PgProxyConfig::new(&cluster().primary().addr())
}

pub(super) fn default_config() -> PgProxyConfig {
    let c = cluster();
    let mut cfg = PgProxyConfig::new(&c.primary().addr());
    for r in c.replicas() {
        cfg = cfg.replica(&r.addr());
    }
    cfg
}

pub(super) async fn one_string(client: &Client, sql: &str) -> String {
    let rows = client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("").to_owned()),
            _ => None,
        })
        .expect("one row")
}
