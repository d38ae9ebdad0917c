//! "Did you mean": an unknown key's message names the key meant when it is
//! PgBouncer's name for one of ours (`default_pool_size` -> `pool_size`) or
//! a near miss (`pool_sise`), instead of listing every key of the table.
//! Pure: it rewrites serde's "unknown field `x`, expected one of `a`, `b`".

/// PgBouncer's keys and the Fulcrum key that does the same (where the name
/// differs; keys of the same name need no hint).
const PGBOUNCER: &[(&str, &str)] = &[
    ("default_pool_size", "pool_size"),
    ("max_client_conn", "max_client_connections"),
    ("query_wait_timeout", "pool_timeout"),
    ("auth_type", "client_auth"),
    ("listen_addr", "listen"),
    ("listen_port", "listen"),
    ("admin_users", "admin_user"),
    ("auth_file", "user"),
    ("auth_dbname", "auth_database"),
    ("client_tls_sslmode", "tls_mode"),
    ("client_tls_cert_file", "tls_certificate"),
    ("client_tls_key_file", "tls_private_key"),
    ("client_tls_ca_file", "tls_client_ca"),
    ("client_tls_protocols", "tls_min_version"),
    ("server_tls_sslmode", "server_tls"),
    ("server_tls_ca_file", "server_tls_ca"),
    ("server_tls_cert_file", "server_tls_certificate"),
    ("server_tls_key_file", "server_tls_private_key"),
    ("logfile", "log"),
    ("verbose", "log"),
    ("max_db_client_connections", "max_client_connections"),
];

/// The message for serde's unknown-field `message`, with a hint when one
/// fits; otherwise the message itself, its "field" said "key".
pub fn unknown_key(message: &str) -> String {
    let plain = message.replacen("unknown field", "unknown key", 1);
    let Some((key, expected)) = parse(message) else {
        return plain;
    };
    if let Some((_, ours)) = PGBOUNCER
        .iter()
        .find(|(theirs, ours)| *theirs == key && expected.contains(ours))
    {
        return format!("unknown key `{key}` (PgBouncer's name): did you mean `{ours}`?");
    }
    let nearest = expected
        .iter()
        .map(|e| (distance(key, e), *e))
        .min_by_key(|(d, _)| *d);
    match nearest {
        Some((d, e)) if d <= 2.max(key.len() / 4) && d < key.len() => {
            format!("unknown key `{key}`: did you mean `{e}`?")
        }
        _ => plain,
    }
}

/// The unknown key and the expected ones of serde's message.
fn parse(message: &str) -> Option<(&str, Vec<&str>)> {
    let rest = message.strip_prefix("unknown field `")?;
    let (key, rest) = rest.split_once('`')?;
    let list = rest
        .strip_prefix(", expected one of ")
        .or_else(|| rest.strip_prefix(", expected "))?;
    let expected = list
        .split(", ")
        .map(|e| e.trim_matches('`'))
        .filter(|e| !e.is_empty())
        .collect();
    Some((key, expected))
}

/// Levenshtein distance (keys are short).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: &str = ", expected one of `name`, `listen`, `pool_size`, `pool_mode`, `max_client_connections`, `pool_timeout`";

    #[test]
    fn pgbouncer_names_and_near_misses_get_a_hint() {
        assert_eq!(
            unknown_key(&format!("unknown field `default_pool_size`{KEYS}")),
            "unknown key `default_pool_size` (PgBouncer's name): did you mean `pool_size`?"
        );
        assert_eq!(
            unknown_key(&format!("unknown field `max_client_conn`{KEYS}")),
            "unknown key `max_client_conn` (PgBouncer's name): did you mean `max_client_connections`?"
        );
        assert_eq!(
            unknown_key(&format!("unknown field `pool_sise`{KEYS}")),
            "unknown key `pool_sise`: did you mean `pool_size`?"
        );
        // Nothing near: the list, as before.
        let far = unknown_key(&format!("unknown field `colour`{KEYS}"));
        assert!(
            far.starts_with("unknown key `colour`, expected one of `name`"),
            "{far}"
        );
        // Not an unknown-field message: unchanged.
        assert_eq!(unknown_key("invalid type: string"), "invalid type: string");
    }

    #[test]
    fn distance_counts_edits() {
        assert_eq!(distance("pool_sise", "pool_size"), 1);
        assert_eq!(distance("admn", "admin"), 1);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}
