//! Startup parameters a client sends in its StartupMessage: the `options`
//! parameter's `-c name=value` list parsed as libpq writes it, and the
//! statement that replays a parameter on a pooled server connection.

/// The statement that replays a startup parameter (list values such as
/// search_path are parsed the way the startup packet parses them).
pub fn startup_param_stmt(name: &str, value: &str) -> String {
    format!(
        "SELECT pg_catalog.set_config({}, {}, false)",
        quote_literal(name),
        quote_literal(value)
    )
}

fn quote_literal(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    if s.contains('\\') {
        q.push('E');
    }
    q.push('\'');
    for c in s.chars() {
        match c {
            '\'' => q.push_str("''"),
            '\\' => q.push_str("\\\\"),
            c => q.push(c),
        }
    }
    q.push('\'');
    q
}

/// Parses the `options` startup parameter (`-c name=value`, `--name=value`).
pub fn parse_options(options: &str) -> Vec<(String, String)> {
    let mut tokens = Vec::new();
    let mut cur = String::new();
    let mut chars = options.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            c if c.is_whitespace() => {
                if !cur.is_empty() {
                    tokens.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        tokens.push(cur);
    }
    let mut out = Vec::new();
    let mut it = tokens.into_iter();
    while let Some(t) = it.next() {
        let kv = if t == "-c" {
            it.next()
        } else {
            t.strip_prefix("--")
                .or_else(|| t.strip_prefix("-c"))
                .map(str::to_owned)
        };
        if let Some((k, v)) = kv.as_deref().and_then(|kv| kv.split_once('=')) {
            out.push((k.replace('-', "_"), v.to_owned()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn startup_values_are_quoted() {
        assert_eq!(
            startup_param_stmt("search_path", "a, b"),
            "SELECT pg_catalog.set_config('search_path', 'a, b', false)"
        );
        assert_eq!(
            startup_param_stmt("x", "it's"),
            "SELECT pg_catalog.set_config('x', 'it''s', false)"
        );
        assert!(startup_param_stmt("x", "a\\b").contains("E'a\\\\b'"));
    }

    #[test]
    fn options_parameter() {
        assert_eq!(
            parse_options("-c search_path=app -c statement-timeout=5s --work_mem=4MB -c a=b\\ c"),
            vec![
                ("search_path".into(), "app".into()),
                ("statement_timeout".into(), "5s".into()),
                ("work_mem".into(), "4MB".into()),
                ("a".into(), "b c".into()),
            ]
        );
    }
}
