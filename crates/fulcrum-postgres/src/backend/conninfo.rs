//! Rewriting a libpq connection string (`primary_conninfo`) to point at
//! another server: `host` and `port` replaced, everything else (user,
//! passfile, application_name, sslmode, ...) kept. Pure.

/// Splits `key=value key='quoted \' value'` into pairs (unquoted values).
pub fn parse_conninfo(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        if key.is_empty() {
            return out;
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek() != Some(&'=') {
            return out;
        }
        chars.next();
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => {
                        if let Some(n) = chars.next() {
                            value.push(n);
                        }
                    }
                    '\'' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        out.push((key, value));
    }
}

/// Quotes a value for a conninfo string.
fn quote(v: &str) -> String {
    format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// `conninfo` with host and port taken from `address` (`host:port`,
/// `[v6]:port` or `/socket/dir:port`).
pub fn repoint_conninfo(conninfo: &str, address: &str) -> String {
    let (host, port) = match address.rsplit_once(':') {
        Some((h, p)) => (h.trim_start_matches('[').trim_end_matches(']'), p),
        None => (address, "5432"),
    };
    let mut pairs: Vec<(String, String)> = parse_conninfo(conninfo)
        .into_iter()
        .filter(|(k, _)| k != "host" && k != "port" && k != "hostaddr")
        .collect();
    pairs.push(("host".into(), host.into()));
    pairs.push(("port".into(), port.into()));
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", quote(v)))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port_are_replaced_and_the_rest_kept() {
        let before = "user=postgres passfile='/root/.pgpass' channel_binding=prefer host=127.0.0.1 port=40001 sslmode=prefer application_name='replica 1'";
        let after = repoint_conninfo(before, "127.0.0.1:40003");
        let pairs = parse_conninfo(&after);
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("host"), Some("127.0.0.1"));
        assert_eq!(get("port"), Some("40003"));
        assert_eq!(get("user"), Some("postgres"));
        assert_eq!(get("application_name"), Some("replica 1"));
        assert_eq!(get("passfile"), Some("/root/.pgpass"));
        assert_eq!(pairs.iter().filter(|(k, _)| k == "host").count(), 1);
    }

    #[test]
    fn quotes_and_backslashes_survive_a_round_trip() {
        let pairs = parse_conninfo(r"password='it\'s a \\ secret' dbname = x");
        assert_eq!(pairs[0], ("password".into(), r"it's a \ secret".into()));
        assert_eq!(pairs[1], ("dbname".into(), "x".into()));
        let again = repoint_conninfo(r"password='it\'s'", "/tmp/sock:5433");
        assert_eq!(again, r"password='it\'s' host='/tmp/sock' port='5433'");
        assert!(parse_conninfo("").is_empty());
        assert!(parse_conninfo("novalue").is_empty());
    }
}
