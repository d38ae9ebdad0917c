//! `fulcrum import pgbouncer` on whole ini files: what is carried, what is noted.

use super::*;

fn users() -> Vec<(String, String)> {
    vec![
        ("app".into(), "secret".into()),
        ("ops".into(), "ops-secret".into()),
        (
            "hashed".into(),
            "md5d41d8cd98f00b204e9800998ecf8427e".into(),
        ),
    ]
}

#[test]
fn databases_become_clusters_per_server_with_their_aliases() {
    let ini = Ini::parse(
        "[databases]\norders = host=10.0.0.1 port=5432 dbname=orders\nreports = host=10.0.0.1 dbname=analytics pool_size=5\nother = host=10.0.0.2 port=5433\nlocal = host=/var/run/postgresql\n\
         [pgbouncer]\nlisten_addr = *\nlisten_port = 6432\npool_mode = transaction\ndefault_pool_size = 30\nauth_type = scram-sha-256\n\
         server_lifetime = 3600\nquery_wait_timeout = 0\nadmin_users = ops\nlogfile = /var/log/pgbouncer.log\n[users]\napp = pool_mode=session\n",
    );
    let r = import(&ini, &users(), "pgbouncer.ini").unwrap();
    let t = &r.toml;
    assert!(t.contains("listen = \"0.0.0.0:6432\""), "{t}");
    assert_eq!(t.matches("[[cluster]]").count(), 3, "{t}");
    assert!(
        t.contains("name = \"reports\"\nserver_database = \"analytics\""),
        "{t}"
    );
    assert!(t.contains("address = \"10.0.0.2:5433\""), "{t}");
    assert!(
        t.contains("address = \"/var/run/postgresql:5432\""),
        "a socket directory stays one: {t}"
    );
    assert!(t.contains("pool_size = 5"), "the per-database size: {t}");
    assert!(t.contains("server_lifetime = \"3600s\""), "{t}");
    assert!(t.contains("pool_timeout = \"1h\""), "{t}");
    assert!(t.contains("client_auth = \"scram-sha-256\""), "{t}");
    assert!(t.contains("[[fulcrum.admin_user]]\nname = \"ops\""), "{t}");
    assert!(
        t.contains("name = \"app\"\npassword = \"secret\"\npool_mode = \"session\"\n"),
        "[users] app's pool_mode on its [[cluster.user]]: {t}"
    );
    let parsed: toml::Table = t.parse().expect("valid TOML");
    assert_eq!(parsed["cluster"].as_array().unwrap().len(), 3);
    let notes = r.notes.join("\n");
    for want in [
        "logfile",
        "\"hashed\"",
        "query_wait_timeout = 0",
        "admin = \"127.0.0.1:6433\"",
    ] {
        assert!(notes.contains(want), "{want} in {notes}");
    }
}

#[test]
fn no_databases_gives_one_cluster_for_the_local_server() {
    let ini = Ini::parse("[databases]\n[pgbouncer]\nlisten_addr = localhost\nauth_type = md5\nmax_prepared_statements = 9 # x\n%include more.ini\n");
    let r = import(&ini, &users(), "x.ini").unwrap();
    let notes = r.notes.join("\n");
    assert!(
        notes.contains("x.ini:6: %include more.ini: not followed"),
        "{notes}"
    );
    assert!(
        notes.contains("max_prepared_statements = \"9 # x\": not an integer"),
        "{notes}"
    );
    assert!(!r.toml.contains("max_prepared_statements"), "{}", r.toml);
    assert!(
        r.toml.contains("address = \"127.0.0.1:5432\""),
        "{}",
        r.toml
    );
    assert!(!r.toml.contains("[[cluster.database]]"));
    assert!(
        r.toml
            .contains("name = \"hashed\"\npassword = \"md5d41d8cd98f00b204e9800998ecf8427e\""),
        "an md5 hash under md5 is kept: {}",
        r.toml
    );
    assert!(
        import(&ini, &[], "x.ini").is_err(),
        "no user: an error, not a config that fails"
    );
}

#[test]
fn auth_type_hba_carries_its_file() {
    let ini = Ini::parse(
        "[databases]\n[pgbouncer]\nauth_type = hba\nauth_hba_file = /etc/pgbouncer/hba.conf\n",
    );
    let r = import(&ini, &users(), "x.ini").unwrap();
    let t = &r.toml;
    assert!(
        t.contains("client_auth = \"hba\"\nauth_hba_file = \"/etc/pgbouncer/hba.conf\"\n"),
        "{t}"
    );
    assert!(
        !r.notes.join("\n").contains("auth_hba_file"),
        "{:?}",
        r.notes
    );
    let ini = Ini::parse("[databases]\n[pgbouncer]\nauth_type = hba\n");
    let r = import(&ini, &users(), "x.ini").unwrap();
    assert!(r.toml.contains("client_auth = \"md5\""), "{}", r.toml);
    assert!(
        r.notes
            .join("\n")
            .contains("auth_type = hba without auth_hba_file"),
        "{:?}",
        r.notes
    );
}

#[test]
fn statement_pooling_and_users_pool_settings_are_carried_over() {
    let ini = Ini::parse(
        "[databases]\napp = host=10.0.0.1 port=5432\n\
         [pgbouncer]\npool_mode = statement\ndefault_pool_size = 10\nmax_user_connections = 30\nauth_type = md5\n\
         [users]\napp = pool_mode=transaction pool_size=4 max_user_connections=6\n\
         ops = pool_mode=statement max_user_connections=0 reserve_pool_size=2\n\
         hashed = pool_size=3\nbad = pool_mode=sometimes pool_size=x\n",
    );
    let r = import(&ini, &users(), "pgbouncer.ini").unwrap();
    let t = &r.toml;
    assert!(
        t.contains("pool_mode = \"statement\"\npool_size = 10\n"),
        "{t}"
    );
    assert!(
        t.contains("name = \"app\"\npassword = \"secret\"\npool_mode = \"transaction\"\npool_size = 4\nmax_user_connections = 6\n"),
        "{t}"
    );
    assert!(
        t.contains("name = \"ops\"\npassword = \"ops-secret\"\npool_mode = \"statement\"\n"),
        "max_user_connections=0 (the global cap) is left to the cluster's: {t}"
    );
    let config = fulcrum_config::parse(t, std::path::Path::new("fulcrum.toml"))
        .unwrap_or_else(|e| panic!("{e}\n{t}"));
    let c = &config.clusters[0];
    assert_eq!(c.pool_mode, fulcrum_config::PoolMode::Statement);
    assert_eq!(c.pool_mode_of("app"), fulcrum_config::PoolMode::Transaction);
    assert_eq!(
        (c.pool_size_of("app"), c.max_user_connections_of("app")),
        (4, 6)
    );
    assert_eq!(
        (c.pool_size_of("ops"), c.max_user_connections_of("ops")),
        (10, 30)
    );
    assert!(
        t.contains("name = \"hashed\"\npassword = \"md5d41d8cd98f00b204e9800998ecf8427e\"\npool_size = 3\n"),
        "an md5 hash under md5 is carried, with its [users] pool_size: {t}"
    );
    let notes = r.notes.join("\n");
    for want in [
        "[users] ops: reserve_pool_size=2 not carried over",
        "[users] bad: pool_mode=sometimes is not a PgBouncer pool mode",
        "[users] bad: pool_size=x is not a number",
    ] {
        assert!(notes.contains(want), "{want} in {notes}");
    }
    assert!(
        !notes.contains("statement"),
        "statement pooling is carried, not noted: {notes}"
    );
}

#[test]
fn a_databases_statement_pool_mode_stays_statement() {
    let ini = Ini::parse(
        "[databases]\nreports = host=10.0.0.1 pool_mode=statement\n[pgbouncer]\npool_mode = transaction\n",
    );
    let t = import(&ini, &users(), "x.ini").unwrap().toml;
    assert!(
        t.contains("pool_mode = \"statement\"") && !t.contains("\"transaction\""),
        "{t}"
    );
}

#[test]
fn md5_then_32_characters_that_are_not_hex_is_a_clear_text_password() {
    // Fulcrum logs in with it as a password (PasswordHash::detect), so the
    // importer carries it where a clear-text password is needed.
    let not_hex = "md5zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz";
    let hex = "md5d41d8cd98f00b204e9800998ecf8427e";
    assert_eq!(not_hex.len(), 35);
    assert!(!is_hash(not_hex));
    assert!(is_hash(hex));
    assert!(
        is_hash("SCRAM-SHA-256$x"),
        "a malformed SCRAM secret is no password"
    );
    let ini = Ini::parse(
        "[databases]\n[pgbouncer]\nauth_type = md5\nadmin_users = ops, hashed\n\
         auth_user = ops\nauth_query = SELECT usename, passwd FROM pg_shadow WHERE usename=$1\n",
    );
    let users = vec![
        ("ops".to_owned(), not_hex.to_owned()),
        ("hashed".to_owned(), hex.to_owned()),
    ];
    let r = import(&ini, &users, "pgbouncer.ini").unwrap();
    let t = &r.toml;
    assert!(
        t.contains(&format!(
            "auth_user = \"ops\"\nauth_password = \"{not_hex}\""
        )),
        "{t}"
    );
    assert!(
        t.contains(&format!(
            "[[fulcrum.admin_user]]\nname = \"ops\"\npassword = \"{not_hex}\""
        )),
        "{t}"
    );
    let notes = r.notes.join("\n");
    assert!(
        !notes.contains("auth_user \"ops\""),
        "ops's password is carried: {notes}"
    );
    assert!(
        notes.contains("admin/stats user \"hashed\": no clear-text password"),
        "{notes}"
    );
}
