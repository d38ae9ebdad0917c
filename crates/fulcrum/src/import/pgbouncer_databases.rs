//! `[databases]` entries' own server login (`user=`, `password=`) and
//! `connect_query=`, carried into `[[cluster.database]]` tables
//! (`server_user`, `server_password`, `connect_query`), and those tables
//! written. Pure, like the rest of the importer.

use std::fmt::Write as _;

/// One named `[databases]` entry.
pub(super) struct Db {
    pub alias: String,
    /// The server's name for it (`dbname=`, else the alias).
    pub server: String,
    /// `user=`: every client of it is served as this login.
    pub user: Option<String>,
    /// `password=` (else the auth file's clear-text one for `user`).
    pub password: Option<String>,
    pub connect_query: Option<String>,
}

impl Db {
    pub fn new(alias: String, server: String) -> Db {
        Db {
            alias,
            server,
            user: None,
            password: None,
            connect_query: None,
        }
    }

    /// Takes `key=value` when it is one of a database's own keys.
    pub fn take(&mut self, key: &str, value: &str) -> bool {
        let slot = match key {
            "user" => &mut self.user,
            "password" => &mut self.password,
            "connect_query" => &mut self.connect_query,
            _ => return false,
        };
        *slot = Some(value.to_owned());
        true
    }

    /// The three keys aliases of one server database must agree on.
    fn shared(&self) -> (&Option<String>, &Option<String>, &Option<String>) {
        (&self.user, &self.password, &self.connect_query)
    }
}

/// The `*` entry's own keys: a `connect_query` becomes the cluster's when
/// the cluster serves only `*` (PgBouncer runs it for the databases `*`
/// makes); a forced login has no Fulcrum equivalent for any database.
pub(super) fn wildcard(star: &Db, named: usize, notes: &mut Vec<String>) -> Option<String> {
    if star.user.is_some() || star.password.is_some() {
        notes.push("[databases] *: user=/password= not carried over: Fulcrum forces a server login per listed database ([[cluster.database]] server_user), not for any database".into());
    }
    match &star.connect_query {
        Some(q) if named == 0 => Some(q.clone()),
        Some(_) => {
            notes.push("[databases] *: connect_query= not carried over: the cluster also serves named databases, which would run it too; set connect_query on their [[cluster.database]] entries".into());
            None
        }
        None => None,
    }
}

/// Writes `dbs` as `[[cluster.database]]` tables. `password_of` is the
/// auth file's password for a user (PgBouncer's source when `password=`
/// is not given).
pub(super) fn write(
    out: &mut String,
    dbs: &[Db],
    password_of: impl Fn(&str) -> Option<String>,
    notes: &mut Vec<String>,
) {
    for (i, db) in dbs.iter().enumerate() {
        // Aliases of one server database with the same user= (or none)
        // share pools in Fulcrum: the first one's password and
        // connect_query go for all of them.
        let first = dbs[..i]
            .iter()
            .find(|o| o.server == db.server && o.user == db.user);
        let db_keys = match first {
            Some(f) if f.shared() != db.shared() => {
                notes.push(format!("[databases] {}: same server database and user= as {} with another password=/connect_query=; such aliases share pools in Fulcrum: took {}'s", db.alias, f.alias, f.alias));
                f
            }
            _ => db,
        };
        let _ = writeln!(out, "\n[[cluster.database]]\nname = {}", quote(&db.alias));
        if db.server != db.alias {
            let _ = writeln!(out, "server_database = {}", quote(&db.server));
        }
        if let Some(user) = &db_keys.user {
            let _ = writeln!(out, "server_user = {}", quote(user));
            let password = db_keys.password.clone().or_else(|| password_of(user));
            match password {
                Some(p) if !super::pgbouncer::is_hash(&p) => {
                    let _ = writeln!(out, "server_password = {}", quote(&p));
                }
                _ => notes.push(format!("[databases] {}: user={user}: no clear-text password (password= or the auth file); add server_password to its [[cluster.database]]", db.alias)),
            }
        } else if db_keys.password.is_some() {
            notes.push(format!(
                "[databases] {}: password= without user= not carried over",
                db.alias
            ));
        }
        if let Some(q) = &db_keys.connect_query {
            let _ = writeln!(out, "connect_query = {}", quote(q));
        }
    }
}

fn quote(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

#[cfg(test)]
mod tests {
    use super::super::ini::Ini;
    use super::super::pgbouncer::import;

    fn users() -> Vec<(String, String)> {
        vec![
            ("app".into(), "secret".into()),
            ("owner".into(), "owner-secret".into()),
            (
                "hashed".into(),
                "md5d41d8cd98f00b204e9800998ecf8427e".into(),
            ),
        ]
    }

    #[test]
    fn a_forced_login_and_connect_query_become_the_database_s_keys() {
        let ini = Ini::parse(
            "[databases]\n\
             shop = host=10.0.0.1 user=owner connect_query='SET search_path = shop, public'\n\
             pay = host=10.0.0.1 user=payer password=it's-me\n\
             old = host=10.0.0.1 user=hashed\n\
             plain = host=10.0.0.1\n\
             [pgbouncer]\nlisten_port = 6432\n",
        );
        let r = super::super::pgbouncer::import(&ini, &users(), "p.ini").unwrap();
        let t = &r.toml;
        assert!(
            t.contains(
                "name = \"shop\"\nserver_user = \"owner\"\nserver_password = \"owner-secret\"\nconnect_query = \"SET search_path = shop, public\"\n"
            ),
            "{t}"
        );
        assert!(
            t.contains("name = \"pay\"\nserver_user = \"payer\"\nserver_password = \"it's-me\"\n"),
            "{t}"
        );
        assert!(
            t.contains("name = \"old\"\nserver_user = \"hashed\"\n\n"),
            "{t}"
        );
        let notes = r.notes.join("\n");
        assert!(
            notes.contains("[databases] old: user=hashed: no clear-text password"),
            "{notes}"
        );
        assert!(!notes.contains("is per user in Fulcrum"), "{notes}");
        assert!(
            !notes.contains("connect_query="),
            "carried, not noted: {notes}"
        );
        // What it wrote is a config Fulcrum takes, with those values.
        let config = fulcrum_config::parse(t, std::path::Path::new("f.toml")).expect("valid");
        let c = &config.clusters[0];
        assert_eq!(c.forced_login_of("shop").unwrap().user, "owner");
        let cq = c.connect_query(Some("shop"), "owner");
        assert_eq!(cq, Some("SET search_path = shop, public"));
        assert_eq!(c.connect_query(Some("plain"), "app"), None);
    }

    #[test]
    fn the_wildcard_s_connect_query_is_the_cluster_s_when_it_is_alone() {
        let ini = Ini::parse(
            "[databases]\n* = host=10.0.0.1 connect_query='SELECT 1' user=owner\n[pgbouncer]\n",
        );
        let r = import(&ini, &users(), "p.ini").unwrap();
        assert!(
            r.toml.contains("connect_query = \"SELECT 1\"\n"),
            "{}",
            r.toml
        );
        let notes = r.notes.join("\n");
        assert!(
            notes.contains("[databases] *: user=/password= not carried over"),
            "{notes}"
        );
        let config = fulcrum_config::parse(&r.toml, std::path::Path::new("f.toml")).expect("valid");
        let cq = config.clusters[0].connect_query(Some("any"), "app");
        assert_eq!(cq, Some("SELECT 1"));
    }

    #[test]
    fn aliases_sharing_a_pool_get_the_first_one_s_connect_query() {
        let ini = Ini::parse(
            "[databases]\na = host=h dbname=d user=owner connect_query='SELECT 1'\n\
             b = host=h dbname=d user=owner connect_query='SELECT 2'\n\
             c = host=h dbname=d user=app connect_query='SELECT 3'\n[pgbouncer]\n",
        );
        let r = import(&ini, &users(), "p.ini").unwrap();
        let t = &r.toml;
        assert_eq!(t.matches("connect_query = \"SELECT 1\"").count(), 2, "{t}");
        assert_eq!(
            t.matches("connect_query = \"SELECT 3\"").count(),
            1,
            "another login: its own"
        );
        let notes = r.notes.join("\n");
        assert!(
            notes.contains("[databases] b: same server database and user= as a"),
            "{notes}"
        );
        assert!(!notes.contains("[databases] c:"), "{notes}");
        fulcrum_config::parse(t, std::path::Path::new("f.toml")).expect("valid");
    }
}
