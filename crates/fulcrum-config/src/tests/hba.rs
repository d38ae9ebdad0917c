//! `client_auth = "hba"` and `auth_hba_file`: the rules read with the
//! config (relative to its directory), and each bad value or bad line a
//! `file:line: key: reason` that names the hba file and its line too.

use std::path::PathBuf;

use super::tls::{dir_with_certificate, parse_in};
use super::MINIMAL;
use crate::hba::{ConnKind, HbaMethod};

/// A fresh directory holding `hba.conf` with `rules`.
fn dir_with_rules(tag: &str, rules: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fulcrum-config-hba-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("hba.conf"), rules).unwrap();
    dir
}

/// `MINIMAL` with `lines` after `listen` (the first inserted key on line 5).
fn with_keys(lines: &str) -> String {
    let listen = "listen = \"127.0.0.1:6432\"\n";
    MINIMAL.replace(listen, &format!("{listen}    {lines}"))
}

#[test]
fn the_rules_are_read_relative_to_the_config() {
    let dir = dir_with_rules(
        "valid",
        "# comment\nhost all app 127.0.0.1/32 scram-sha-256\nhost all all all reject\n",
    );
    let text = with_keys("client_auth = \"hba\"\n    auth_hba_file = \"hba.conf\"\n");
    let config = parse_in(&dir, &text).unwrap();
    let c = &config.clusters[0];
    assert_eq!(c.client_auth, crate::ClientAuth::Hba);
    let hba = c.hba.as_ref().expect("rules");
    assert_eq!(hba.path, dir.join("hba.conf"));
    let lines: Vec<_> = hba
        .rules
        .iter()
        .map(|r| (r.line, r.kind, r.method))
        .collect();
    assert_eq!(
        lines,
        [
            (2, ConnKind::Host, HbaMethod::ScramSha256),
            (3, ConnKind::Host, HbaMethod::Reject)
        ]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_hba_keys_and_lines_are_config_errors() {
    let dir = dir_with_rules("errors", "host all all all md5\nhost all all all ident\n");
    std::fs::write(dir.join("ssl.conf"), "\n\nhostssl all all all md5\n").unwrap();
    std::fs::write(dir.join("users.conf"), "host all @nobody.txt all md5\n").unwrap();
    let hba = dir.join("hba.conf").display().to_string();
    let d = dir.display().to_string();
    let cases: Vec<(String, String)> = vec![
        (
            with_keys("client_auth = \"hba\"\n"),
            "fulcrum.toml:5: cluster[0].client_auth: client_auth = \"hba\" needs auth_hba_file (the rules, in pg_hba.conf's format)".into(),
        ),
        (
            with_keys("auth_hba_file = \"hba.conf\"\n"),
            "fulcrum.toml:5: cluster[0].auth_hba_file: is read only with client_auth = \"hba\"".into(),
        ),
        (
            with_keys("client_auth = \"hba\"\n    auth_hba_file = \" \"\n"),
            "fulcrum.toml:6: cluster[0].auth_hba_file: must not be empty".into(),
        ),
        (
            with_keys("client_auth = \"hba\"\n    auth_hba_file = 7\n"),
            "fulcrum.toml:6: cluster[0].auth_hba_file: invalid type: integer `7`, expected a string".into(),
        ),
        (
            with_keys("client_auth = \"hba\"\n    auth_hba_file = \"missing.conf\"\n"),
            format!("fulcrum.toml:6: cluster[0].auth_hba_file: {d}/missing.conf: cannot read: No such file or directory (os error 2)"),
        ),
        (
            with_keys("client_auth = \"hba\"\n    auth_hba_file = \"hba.conf\"\n"),
            format!("fulcrum.toml:6: cluster[0].auth_hba_file: {hba}:2: unknown authentication method \"ident\", expected trust, reject, md5, scram-sha-256, password, cert or peer"),
        ),
        (
            with_keys("client_auth = \"hba\"\n    auth_hba_file = \"ssl.conf\"\n"),
            format!("fulcrum.toml:6: cluster[0].auth_hba_file: {d}/ssl.conf:3: a hostssl line cannot match: the cluster's tls_mode is \"disable\""),
        ),
        (
            with_keys("client_auth = \"hba\"\n    auth_hba_file = \"users.conf\"\n"),
            format!("fulcrum.toml:6: cluster[0].auth_hba_file: {d}/users.conf:1: @nobody.txt: cannot read {d}/nobody.txt: No such file or directory (os error 2)"),
        ),
        (
            MINIMAL.replace("\"postgres\"", "\"mysql\"").replace(
                "listen = \"127.0.0.1:6432\"\n",
                "listen = \"127.0.0.1:6432\"\n    client_auth = \"hba\"\n",
            ),
            "fulcrum.toml:5: cluster[0].client_auth: \"hba\" is a PostgreSQL method; MySQL clusters take \
             \"mysql_native_password\", \"caching_sha2_password\" or \"trust\"".into(),
        ),
    ];
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(text, want)| {
            let got = parse_in(&dir, text)
                .err()
                .unwrap_or_else(|| "parsed".into());
            // The config's own path, as `fulcrum.toml` in the cases.
            let got = got.replacen(&format!("{d}/"), "", 1);
            (got != *want).then(|| format!("want: {want}\n got: {got}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_cert_line_needs_the_clients_ca() {
    let dir = dir_with_certificate("hba-cert");
    std::fs::write(dir.join("hba.conf"), "hostssl all all all cert\n").unwrap();
    let tls = "tls_mode = \"allow\"\n    tls_certificate = \"cert.pem\"\n    tls_private_key = \"key.pem\"\n";
    let text = with_keys(&format!(
        "client_auth = \"hba\"\n    auth_hba_file = \"hba.conf\"\n    {tls}"
    ));
    assert_eq!(
        parse_in(&dir, &text).unwrap_err(),
        format!(
            "{}/fulcrum.toml:6: cluster[0].auth_hba_file: {}:1: cert needs tls_client_ca (the CA that signs the clients' certificates)",
            dir.display(),
            dir.join("hba.conf").display()
        )
    );
    let with_ca = text.replace(tls, &format!("{tls}    tls_client_ca = \"cert.pem\"\n"));
    let config = parse_in(&dir, &with_ca).unwrap();
    assert_eq!(
        config.clusters[0].hba.as_ref().unwrap().rules[0].method,
        HbaMethod::Cert
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
