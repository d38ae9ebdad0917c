//! TLS between MySQL clients and Fulcrum, through a real daemon in front of
//! a real MariaDB: the mariadb client with `--ssl` (the certificate checked
//! against the test CA) gets TLS from `tls_mode = "require"`, and without
//! TLS it is refused with ERR 3159. Certificates are made at test time.

use std::process::Command;

use fulcrum_testkit::{
    free_port, maria_bin, FulcrumProcess, MariaCluster, TestCerts, APP_DB, APP_PASSWORD, APP_USER,
};

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
