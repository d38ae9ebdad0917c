//! Errors found before validation: TOML syntax, unknown keys, wrong value types, and a
//! file without clusters.

use super::{assert_errors, dedent, MINIMAL};

#[test]
fn syntax_errors_name_the_line() {
    assert_errors(&[
        (
            "[[cluster]]\nname = main\n",
            "fulcrum.toml:2: string values must be quoted, expected literal string",
        ),
        (
            "[[cluster]]\nname = \"a\"\nname = \"b\"\n",
            "fulcrum.toml:3: duplicate key \"name\"",
        ),
        (
            "[fulcrum]\nlog = \"info\"\n\n[fulcrum]\n",
            "fulcrum.toml:4: duplicate table [fulcrum]",
        ),
        (
            "# comment\n\nlog = \"info",
            "fulcrum.toml:3: invalid basic string, expected `\"`",
        ),
    ]);
}

#[test]
fn unknown_keys_are_reported_with_their_path_and_line() {
    let unknown_backend_key =
        MINIMAL.replace("role = \"primary\"", "role = \"primary\"\n    wieght = 2");
    let unknown_user_key = format!("{MINIMAL}    pasword = \"x\"\n");
    let unknown_cluster_key =
        format!("{MINIMAL}    [[cluster]]\n    name = \"b\"\n    pool_sise = 5\n");
    let pgbouncer_key =
        format!("{MINIMAL}    [[cluster]]\n    name = \"b\"\n    default_pool_size = 5\n");
    assert_errors(&[
        (
            "clusters = []\n",
            "fulcrum.toml:1: clusters: unknown key `clusters`, expected `fulcrum` or `cluster`",
        ),
        (
            "[fulcrum]\nlog = \"info\"\nadmn = \"127.0.0.1:6480\"\n",
            "fulcrum.toml:3: fulcrum.admn: unknown key `admn`: did you mean `admin`?",
        ),
        (
            &unknown_cluster_key,
            "fulcrum.toml:13: cluster[1].pool_sise: unknown key `pool_sise`: did you mean `pool_size`?",
        ),
        (
            &pgbouncer_key,
            "fulcrum.toml:13: cluster[1].default_pool_size: unknown key `default_pool_size` (PgBouncer's name): did you mean `pool_size`?",
        ),
        (
            &unknown_backend_key,
            "fulcrum.toml:8: cluster[0].backend[0].wieght: unknown key `wieght`: did you mean `weight`?",
        ),
        (
            &unknown_user_key,
            "fulcrum.toml:11: cluster[0].user[0].pasword: unknown key `pasword`: did you mean `password`?",
        ),
        (
            "[[cluster]]\nbackend = [{ address = \"a:1\" }, { adress = \"b:1\" }]\n",
            "fulcrum.toml:2: cluster[0].backend[1].adress: unknown key `adress`: did you mean `address`?",
        ),
        // Nothing near: every key of the table is listed.
        (
            "[[cluster]]\nbackend = [{ colour = \"b:1\" }]\n",
            "fulcrum.toml:2: cluster[0].backend[0].colour: unknown key `colour`, expected one of `address`, `role`, `weight`, `server_tls`, `server_tls_ca`, `server_tls_certificate`, `server_tls_private_key`, `server_channel_binding`",
        ),
    ]);
}

#[test]
fn wrong_types_are_reported_with_their_path_and_line() {
    let with = |key: &str| format!("{MINIMAL}    [[cluster]]\n    {key}\n");
    assert_errors(&[
        ("fulcrum = 3\n", "fulcrum.toml:1: fulcrum: invalid type: integer `3`, expected a table"),
        (
            "[fulcrum]\nadmin = 6480\n",
            "fulcrum.toml:2: fulcrum.admin: invalid type: integer `6480`, expected a string",
        ),
        (
            &with("pool_size = \"20\""),
            "fulcrum.toml:12: cluster[1].pool_size: invalid type: string \"20\", expected an integer",
        ),
        (
            &with("pool_size = 1.5"),
            "fulcrum.toml:12: cluster[1].pool_size: invalid type: floating point `1.5`, expected an integer",
        ),
        (
            &with("pool_timeout = 5"),
            "fulcrum.toml:12: cluster[1].pool_timeout: invalid type: integer `5`, expected a duration \
             string such as \"5s\" or \"500ms\"",
        ),
        (
            &with("max_message_size = true"),
            "fulcrum.toml:12: cluster[1].max_message_size: invalid type: boolean `true`, expected a size \
             string such as \"256MB\" or an integer number of bytes",
        ),
        (
            &with("listen = [\"127.0.0.1:6432\"]"),
            "fulcrum.toml:12: cluster[1].listen: invalid type: sequence, expected a string",
        ),
    ]);
}

#[test]
fn a_single_table_where_an_array_of_tables_belongs_names_the_header() {
    assert_errors(&[
        (
            "[fulcrum]\n\n[cluster]\nname = \"main\"\n",
            "fulcrum.toml:3: cluster: invalid type: map, expected an array of tables, each starting with [[cluster]]",
        ),
        (
            "[[cluster]]\nname = \"main\"\n[cluster.backend]\naddress = \"db:5432\"\n",
            "fulcrum.toml:3: cluster[0].backend: invalid type: map, expected an array of tables, \
             each starting with [[cluster.backend]]",
        ),
        (
            "[[cluster]]\nuser = { name = \"app\" }\n",
            "fulcrum.toml:2: cluster[0].user: invalid type: map, expected an array of tables, \
             each starting with [[cluster.user]]",
        ),
    ]);
}

#[test]
fn a_file_without_clusters_is_rejected() {
    assert_errors(&[
        (
            "",
            "fulcrum.toml:1: cluster: at least one [[cluster]] is required",
        ),
        (
            "[fulcrum]\nlog = \"info\"\n",
            "fulcrum.toml:1: cluster: at least one [[cluster]] is required",
        ),
        (
            "# comment\n\ncluster = []\n",
            "fulcrum.toml:3: cluster: at least one [[cluster]] is required",
        ),
    ]);
}

#[test]
fn the_minimal_cluster_used_by_error_cases_is_valid() {
    let config = crate::parse(&dedent(MINIMAL), std::path::Path::new("fulcrum.toml")).unwrap();
    assert_eq!(config.clusters.len(), 1);
}
