//! How Fulcrum reaches its coordinator: Patroni over `https://` with
//! `patroni_tls_ca` and basic authentication, etcd's credentials only over
//! TLS. A password that would go in clear is an error naming file, line
//! and key.

use super::tls::{dir_with_certificate, parse_in};
use super::{assert_errors, MINIMAL};
use crate::Topology;

/// `MINIMAL` with `line` inserted after `listen` (the inserted key is on line 5).
fn with_key(line: &str) -> String {
    let listen = "listen = \"127.0.0.1:6432\"\n";
    MINIMAL.replace(listen, &format!("{listen}    {line}\n"))
}

const PATRONI_HTTP: &str =
    "topology = \"patroni\"\n    patroni_endpoints = [\"http://127.0.0.1:8008\"]";
const PATRONI_HTTPS: &str =
    "topology = \"patroni\"\n    patroni_endpoints = [\"https://127.0.0.1:8008\", \"https://db2:8008/\"]";
const ETCD: &str = "topology = \"etcd\"\n    etcd_endpoints = [\"127.0.0.1:2379\"]";

#[test]
fn passwords_in_clear_and_half_settings_are_refused() {
    assert_errors(&[
        (
            &with_key(&format!("{PATRONI_HTTP}\n    patroni_user = \"fulcrum\"\n    patroni_password = \"s\"")),
            "fulcrum.toml:8: cluster[0].patroni_password: patroni_password over http:// sends it in clear: \
             use https:// endpoints (\"http://127.0.0.1:8008\" is plain http)",
        ),
        (
            // One plain endpoint among https ones is enough to refuse.
            &with_key("topology = \"patroni\"\n    patroni_endpoints = [\"https://a:8008\", \"http://b:8008\"]\n    patroni_user = \"fulcrum\"\n    patroni_password = \"s\"\n    patroni_tls_ca = \"ca.pem\""),
            "fulcrum.toml:8: cluster[0].patroni_password: patroni_password over http:// sends it in clear: \
             use https:// endpoints (\"http://b:8008\" is plain http)",
        ),
        (
            &with_key(&format!("{PATRONI_HTTPS}\n    patroni_user = \"fulcrum\"")),
            "fulcrum.toml:7: cluster[0].patroni_user: needs patroni_password as well",
        ),
        (
            &with_key(&format!("{PATRONI_HTTPS}\n    patroni_password = \"s\"")),
            "fulcrum.toml:7: cluster[0].patroni_password: needs patroni_user as well",
        ),
        (
            &with_key(PATRONI_HTTPS),
            "fulcrum.toml:6: cluster[0].patroni_endpoints: \"https://127.0.0.1:8008\" needs patroni_tls_ca \
             (the CA that signed Patroni's restapi.certfile; Fulcrum does not use the system's roots)",
        ),
        (
            &with_key(&format!("{PATRONI_HTTPS}\n    patroni_tls_certificate = \"c.pem\"")),
            "fulcrum.toml:7: cluster[0].patroni_tls_certificate: needs patroni_tls_ca as well \
             (https:// endpoints are checked against it)",
        ),
        (
            &with_key("topology = \"patroni\"\n    patroni_endpoints = [\"https://127.0.0.1\"]"),
            "fulcrum.toml:6: cluster[0].patroni_endpoints: \"https://127.0.0.1\" is not https://host:port",
        ),
        (
            &with_key(&format!("{ETCD}\n    patroni_tls_ca = \"ca.pem\"")),
            "fulcrum.toml:7: cluster[0].patroni_tls_ca: is set but topology is not \"patroni\" (it is \"etcd\")",
        ),
        (
            &with_key(&format!("{ETCD}\n    etcd_user = \"root\"\n    etcd_password = \"s\"")),
            "fulcrum.toml:8: cluster[0].etcd_password: etcd_password over plain http sends it (and the \
             token etcd answers with) in clear: set etcd_tls_ca and use etcd's https client URLs",
        ),
    ]);
}

#[test]
fn the_ca_file_must_load_and_be_needed() {
    let dir = dir_with_certificate("coordinator");
    let d = dir.display();
    let broken = parse_in(
        &dir,
        &with_key(&format!(
            "{PATRONI_HTTPS}\n    patroni_tls_ca = \"nope.pem\""
        )),
    )
    .unwrap_err();
    assert_eq!(
        broken,
        format!("{d}/fulcrum.toml:7: cluster[0].patroni_tls_ca: {d}/nope.pem: No such file or directory (os error 2)")
    );
    let unneeded = parse_in(
        &dir,
        &with_key(&format!(
            "{PATRONI_HTTP}\n    patroni_tls_ca = \"cert.pem\""
        )),
    )
    .unwrap_err();
    assert_eq!(
        unneeded,
        format!("{d}/fulcrum.toml:7: cluster[0].patroni_tls_ca: is set but no patroni_endpoints is https://")
    );
}

#[test]
fn patroni_over_https_with_credentials_is_read() {
    let dir = dir_with_certificate("patroni-ok");
    let text = with_key(&format!(
        "{PATRONI_HTTPS}\n    patroni_user = \"fulcrum\"\n    patroni_password = \"s3cret\"\n    \
         patroni_tls_ca = \"cert.pem\"\n    patroni_tls_certificate = \"other-cert.pem\"\n    \
         patroni_tls_private_key = \"other-key.pem\""
    ));
    let c = parse_in(&dir, &text).unwrap();
    let Topology::Patroni(p) = &c.clusters[0].topology else {
        panic!("{:?}", c.clusters[0].topology)
    };
    assert_eq!(
        p.endpoints,
        vec![
            "https://127.0.0.1:8008".to_owned(),
            "https://db2:8008".into()
        ]
    );
    assert_eq!(
        (p.user.as_deref(), p.password.as_str()),
        (Some("fulcrum"), "s3cret")
    );
    let tls = p.tls.as_ref().expect("TLS to Patroni");
    assert_eq!(tls.alpn_protocols, vec![b"http/1.1".to_vec()]);
    assert!(tls.client_auth_cert_resolver.has_certs(), "client identity");
    assert_ne!(p.tls_digest, 0);
    let shown = format!("{p:?}");
    assert!(
        !shown.contains("s3cret") && shown.contains("<redacted>"),
        "{shown}"
    );
    // Plain http without credentials stays as it was.
    let c = parse_in(&dir, &with_key(PATRONI_HTTP)).unwrap();
    let Topology::Patroni(p) = &c.clusters[0].topology else {
        panic!()
    };
    assert!(p.tls.is_none() && p.user.is_none());
}
