//! Helpers shared by the server TLS tests: the certificates, the TLS-only
//! cluster, the daemon in front of it and psql.

use std::path::Path;
use std::process::Command;
use std::sync::LazyLock;

use fulcrum_testkit::{
    free_port, pg_bin, FulcrumProcess, PgCluster, TestCerts, APP_DB, APP_MD5_USER, APP_PASSWORD,
    APP_USER,
};

pub(super) static CERTS: LazyLock<TestCerts> =
    LazyLock::new(|| TestCerts::new().expect("certificates"));

/// A primary that takes TCP logins over TLS only.
pub(super) static CLUSTER: LazyLock<PgCluster> = LazyLock::new(|| {
    PgCluster::builder()
        .tls(&CERTS, true)
        .start()
        .expect("TLS-only cluster")
});

/// Fulcrum in front of `backend` with TLS to clients (`tls_mode = "require"`)
/// and `server` as the server-TLS keys; `cluster_extra` goes into the cluster table.
pub(super) fn fulcrum(backend: &str, server: &str, cluster_extra: &str) -> FulcrumProcess {
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

pub(super) fn verify_full(ca: &Path) -> String {
    format!(
        "server_tls = \"verify-full\"\nserver_tls_ca = \"{}\"",
        ca.display()
    )
}

/// psql through `f` as `user` with extra conninfo `opts` (TLS checked
/// with verify-full against the test CA): (succeeded, stdout, stderr).
pub(super) fn psql(
    f: &FulcrumProcess,
    user: &str,
    opts: &str,
    sql: &str,
) -> (bool, String, String) {
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
pub(super) const SERVER_SSL: &str = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()";
