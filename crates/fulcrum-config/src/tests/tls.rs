//! The client-side TLS keys: taken from the cluster or from `[fulcrum]`,
//! paths relative to the config file, and every broken file reported as
//! `file:line: key: reason` (certificates are made by openssl here).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{dedent, MINIMAL};
use crate::{TlsMode, TlsVersion};

/// A directory with a self-signed `cert.pem`/`key.pem` and a second key.
pub(super) fn dir_with_certificate(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fulcrum-config-tls-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (cert, key) in [("cert.pem", "key.pem"), ("other-cert.pem", "other-key.pem")] {
        let ok = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args(["-nodes", "-days", "1", "-subj", "/CN=localhost"])
            .arg("-keyout")
            .arg(dir.join(key))
            .arg("-out")
            .arg(dir.join(cert))
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl")
            .success();
        assert!(ok);
    }
    dir
}

/// `text` read as `fulcrum.toml` in `dir`.
pub(super) fn parse_in(dir: &Path, text: &str) -> Result<crate::Config, String> {
    crate::parse(&dedent(text), &dir.join("fulcrum.toml")).map_err(|e| e.to_string())
}

/// `MINIMAL` with `lines` after `listen` (the first inserted key on line 5).
fn with_keys(lines: &str) -> String {
    let listen = "listen = \"127.0.0.1:6432\"\n";
    MINIMAL.replace(listen, &format!("{listen}{lines}"))
}

#[test]
fn cluster_keys_load_the_files_relative_to_the_config() {
    let dir = dir_with_certificate("cluster");
    let text = with_keys(
        "    tls_mode = \"require\"\n    tls_certificate = \"cert.pem\"\n    tls_private_key = \"key.pem\"\n    tls_min_version = \"1.3\"\n",
    );
    let c = parse_in(&dir, &text).unwrap();
    let tls = c.clusters[0].tls.as_ref().expect("tls");
    assert_eq!(
        (tls.mode, tls.min_version),
        (TlsMode::Require, TlsVersion::Tls13)
    );
    assert_eq!(tls.certificate, dir.join("cert.pem"));
    assert_eq!(
        tls.server_config.alpn_protocols,
        vec![b"postgresql".to_vec()]
    );
}

#[test]
fn fulcrum_keys_are_the_default_and_disable_turns_it_off() {
    let dir = dir_with_certificate("global");
    let text = format!(
        "\n    [fulcrum]\n    tls_mode = \"allow\"\n    tls_certificate = \"cert.pem\"\n    tls_private_key = \"key.pem\"\n{}",
        MINIMAL.trim_start_matches('\n')
    );
    let c = parse_in(&dir, &text).unwrap();
    assert_eq!(
        c.clusters[0].tls.as_ref().map(|t| t.mode),
        Some(TlsMode::Allow)
    );
    let off = text.replace(
        "listen = \"127.0.0.1:6432\"\n",
        "listen = \"127.0.0.1:6432\"\n    tls_mode = \"disable\"\n",
    );
    assert!(parse_in(&dir, &off).unwrap().clusters[0].tls.is_none());
    assert!(
        parse_in(&dir, MINIMAL).unwrap().clusters[0].tls.is_none(),
        "off by default"
    );
}

#[test]
fn broken_settings_name_file_line_and_key() {
    let dir = dir_with_certificate("errors");
    let d = dir.display();
    let cases = [
        (
            "    tls_mode = \"require\"\n".to_owned(),
            "fulcrum.toml:5: cluster[0].tls_mode: tls_mode = \"require\" needs tls_certificate"
                .to_owned(),
        ),
        (
            "    tls_mode = \"always\"\n".to_owned(),
            "fulcrum.toml:5: cluster[0].tls_mode: unknown value \"always\", expected one of \"disable\", \"allow\", \"require\"".to_owned(),
        ),
        (
            "    tls_mode = \"allow\"\n    tls_certificate = \"nope.pem\"\n    tls_private_key = \"key.pem\"\n".to_owned(),
            format!("fulcrum.toml:6: cluster[0].tls_certificate: {d}/nope.pem: No such file or directory (os error 2)"),
        ),
        (
            "    tls_mode = \"allow\"\n    tls_certificate = \"key.pem\"\n    tls_private_key = \"key.pem\"\n".to_owned(),
            format!("fulcrum.toml:6: cluster[0].tls_certificate: {d}/key.pem: no certificate in the file (expected PEM \"BEGIN CERTIFICATE\")"),
        ),
        (
            "    tls_mode = \"allow\"\n    tls_certificate = \"cert.pem\"\n    tls_private_key = \"other-key.pem\"\n".to_owned(),
            "fulcrum.toml:7: cluster[0].tls_private_key: certificate".to_owned(),
        ),
    ];
    for (keys, want) in cases {
        let got = parse_in(&dir, &with_keys(&keys)).unwrap_err();
        let want = format!("{d}/{want}");
        assert!(
            got.starts_with(&want),
            "keys:\n{keys}\nwant: {want}\ngot:  {got}"
        );
    }
}

#[test]
fn mysql_listeners_take_tls_without_alpn() {
    let dir = dir_with_certificate("mysql");
    let text = with_keys(
        "    tls_mode = \"require\"\n    tls_certificate = \"cert.pem\"\n    tls_private_key = \"key.pem\"\n",
    )
    .replace("protocol = \"postgres\"", "protocol = \"mysql\"");
    let c = parse_in(&dir, &text).unwrap();
    let tls = c.clusters[0].tls.as_ref().expect("tls");
    assert!(tls.server_config.alpn_protocols.is_empty());
}
