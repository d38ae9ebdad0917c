//! Helpers shared by the my_proxy tests: the cluster, the daemon config,
//! starting it (with metrics or without) and the replicas' ports.

use std::collections::HashSet;
use std::sync::OnceLock;
use std::time::Duration;

use fulcrum_suite::{maria_toml, start_with_metrics};
use fulcrum_testkit::{free_port, FulcrumProcess, MariaCluster, APP_PASSWORD, APP_USER};

/// This module's own cluster (64 MiB packets for the 16 MiB payload test).
pub(super) fn cluster() -> &'static MariaCluster {
    static CLUSTER: OnceLock<MariaCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let c = MariaCluster::builder()
            .replicas(2)
            .setting("max-allowed-packet", "64M")
            .start()
            .expect("MariaDB cluster");
        for table in [
            "CREATE TABLE items (id INT AUTO_INCREMENT PRIMARY KEY, v INT)",
            "CREATE TABLE blobs (id INT PRIMARY KEY, b LONGBLOB)",
            "CREATE TABLE found_rows_t (id INT PRIMARY KEY)",
            "INSERT INTO found_rows_t VALUES (1), (2), (3), (4), (5), (6), (7)",
        ] {
            c.primary().sql(table).expect("table");
        }
        c.wait_replicas_caught_up(Duration::from_secs(30))
            .expect("catch up");
        c
    })
}

/// Fulcrum's config for the cluster, listening on `port`.
pub(super) fn config(port: u16, extra: &str) -> String {
    maria_toml(
        cluster(),
        port,
        &format!("client_auth = \"mysql_native_password\"\nhealth_interval = \"500ms\"\n{extra}"),
    )
}

pub(super) fn start(extra: &str) -> (FulcrumProcess, u16) {
    let port = free_port();
    let p = FulcrumProcess::start(&config(port, extra)).expect("fulcrum starts");
    (p, port)
}

/// Fulcrum in front of the primary alone with one server connection and
/// a short wait for it (`pool_timeout = "2s"`): a client pinned to that
/// connection makes the next one's login fail with 1040 instead of reaching
/// its session. For the tests of what one client leaves for the next.
pub(super) fn start_one_connection() -> (FulcrumProcess, u16) {
    let port = free_port();
    let config = format!(
        "[fulcrum]\nlog = \"info\"\n\n[[cluster]]\nname = \"shop\"\nprotocol = \"mysql\"\n\
         listen = \"127.0.0.1:{port}\"\nhealth_user = \"root\"\nhealth_password = \"\"\n\
         client_auth = \"mysql_native_password\"\npool_size = 1\npool_timeout = \"2s\"\n\
         [[cluster.backend]]\naddress = \"{}\"\nrole = \"primary\"\n\
         [[cluster.user]]\nname = \"{APP_USER}\"\npassword = \"{APP_PASSWORD}\"\n",
        cluster().primary().addr()
    );
    let p = FulcrumProcess::start(&config).expect("fulcrum starts");
    (p, port)
}

/// `start` with a metrics listener; returns its port too.
pub(super) fn start_metered(extra: &str) -> (FulcrumProcess, u16, u16) {
    let port = free_port();
    let (p, metrics_port) = start_with_metrics(&config(port, extra));
    (p, port, metrics_port)
}

pub(super) fn replica_ports() -> HashSet<u16> {
    cluster().replicas().iter().map(|r| r.port()).collect()
}
