//! PgBouncer's config files as PgBouncer reads them: the ini file
//! (`[section]`, `key = value`, `;` and `#` comments, `%include` lines
//! recorded with their line numbers but not followed) and the auth file (`"user" "password"` per line, `""` for a
//! quote inside). Pure, tested with PgBouncer's own examples.

use std::collections::BTreeMap;

/// One ini file: section name (lowercase) to its keys in file order.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Ini {
    pub sections: BTreeMap<String, Vec<(String, String)>>,
    /// Each `%include` line: (1-based line number, the file it names).
    pub includes: Vec<(usize, String)>,
}

impl Ini {
    pub fn parse(text: &str) -> Ini {
        let mut ini = Ini::default();
        let mut section = String::new();
        for (number, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
                continue;
            }
            if let Some(file) = line.strip_prefix("%include") {
                ini.includes.push((number + 1, file.trim().to_owned()));
                continue;
            }
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.trim().to_ascii_lowercase();
                ini.sections.entry(section.clone()).or_default();
                continue;
            }
            if let Some((k, v)) = line.split_once('=') {
                ini.sections
                    .entry(section.clone())
                    .or_default()
                    .push((k.trim().to_owned(), v.trim().to_owned()));
            }
        }
        ini
    }

    /// The keys of `section`, in file order.
    pub fn section(&self, name: &str) -> &[(String, String)] {
        self.sections.get(name).map_or(&[], Vec::as_slice)
    }

    /// The last value of `key` in `[pgbouncer]`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.section("pgbouncer")
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// A `[databases]` entry's connection string: `key=value` pairs, values
/// optionally in single quotes (`connect_query='SELECT 1'`).
pub fn conn_params(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once('=') else {
            break;
        };
        let key = key.trim().to_owned();
        let after = after.trim_start();
        let (value, next) = if let Some(quoted) = after.strip_prefix('\'') {
            match quoted.find('\'') {
                Some(end) => (quoted[..end].to_owned(), &quoted[end + 1..]),
                None => (quoted.to_owned(), ""),
            }
        } else {
            match after.find(char::is_whitespace) {
                Some(end) => (after[..end].to_owned(), &after[end..]),
                None => (after.to_owned(), ""),
            }
        };
        out.push((key, value));
        rest = next.trim_start();
    }
    out
}

/// The auth file: (user, password or stored hash) per line.
pub fn userlist(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut fields = Vec::new();
        let mut chars = line.trim().chars().peekable();
        while let Some(c) = chars.next() {
            if c != '"' {
                continue;
            }
            let mut field = String::new();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    Some('"') | None => break,
                    Some(c) => field.push(c),
                }
            }
            fields.push(field);
        }
        if let [user, password, ..] = fields.as_slice() {
            out.push((user.clone(), password.clone()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sections_keys_and_skips_comments() {
        let ini = Ini::parse(
            "[databases]\n;foodb =\nbardb = host=localhost dbname=bazdb\n[PgBouncer]\n# c\nlisten_port = 6432\nlisten_port = 7000\n",
        );
        assert_eq!(
            ini.section("databases"),
            &[("bardb".into(), "host=localhost dbname=bazdb".into())]
        );
        assert_eq!(ini.get("listen_port"), Some("7000"), "the last one wins");
        assert_eq!(ini.get("nothing"), None);
        assert!(ini.includes.is_empty());
    }

    #[test]
    fn include_lines_are_recorded_with_their_numbers() {
        let ini = Ini::parse("[pgbouncer]\n%include /etc/pgbouncer/a=b.ini\nlisten_port = 1\n");
        assert_eq!(ini.includes, vec![(2, "/etc/pgbouncer/a=b.ini".to_owned())]);
        assert_eq!(ini.get("listen_port"), Some("1"));
        assert_eq!(ini.section("pgbouncer").len(), 1, "not read as a key");
    }

    #[test]
    fn reads_connection_strings_with_quotes() {
        assert_eq!(
            conn_params("host=localhost port=300 user=baz connect_query='SELECT 1' dbname=x"),
            vec![
                ("host".into(), "localhost".into()),
                ("port".into(), "300".into()),
                ("user".into(), "baz".into()),
                ("connect_query".into(), "SELECT 1".into()),
                ("dbname".into(), "x".into()),
            ]
        );
        assert!(conn_params("").is_empty());
    }

    #[test]
    fn reads_the_auth_file() {
        let users = userlist("\"marko\" \"asdasd\"\n\"o\"\"k\" \"md5abc\" \"x\"\n\nbad line\n");
        assert_eq!(
            users,
            vec![
                ("marko".into(), "asdasd".into()),
                ("o\"k".into(), "md5abc".into())
            ]
        );
    }
}
