//! `[[cluster.user]]` passwords given as PostgreSQL stores them (a SCRAM
//! verifier, an md5 hash), in each secret form: read into `User::hash`, and
//! every way they cannot work refused with `file:line: key: reason`.

use std::path::Path;

use super::{assert_errors, dedent, MINIMAL};
use crate::{PasswordHash, Protocol};

/// A well-formed verifier (PostgreSQL's for "secret" with this salt).
const VERIFIER: &str = "SCRAM-SHA-256$4096:3Gzs3CMeVwGOnDpOPN0t1w==$\
    IzrC80OShm1c9hPUIu//DMHJilWT3RDB5PkKtTzQ7X0=:aeom++Gc31b0VaQjEwZCJMCTTuItEBoTrxO6LjkwbTU=";
const MD5: &str = "md5a3556571e93b0d20722ba62be61e8c2d";

/// `MINIMAL` with its user's password (line 10) replaced by `password`
/// and `extra` inserted after `listen` (line 5, shifting the rest).
fn config(extra: &str, password: &str) -> String {
    let listen = "listen = \"127.0.0.1:6432\"\n";
    let text = MINIMAL.replace("password = \"secret\"", &format!("password = {password}"));
    if extra.is_empty() {
        text
    } else {
        text.replace(listen, &format!("{listen}    {extra}\n"))
    }
}

fn quoted(text: &str) -> String {
    format!("\"{text}\"")
}

#[test]
fn malformed_verifiers_are_refused_in_every_secret_form() {
    let dir = std::env::temp_dir().join(format!("fulcrum-config-verifier-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("app.verifier");
    std::fs::write(&file, "SCRAM-SHA-256$4096:c2FsdA==$AAAA:AAAA\n").unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let env = "FULCRUM_TEST_BAD_VERIFIER";
    std::env::set_var(env, "SCRAM-SHA-256$many:c2FsdA==$AAAA:AAAA");
    let from_file = config(
        "",
        &format!("{{ file = {:?} }}", file.display().to_string()),
    );
    let from_env = config("", &format!("{{ env = \"{env}\" }}"));
    let user = "fulcrum.toml:10: cluster[0].user[0].password";
    assert_errors(&[
        (
            &config("", &quoted("SCRAM-SHA-256$4096:c2FsdA==")),
            &format!("{user}: is not a SCRAM-SHA-256 verifier: expected SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>"),
        ),
        (
            &config("", &quoted(&VERIFIER.replace("4096", "0"))),
            &format!("{user}: the SCRAM-SHA-256 verifier's iteration count is not a whole number from 1 to 4294967295"),
        ),
        (
            &config("", &quoted(&VERIFIER.replace("3Gzs", "3G!s"))),
            &format!("{user}: the SCRAM-SHA-256 verifier's salt is not base64 (or is empty)"),
        ),
        (
            &config("", &quoted(&VERIFIER.replace("IzrC80OShm1c", "IzrC80OShm1"))),
            &format!("{user}: the SCRAM-SHA-256 verifier's StoredKey is not base64"),
        ),
        (
            &config("", &quoted(&VERIFIER.replace("IzrC80OShm1c9hPU", "IzrC80OShm1c"))),
            &format!("{user}: the SCRAM-SHA-256 verifier's StoredKey is 29 bytes; a SHA-256 key is 32"),
        ),
        (
            &from_file,
            &format!("{user}: the SCRAM-SHA-256 verifier's StoredKey is 3 bytes; a SHA-256 key is 32"),
        ),
        (
            &from_env,
            &format!("{user}: the SCRAM-SHA-256 verifier's iteration count is not a whole number from 1 to 4294967295"),
        ),
    ]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_hash_the_login_method_cannot_use_is_refused() {
    let user = "fulcrum.toml:11: cluster[0].user[0].password";
    assert_errors(&[
        (
            &config("client_auth = \"md5\"", &quoted(VERIFIER)),
            &format!("{user}: is a SCRAM-SHA-256 verifier, which client_auth = \"md5\" cannot check (md5 needs the password or its md5 hash): use client_auth = \"scram-sha-256\""),
        ),
        (
            &config("client_auth = \"trust\"", &quoted(VERIFIER)),
            &format!("{user}: is a SCRAM-SHA-256 verifier: Fulcrum logs in to the servers with the keys a client proves in a SCRAM login, which client_auth = \"trust\" never runs: use client_auth = \"scram-sha-256\", or set server_user and server_password"),
        ),
        (
            &config("", &quoted(MD5)),
            "fulcrum.toml:10: cluster[0].user[0].password: is an md5 hash, which client_auth = \"scram-sha-256\" cannot check (SCRAM needs the password or a SCRAM verifier): use client_auth = \"md5\", or give the password or the SCRAM verifier the server stores",
        ),
        (
            &config("", &format!("\"pw\"\n    server_user = \"owner\"\n    server_password = {}", quoted(VERIFIER))),
            "fulcrum.toml:12: cluster[0].user[0].server_password: is a SCRAM-SHA-256 verifier: Fulcrum logs in as server_user with its password itself (a stored hash passes through only for the client's own login)",
        ),
        (
            &config("", "\"pw\"\n    server_user = \"owner\"\n    server_password = \"SCRAM-SHA-256$1\""),
            "fulcrum.toml:12: cluster[0].user[0].server_password: is a malformed SCRAM-SHA-256 verifier: Fulcrum logs in as server_user with its password itself (a stored hash passes through only for the client's own login)",
        ),
        (
            &config("auth_user = \"app\"", &quoted(VERIFIER)),
            "fulcrum.toml:5: cluster[0].auth_user: \"app\"'s [[cluster.user]] password is a SCRAM-SHA-256 verifier, which cannot log in by itself: set auth_password",
        ),
        (
            &config("", &quoted(VERIFIER)),
            "fulcrum.toml:1: cluster[0].health_user: \"app\"'s [[cluster.user]] password is a SCRAM-SHA-256 verifier, which cannot log in by itself (the health probe runs before any client): set health_password, or a health_user with a password",
        ),
        (
            &(config("client_auth = \"md5\"\n    health_user = \"app\"", &quoted(MD5))
                + "    [[cluster.user]]\n    name = \"ops\"\n    password = \"ops-pw\"\n"),
            "fulcrum.toml:6: cluster[0].health_user: \"app\"'s [[cluster.user]] password is an md5 hash, which cannot log in by itself (the health probe runs before any client): set health_password, or a health_user with a password",
        ),

    ]);
}

fn parse_ok(text: &str) -> crate::Config {
    crate::parse(&dedent(text), Path::new("fulcrum.toml")).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn verifiers_and_md5_hashes_are_read_from_every_secret_form() {
    let health = "health_user = \"postgres\"";
    let c = parse_ok(&config(health, &quoted(VERIFIER)));
    let u = &c.clusters[0].users[0];
    let Some(PasswordHash::Scram(v)) = &u.hash else {
        panic!("{u:?}");
    };
    assert_eq!((v.iterations, v.salt.len()), (4096, 16));
    assert!(u.server_hash().is_some());
    assert_eq!(c.clusters[0].health.password, "", "postgres is not a user");

    let env = "FULCRUM_TEST_GOOD_VERIFIER";
    std::env::set_var(env, VERIFIER);
    let c = parse_ok(&config(health, &format!("{{ env = \"{env}\" }}")));
    assert_eq!(c.clusters[0].users[0].hash, u.hash);

    // md5 with client_auth = "md5"; a later user with a password is the
    // health probe's login.
    let text = config("client_auth = \"md5\"", &quoted(MD5))
        + "    [[cluster.user]]\n    name = \"ops\"\n    password = \"ops-pw\"\n";
    let c = parse_ok(&text);
    assert_eq!(
        c.clusters[0].users[0].hash,
        Some(PasswordHash::Md5(MD5.into()))
    );
    assert_eq!(c.clusters[0].users[1].hash, None);
    assert_eq!(
        (
            c.clusters[0].health.user.as_str(),
            c.clusters[0].health.password.as_str()
        ),
        ("ops", "ops-pw")
    );
    // With server_user, a verifier only checks clients: trust is fine.
    let text = config(
        "client_auth = \"trust\"",
        &format!(
            "{}\n    server_user = \"owner\"\n    server_password = \"pw\"",
            quoted(VERIFIER)
        ),
    );
    let c = parse_ok(&text);
    assert!(c.clusters[0].users[0].hash.is_some());
    assert_eq!(c.clusters[0].users[0].server_hash(), None);
    // A plain password that merely starts like a hash is a password.
    let c = parse_ok(&config("", &quoted("md5-is-my-password")));
    assert_eq!(c.clusters[0].users[0].hash, None);
    // MySQL: the text is the password, whatever it looks like.
    let text = config("", &quoted(VERIFIER)).replace("\"postgres\"", "\"mysql\"");
    let c = parse_ok(&text);
    assert_eq!(c.clusters[0].protocol, Protocol::Mysql);
    assert_eq!(c.clusters[0].users[0].hash, None);
}
