//! Helpers shared by the admin console tests: the cluster and daemon setup,
//! the console config and SHOW as rows.

use fulcrum_suite::{with_console, PgProxyConfig};
use fulcrum_testkit::{free_port, FulcrumProcess, PgCluster};
use tokio_postgres::{Client, SimpleQueryMessage};

pub(super) struct Setup {
    pub(super) cluster: PgCluster,
    pub(super) _fulcrum: FulcrumProcess,
    pub(super) cfg: PgProxyConfig,
    pub(super) admin_port: u16,
    pub(super) primary: u16,
    pub(super) replica: u16,
    pub(super) replica_addr: String,
}

pub(super) fn setup() -> Setup {
    let c = PgCluster::builder().replicas(1).start().expect("cluster");
    let admin_port = free_port();
    // Promotion (SWITCHOVER) needs a superuser for the health loop.
    let cfg = PgProxyConfig::new(&c.primary().addr())
        .client_auth("md5")
        .replica(&c.replicas()[0].addr())
        .extra("health_user = \"postgres\"")
        .extra("health_password = \"\"");
    let p = FulcrumProcess::start(&console_toml(&cfg, admin_port, "")).unwrap();
    Setup {
        primary: c.primary().port(),
        replica: c.replicas()[0].port(),
        replica_addr: c.replicas()[0].addr(),
        cluster: c,
        _fulcrum: p,
        cfg,
        admin_port,
    }
}

/// `cfg`'s daemon with the console on `admin_port`, the `ops` login, and
/// `global` (more `[fulcrum]` keys).
pub(super) fn console_toml(cfg: &PgProxyConfig, admin_port: u16, global: &str) -> String {
    let toml = cfg
        .to_toml()
        .replacen("[fulcrum]\n", &format!("[fulcrum]\n{global}"), 1);
    with_console(&toml, admin_port)
}

/// (columns, rows) of a SHOW.
pub(super) async fn show(client: &Client, what: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let msgs = client
        .simple_query(what)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:?}"));
    let mut columns = Vec::new();
    let mut rows = Vec::new();
    for m in msgs {
        match m {
            SimpleQueryMessage::RowDescription(cols) => {
                columns = cols.iter().map(|c| c.name().to_owned()).collect()
            }
            SimpleQueryMessage::Row(r) => {
                if columns.is_empty() {
                    columns = r.columns().iter().map(|c| c.name().to_owned()).collect();
                }
                rows.push(
                    (0..r.len())
                        .map(|i| r.get(i).unwrap_or("").to_owned())
                        .collect(),
                )
            }
            _ => {}
        }
    }
    (columns, rows)
}
