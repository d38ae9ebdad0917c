//! `pool_mode = "statement"` and the per-user pool keys (`pool_mode`,
//! `pool_size`, `max_user_connections` on `[[cluster.user]]` and
//! `[[cluster.user_default]]`): their errors and what they resolve to.

use super::{assert_errors, dedent, MINIMAL};
use crate::PoolMode;

/// `MINIMAL` with `lines` appended to its `[[cluster.user]]` (from line 11).
fn user_with(lines: &str) -> String {
    format!("{MINIMAL}    {}\n", lines.replace('\n', "\n    "))
}

/// `MINIMAL` with `auth_user` (line 5) and a `[[cluster.user_default]]`
/// table (its header on line 12) holding `lines`.
fn default_with(lines: &str) -> String {
    let listen = "listen = \"127.0.0.1:6432\"\n";
    let base = MINIMAL.replace(listen, &format!("{listen}    auth_user = \"app\"\n"));
    format!(
        "{base}    [[cluster.user_default]]\n    {}\n",
        lines.replace('\n', "\n    ")
    )
}

#[test]
fn statement_pooling_is_for_postgres_clusters() {
    let mysql = MINIMAL.replace("protocol = \"postgres\"", "protocol = \"mysql\"");
    let listen = "listen = \"127.0.0.1:6432\"\n";
    assert_errors(&[
        (
            &mysql.replace(listen, &format!("{listen}    pool_mode = \"statement\"\n")),
            "fulcrum.toml:5: cluster[0].pool_mode: pool_mode = statement is for postgres clusters; use \"transaction\"",
        ),
        (
            &format!("{mysql}    pool_mode = \"statement\"\n"),
            "fulcrum.toml:11: cluster[0].user[0].pool_mode: pool_mode = statement is for postgres clusters; use \"transaction\"",
        ),
    ]);
}

#[test]
fn a_users_pool_keys_are_validated() {
    assert_errors(&[
        (
            &user_with("pool_mode = \"txn\""),
            "fulcrum.toml:11: cluster[0].user[0].pool_mode: unknown value \"txn\", expected one of \"session\", \"transaction\", \"statement\"",
        ),
        (
            &user_with("pool_size = 0"),
            "fulcrum.toml:11: cluster[0].user[0].pool_size: must be at least 1, got 0",
        ),
        (
            &user_with("pool_size = \"ten\""),
            "fulcrum.toml:11: cluster[0].user[0].pool_size: invalid type: string \"ten\", expected an integer",
        ),
        (
            &user_with("max_user_connections = -1"),
            "fulcrum.toml:11: cluster[0].user[0].max_user_connections: must be at least 0, got -1",
        ),
        (
            &MINIMAL.replace(
                "listen = \"127.0.0.1:6432\"\n",
                "listen = \"127.0.0.1:6432\"\n    min_pool_size = 3\n",
            )
            .replace("password = \"secret\"\n", "password = \"secret\"\n    pool_size = 2\n"),
            "fulcrum.toml:12: cluster[0].user[0].pool_size: must be at least the cluster's min_pool_size (3)",
        ),
        (
            &MINIMAL.replace(
                "listen = \"127.0.0.1:6432\"\n",
                "listen = \"127.0.0.1:6432\"\n    min_pool_size = 3\n",
            )
            .replace(
                "password = \"secret\"\n",
                "password = \"secret\"\n    max_user_connections = 2\n",
            ),
            "fulcrum.toml:12: cluster[0].user[0].max_user_connections: must be 0 (the cluster's) or at least the cluster's min_pool_size (3)",
        ),
    ]);
}

#[test]
fn the_user_default_is_one_table_for_auth_query_users() {
    assert_errors(&[
        (
            &format!("{MINIMAL}    [[cluster.user_default]]\n    pool_size = 2\n"),
            "fulcrum.toml:11: cluster[0].user_default[0]: applies to users auth_query finds, and this cluster has no auth_user; set these keys on each [[cluster.user]]",
        ),
        (
            &format!("{}    [[cluster.user_default]]\n    pool_size = 3\n", default_with("pool_size = 2")),
            "fulcrum.toml:14: cluster[0].user_default[1]: a cluster has one [[cluster.user_default]] at most",
        ),
        (
            &default_with("pool_mode = \"always\""),
            "fulcrum.toml:13: cluster[0].user_default[0].pool_mode: unknown value \"always\", expected one of \"session\", \"transaction\", \"statement\"",
        ),
        (
            &default_with("pool_size = 0"),
            "fulcrum.toml:13: cluster[0].user_default[0].pool_size: must be at least 1, got 0",
        ),
        (
            &default_with("max_user_connections = 5000000000"),
            "fulcrum.toml:13: cluster[0].user_default[0].max_user_connections: must be at most 4294967295, got 5000000000",
        ),
        (
            &default_with("server_user = \"x\""),
            "fulcrum.toml:13: cluster[0].user_default[0].server_user: unknown key `server_user`, expected one of `pool_mode`, `pool_size`, `max_user_connections`",
        ),
    ]);
}

#[test]
fn users_take_their_own_pool_settings_over_the_clusters() {
    let text = dedent(
        r#"
        [[cluster]]
        name = "main"
        protocol = "postgres"
        listen = "127.0.0.1:6432"
        pool_mode = "statement"
        pool_size = 8
        max_user_connections = 12
        auth_user = "app"
        [[cluster.backend]]
        address = "127.0.0.1:5432"
        role = "primary"
        [[cluster.user]]
        name = "app"
        password = "secret"
        pool_mode = "session"
        pool_size = 2
        [[cluster.user]]
        name = "batch"
        password = "secret"
        max_user_connections = 0
        [[cluster.user_default]]
        pool_mode = "transaction"
        max_user_connections = 3
        "#,
    );
    let config =
        crate::parse(&text, std::path::Path::new("fulcrum.toml")).unwrap_or_else(|e| panic!("{e}"));
    let c = &config.clusters[0];
    let of = |u: &str| {
        (
            c.pool_mode_of(u),
            c.pool_size_of(u),
            c.max_user_connections_of(u),
        )
    };
    assert_eq!(of("app"), (PoolMode::Session, 2, 12));
    assert_eq!(
        of("batch"),
        (PoolMode::Statement, 8, 12),
        "0: the cluster's cap"
    );
    assert_eq!(of("found_by_auth_query"), (PoolMode::Transaction, 8, 3));
}
