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
    let parsed: toml::Table = t.parse().expect("valid TOML");
    assert_eq!(parsed["cluster"].as_array().unwrap().len(), 3);
    let notes = r.notes.join("\n");
    for want in [
        "logfile",
        "[users] app",
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
