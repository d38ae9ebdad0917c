//! `[[cluster.database]]`'s forced server login (`server_user`,
//! `server_password`) and `connect_query` on `[[cluster]]` and
//! `[[cluster.database]]`: the values they give and each bad value's error.

use std::path::Path;

use super::{assert_errors, dedent, MINIMAL};

/// `MINIMAL` (10 lines) followed by `extra`, which starts on line 11.
fn with(extra: &str) -> String {
    format!("{MINIMAL}{extra}")
}

/// `MINIMAL` with `line` in its `[[cluster]]` table, on line 5.
fn with_cluster_key(line: &str) -> String {
    MINIMAL.replacen(
        "    [[cluster.backend]]",
        &format!("    {line}\n    [[cluster.backend]]"),
        1,
    )
}

fn parse(text: &str) -> crate::Config {
    crate::parse(&dedent(text), Path::new("fulcrum.toml")).expect("valid")
}

#[test]
fn a_database_forces_a_server_login_and_its_connect_query_wins() {
    let text = with_cluster_key(r#"connect_query = "SET application_name = 'cluster'""#);
    let config = parse(&format!(
        "{text}{}",
        r#"    [[cluster.database]]
    name = "shop"
    server_user = "shop_owner"
    server_password = "owner secret"
    connect_query = "SET search_path = shop"
    [[cluster.database]]
    name = "other"
"#
    ));
    let c = &config.clusters[0];
    let login = c.forced_login_of("shop").expect("forced");
    assert_eq!(
        (login.user.as_str(), login.password.as_str()),
        ("shop_owner", "owner secret")
    );
    assert_eq!(c.pool_user("app", "shop"), "shop_owner");
    assert_eq!(c.pool_user("app", "other"), "app");
    assert!(c.forced_login_of("other").is_none());
    // A pool's login and query, by its key (server database, user).
    assert!(c.forced_login("shop", "shop_owner").is_some());
    assert!(c.forced_login("shop", "app").is_none());
    let cq = |db, user| c.connect_query(db, user);
    assert_eq!(
        cq(Some("shop"), "shop_owner"),
        Some("SET search_path = shop")
    );
    assert_eq!(
        cq(Some("other"), "app"),
        Some("SET application_name = 'cluster'")
    );
    assert_eq!(cq(None, "app"), Some("SET application_name = 'cluster'"));
    // Never printed.
    assert!(!format!("{c:?}").contains("owner secret"));
}

#[test]
fn a_forced_server_password_comes_from_the_environment_too() {
    std::env::set_var("FULCRUM_TEST_DB_LOGIN_PASSWORD", "from env");
    let config = parse(&with(
        r#"    [[cluster.database]]
    name = "shop"
    server_user = "owner"
    server_password = { env = "FULCRUM_TEST_DB_LOGIN_PASSWORD" }
"#,
    ));
    let login = config.clusters[0].forced_login_of("shop").expect("forced");
    assert_eq!(login.password, "from env");
    // No password: an empty one (trust on the server, as for a user's).
    let config = parse(&with(
        "    [[cluster.database]]\n    name = \"shop\"\n    server_user = \"owner\"\n",
    ));
    let login = config.clusters[0].forced_login_of("shop").expect("forced");
    assert_eq!(login.password, "");
}

#[test]
fn bad_database_logins_and_connect_queries_name_file_line_and_key() {
    let mysql = MINIMAL
        .replace("\"postgres\"", "\"mysql\"")
        .replace("5432", "3306");
    let mysql_db =
        |key: &str| format!("{mysql}    [[cluster.database]]\n    name = \"shop\"\n    {key}\n");
    let why_mysql = "is for PostgreSQL clusters: a MySQL server connection serves every schema \
                     (set server_user on [[cluster.user]], connect_query on [[cluster]])";
    assert_errors(&[
        (
            &with_cluster_key("connect_query = \"  \""),
            "fulcrum.toml:5: cluster[0].connect_query: must not be empty",
        ),
        (
            &with_cluster_key("connect_query = \"SELECT 1\\u0000\""),
            "fulcrum.toml:5: cluster[0].connect_query: must not contain a NUL character",
        ),
        (
            &with_cluster_key("connect_query = 1"),
            "fulcrum.toml:5: cluster[0].connect_query: invalid type: integer `1`, expected a string",
        ),
        (
            &with("    [[cluster.database]]\n    name = \"shop\"\n    connect_query = \"\"\n"),
            "fulcrum.toml:13: cluster[0].database[0].connect_query: must not be empty",
        ),
        (
            &with("    [[cluster.database]]\n    name = \"shop\"\n    server_password = \"x\"\n"),
            "fulcrum.toml:13: cluster[0].database[0].server_password: needs server_user",
        ),
        (
            &with("    [[cluster.database]]\n    name = \"shop\"\n    server_user = \"\"\n"),
            "fulcrum.toml:13: cluster[0].database[0].server_user: must not be empty",
        ),
        (
            &with(
                "    [[cluster.database]]\n    name = \"shop\"\n    server_user = \"o\"\n    server_password = { env = \"FULCRUM_TEST_UNSET_VARIABLE\" }\n",
            ),
            "fulcrum.toml:14: cluster[0].database[0].server_password: environment variable FULCRUM_TEST_UNSET_VARIABLE is not set",
        ),
        (
            &with(
                "    [[cluster.database]]\n    name = \"shop\"\n    server_user = \"o\"\n    server_password = { file = \"a\", env = \"B\" }\n",
            ),
            "fulcrum.toml:14: cluster[0].database[0].server_password: a password comes from one place: `file` or `env`, not both",
        ),
        (
            &with(
                "    [[cluster.database]]\n    name = \"shop\"\n    server_user = \"o\"\n\
                 \x20   [[cluster.database]]\n    name = \"store\"\n    server_database = \"shop\"\n\
                 \x20   server_user = \"o\"\n    server_password = \"p\"\n",
            ),
            "fulcrum.toml:14: cluster[0].database[1].server_database: database[0] (\"shop\") is also \
             server database \"shop\" forcing server_user \"o\": such aliases share its pools, so \
             give them the same server_password and connect_query",
        ),
        (
            &with(
                "    [[cluster.database]]\n    name = \"shop\"\n\
                 \x20   [[cluster.database]]\n    name = \"store\"\n    server_database = \"shop\"\n\
                 \x20   connect_query = \"SELECT 1\"\n",
            ),
            "fulcrum.toml:13: cluster[0].database[1].server_database: database[0] (\"shop\") is also \
             server database \"shop\" forcing no server_user: such aliases share its pools, so \
             give them the same server_password and connect_query",
        ),
        (
            &mysql_db("server_user = \"o\""),
            &format!("fulcrum.toml:13: cluster[0].database[0].server_user: {why_mysql}"),
        ),
        (
            &mysql_db("connect_query = \"SET @a = 1\""),
            &format!("fulcrum.toml:13: cluster[0].database[0].connect_query: {why_mysql}"),
        ),
    ]);
}

#[test]
fn aliases_of_one_server_database_may_force_different_logins() {
    // PgBouncer's `shop = dbname=app user=owner` beside `app = dbname=app`:
    // two pools, each with its own login and query.
    let config = parse(&with(
        r#"    [[cluster.database]]
    name = "shop"
    server_database = "app"
    server_user = "owner"
    connect_query = "SELECT 'owner'"
    [[cluster.database]]
    name = "app"
    connect_query = "SELECT 'plain'"
"#,
    ));
    let c = &config.clusters[0];
    assert_eq!(c.pool_user("app", "shop"), "owner");
    assert_eq!(c.pool_user("app", "app"), "app");
    assert_eq!(
        c.connect_query(Some("app"), "owner"),
        Some("SELECT 'owner'")
    );
    assert_eq!(c.connect_query(Some("app"), "app"), Some("SELECT 'plain'"));
    assert!(c.forced_login("app", "app").is_none());
}
