//! Validation errors of `[[cluster.backend]]` and `[[cluster.user]]` tables, and of the
//! rules across them (roles, duplicates).

use super::{assert_errors, MINIMAL};

/// `MINIMAL` with its backend (lines 5-7) replaced by `backends`, starting on line 5.
fn with_backends(backends: &str) -> String {
    let old = "    [[cluster.backend]]\n    address = \"127.0.0.1:5432\"\n    role = \"primary\"\n";
    MINIMAL.replace(old, backends)
}

/// `MINIMAL` with its user (lines 8-10) replaced by `users`, starting on line 8.
fn with_users(users: &str) -> String {
    let old = "    [[cluster.user]]\n    name = \"app\"\n    password = \"secret\"\n";
    MINIMAL.replace(old, users)
}

#[test]
fn a_cluster_needs_backends() {
    assert_errors(&[
        (
            &with_backends(""),
            "fulcrum.toml:1: cluster[0].backend: cluster \"main\" has no backends; add a [[cluster.backend]]",
        ),
        (
            &with_backends("    backend = []\n"),
            "fulcrum.toml:5: cluster[0].backend: cluster \"main\" has no backends; add a [[cluster.backend]]",
        ),
    ]);
}

#[test]
fn backend_addresses_must_be_host_port_and_unique() {
    assert_errors(&[
        (
            &with_backends("    [[cluster.backend]]\n    role = \"primary\"\n"),
            "fulcrum.toml:5: cluster[0].backend[0].address: required key is missing",
        ),
        (
            &with_backends("    [[cluster.backend]]\n    address = \"db1\"\n    role = \"primary\"\n"),
            "fulcrum.toml:6: cluster[0].backend[0].address: invalid address \"db1\": expected host:port, \
             e.g. \"127.0.0.1:5432\"",
        ),
        (
            &with_backends("    [[cluster.backend]]\n    address = \"db1:99999\"\n    role = \"primary\"\n"),
            "fulcrum.toml:6: cluster[0].backend[0].address: invalid address \"db1:99999\": port \"99999\" \
             is not a number from 1 to 65535",
        ),
        (
            &with_backends(
                "    [[cluster.backend]]\n    address = \"db1:5432\"\n    role = \"primary\"\n\
                 \x20   [[cluster.backend]]\n    address = \"DB1:5432\"\n    role = \"replica\"\n",
            ),
            "fulcrum.toml:9: cluster[0].backend[1].address: \"DB1:5432\" is already backend[0] (line 6)",
        ),
    ]);
}

#[test]
fn backend_roles_need_one_writable_and_at_most_one_primary() {
    let replica = |n: u16| {
        format!("    [[cluster.backend]]\n    address = \"db{n}:5432\"\n    role = \"replica\"\n")
    };
    let primary = |n: u16| {
        format!("    [[cluster.backend]]\n    address = \"db{n}:5432\"\n    role = \"primary\"\n")
    };
    assert_errors(&[
        (
            &with_backends("    [[cluster.backend]]\n    address = \"db1:5432\"\n"),
            "fulcrum.toml:5: cluster[0].backend[0].role: required key is missing",
        ),
        (
            &with_backends("    [[cluster.backend]]\n    address = \"db1:5432\"\n    role = \"master\"\n"),
            "fulcrum.toml:7: cluster[0].backend[0].role: unknown value \"master\", expected one of \
             \"primary\", \"replica\", \"auto\"",
        ),
        (
            &with_backends(&format!("{}{}", replica(1), replica(2))),
            "fulcrum.toml:5: cluster[0].backend: cluster \"main\" has no backend with role \"primary\" or \
             \"auto\", so writes would have nowhere to go",
        ),
        (
            &with_backends(&format!("{}{}{}", primary(1), replica(2), primary(3))),
            "fulcrum.toml:13: cluster[0].backend[2].role: backend[0] (line 7) is already the primary; \
             a cluster has at most one backend with role \"primary\"",
        ),
    ]);
}

#[test]
fn backend_weights_fit_in_u32() {
    let backend = |weight: &str| {
        with_backends(&format!(
            "    [[cluster.backend]]\n    address = \"db1:5432\"\n    role = \"primary\"\n    weight = {weight}\n"
        ))
    };
    assert_errors(&[
        (&backend("-1"), "fulcrum.toml:8: cluster[0].backend[0].weight: must be at least 0, got -1"),
        (
            &backend("4294967296"),
            "fulcrum.toml:8: cluster[0].backend[0].weight: must be at most 4294967295, got 4294967296",
        ),
    ]);
}

#[test]
fn a_cluster_needs_users_with_unique_names_and_passwords() {
    let user = |name: &str| {
        format!("    [[cluster.user]]\n    name = \"{name}\"\n    password = \"pw\"\n")
    };
    assert_errors(&[
        (
            &with_users(""),
            "fulcrum.toml:1: cluster[0].user: cluster \"main\" has no users; add a [[cluster.user]]",
        ),
        (
            &with_users("    [[cluster.user]]\n    password = \"pw\"\n"),
            "fulcrum.toml:8: cluster[0].user[0].name: required key is missing",
        ),
        (
            &with_users("    [[cluster.user]]\n    name = \"\"\n    password = \"pw\"\n"),
            "fulcrum.toml:9: cluster[0].user[0].name: must not be empty",
        ),
        (
            &with_users(&format!("{}{}{}", user("app"), user("admin"), user("app"))),
            "fulcrum.toml:15: cluster[0].user[2].name: user \"app\" is already defined by user[0] (line 9)",
        ),
        (
            &with_users("    [[cluster.user]]\n    name = \"app\"\n"),
            "fulcrum.toml:8: cluster[0].user[0].password: required key is missing",
        ),
        (
            &with_users("    [[cluster.user]]\n    name = \"app\"\n    password = \"\"\n"),
            "fulcrum.toml:10: cluster[0].user[0].password: must not be empty when client_auth is \"scram-sha-256\"",
        ),
    ]);
}
