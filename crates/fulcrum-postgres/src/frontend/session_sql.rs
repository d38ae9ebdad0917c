//! A small lexer for the statements that change session state, so transaction
//! pooling can replay or pin them: SET/RESET/DISCARD ALL (replayed),
//! DEALLOCATE (answered for mapped statements) and the ones that pin a client
//! to its server connection (SQL PREPARE, LISTEN, temporary tables, session
//! advisory locks, WITH HOLD cursors, SET ROLE / SESSION AUTHORIZATION).
//! Pure over the query text. The SQL classifier replaces the detection part
//! later; the replay rules stay.

/// What one statement does to the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionOp {
    /// `SET [SESSION] key ...`: replay `stmt` on every server connection used.
    Set {
        key: String,
        stmt: String,
    },
    /// `RESET key`.
    Reset {
        key: String,
    },
    /// `RESET ALL`.
    ResetAll,
    /// `DISCARD ALL`: resets parameters and drops prepared statements.
    DiscardAll,
    /// `DEALLOCATE [PREPARE] name` (None = ALL).
    Deallocate(Option<String>),
    /// State that cannot be replayed: keep this client on its server connection.
    Pin(&'static str),
    /// Transaction control, so SETs inside a rolled-back block are dropped.
    Begin,
    Commit,
    Rollback,
}

/// Scans a simple-query text (possibly several statements).
pub fn scan(text: &[u8]) -> Vec<SessionOp> {
    let Ok(text) = std::str::from_utf8(text) else {
        return Vec::new();
    };
    // Fast path: one statement (a trailing `;` allowed) whose first word
    // cannot change session state.
    let single = text.trim_end().trim_end_matches(';');
    if !single.contains(';') && !may_touch_session(first_word(single)) && !mentions_lock(single) {
        return Vec::new();
    }
    split_statements(text)
        .into_iter()
        .filter_map(statement_op)
        .collect()
}

fn may_touch_session(word: &str) -> bool {
    [
        "set",
        "reset",
        "discard",
        "deallocate",
        "prepare",
        "listen",
        "create",
        "declare",
    ]
    .iter()
    .any(|w| word.eq_ignore_ascii_case(w))
}

fn mentions_lock(text: &str) -> bool {
    text.len() >= 16 && contains_ci(text, "advisory_lock")
}

fn contains_ci(hay: &str, needle: &str) -> bool {
    hay.as_bytes()
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// The first word of a statement (comments and white space skipped), as bytes.
pub fn first_word_bytes(text: &[u8]) -> &[u8] {
    let mut i = 0;
    loop {
        while i < text.len() && text[i].is_ascii_whitespace() {
            i += 1;
        }
        if text[i..].starts_with(b"--") {
            while i < text.len() && text[i] != b'\n' {
                i += 1;
            }
        } else if text[i..].starts_with(b"/*") {
            match text[i + 2..].windows(2).position(|w| w == b"*/") {
                Some(p) => i += p + 4,
                None => return &[],
            }
        } else {
            break;
        }
    }
    let end = text[i..]
        .iter()
        .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_'))
        .map_or(text.len(), |p| i + p);
    &text[i..end]
}

fn first_word(text: &str) -> &str {
    let t = skip_space_and_comments(text);
    let end = t
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(t.len());
    &t[..end]
}

fn skip_space_and_comments(mut t: &str) -> &str {
    loop {
        t = t.trim_start();
        if let Some(rest) = t.strip_prefix("--") {
            t = rest.find('\n').map_or("", |i| &rest[i + 1..]);
        } else if t.starts_with("/*") {
            t = skip_block_comment(t);
        } else {
            return t;
        }
    }
}

/// `t` starts with "/*"; returns what follows the matching "*/" (comments nest).
fn skip_block_comment(t: &str) -> &str {
    match fulcrum_sql::block_comment_end(t.as_bytes(), 0) {
        Some(end) => &t[end..],
        None => "",
    }
}

/// Splits on `;` outside quotes, comments and dollar-quoted strings.
pub fn split_statements(text: &str) -> Vec<&str> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let (mut start, mut i) = (0usize, 0usize);
    while i < b.len() {
        match b[i] {
            b'\'' => {
                let escapes = i > 0 && (b[i - 1] == b'E' || b[i - 1] == b'e');
                i += 1;
                while i < b.len() {
                    if escapes && b[i] == b'\\' {
                        i += 2;
                        continue;
                    }
                    if b[i] == b'\'' {
                        if i + 1 < b.len() && b[i + 1] == b'\'' {
                            i += 2;
                            continue;
                        }
                        break;
                    }
                    i += 1;
                }
                i += 1;
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += 1;
                }
                i += 1;
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let rest = skip_block_comment(&text[i..]);
                i = text.len() - rest.len();
            }
            b'$' => {
                // $tag$ ... $tag$ where tag is empty or an identifier.
                let tag_end = text[i + 1..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .map(|p| i + 1 + p);
                match tag_end {
                    Some(e)
                        if b[e] == b'$' && !b[i + 1..e].first().is_some_and(u8::is_ascii_digit) =>
                    {
                        let tag = &text[i..=e];
                        match text[e + 1..].find(tag) {
                            Some(p) => i = e + 1 + p + tag.len(),
                            None => i = b.len(),
                        }
                    }
                    _ => i += 1,
                }
            }
            b';' => {
                out.push(&text[start..i]);
                i += 1;
                start = i;
            }
            _ => i += 1,
        }
    }
    if start < b.len() {
        out.push(&text[start..]);
    }
    out.into_iter()
        .filter(|s| !skip_space_and_comments(s).is_empty())
        .collect()
}

/// Words of a statement's head, lowercased, comments skipped (enough to decide).
fn head_words(stmt: &str, n: usize) -> Vec<String> {
    let mut words = Vec::new();
    let mut t = stmt;
    while words.len() < n {
        t = skip_space_and_comments(t);
        if t.is_empty() {
            break;
        }
        let c = t.as_bytes()[0];
        let end = if c == b'"' {
            t[1..].find('"').map_or(t.len(), |p| p + 2)
        } else if c.is_ascii_alphanumeric() || c == b'_' {
            t.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '$'))
                .unwrap_or(t.len())
        } else {
            1
        };
        let w = &t[..end];
        words.push(if w.starts_with('"') {
            w.trim_matches('"').to_owned()
        } else {
            w.to_ascii_lowercase()
        });
        t = &t[end..];
    }
    words
}

fn statement_op(stmt: &str) -> Option<SessionOp> {
    let w = head_words(stmt, 6);
    let word = |i: usize| w.get(i).map(String::as_str).unwrap_or("");
    match word(0) {
        "set" => {
            let mut i = 1;
            if word(1) == "session" {
                match word(2) {
                    "authorization" => return Some(SessionOp::Pin("SET SESSION AUTHORIZATION")),
                    "characteristics" => {
                        return Some(SessionOp::Pin("SET SESSION CHARACTERISTICS"))
                    }
                    _ => i = 2,
                }
            }
            let key = match word(i) {
                "local" | "transaction" | "constraints" | "" => return None,
                "role" => return Some(SessionOp::Pin("SET ROLE")),
                "time" if word(i + 1) == "zone" => "timezone".to_owned(),
                "schema" => "search_path".to_owned(),
                "names" => "client_encoding".to_owned(),
                "xml" if word(i + 1) == "option" => "xmloption".to_owned(),
                k => k.to_owned(),
            };
            Some(SessionOp::Set {
                key,
                stmt: skip_space_and_comments(stmt).trim_end().to_owned(),
            })
        }
        "reset" => match word(1) {
            "all" => Some(SessionOp::ResetAll),
            "role" | "session" => None,
            "" => None,
            "time" if word(2) == "zone" => Some(SessionOp::Reset {
                key: "timezone".into(),
            }),
            k => Some(SessionOp::Reset { key: k.to_owned() }),
        },
        "discard" if word(1) == "all" => Some(SessionOp::DiscardAll),
        "deallocate" => {
            let name = if word(1) == "prepare" {
                word(2)
            } else {
                word(1)
            };
            match name {
                "" => None,
                "all" => Some(SessionOp::Deallocate(None)),
                n => Some(SessionOp::Deallocate(Some(n.to_owned()))),
            }
        }
        "begin" | "start" => Some(SessionOp::Begin),
        "commit" | "end" => Some(SessionOp::Commit),
        "rollback" | "abort" if word(1) != "to" && word(2) != "to" => Some(SessionOp::Rollback),
        "prepare" if word(1) == "transaction" => Some(SessionOp::Rollback),
        "prepare" => Some(SessionOp::Pin("PREPARE")),
        "listen" => Some(SessionOp::Pin("LISTEN")),
        "declare" if contains_ci(stmt, "with hold") => {
            Some(SessionOp::Pin("DECLARE ... WITH HOLD"))
        }
        "create"
            if matches!(word(1), "temp" | "temporary")
                || (matches!(word(1), "local" | "global")
                    && matches!(word(2), "temp" | "temporary")) =>
        {
            Some(SessionOp::Pin("CREATE TEMPORARY"))
        }
        _ if contains_ci(stmt, "pg_advisory_lock") || contains_ci(stmt, "pg_try_advisory_lock") => {
            Some(SessionOp::Pin("session advisory lock"))
        }
        _ => None,
    }
}

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

    fn ops(s: &str) -> Vec<SessionOp> {
        scan(s.as_bytes())
    }

    #[test]
    fn first_word_skips_comments() {
        assert_eq!(first_word_bytes(b"  /* x */ -- y\n BEGIN;"), b"BEGIN");
        assert_eq!(first_word_bytes(b"select 1"), b"select");
        assert_eq!(first_word_bytes(b"/* open"), b"");
        assert_eq!(first_word_bytes(b""), b"");
    }

    #[test]
    fn plain_statements_have_no_ops() {
        assert!(ops("SELECT abalance FROM pgbench_accounts WHERE aid = 1").is_empty());
        assert!(ops("UPDATE t SET a = 1").is_empty());
        assert!(ops("insert into t values ('SET x = 1; RESET ALL')").is_empty());
    }

    #[test]
    fn set_forms() {
        assert_eq!(
            ops("SET search_path TO app, public"),
            vec![SessionOp::Set {
                key: "search_path".into(),
                stmt: "SET search_path TO app, public".into()
            }]
        );
        assert_eq!(
            ops("  /* c */ set SESSION statement_timeout = '5s'"),
            vec![SessionOp::Set {
                key: "statement_timeout".into(),
                stmt: "set SESSION statement_timeout = '5s'".into()
            }]
        );
        assert!(
            matches!(&ops("SET TIME ZONE 'UTC'")[0], SessionOp::Set { key, .. } if key == "timezone")
        );
        assert!(
            matches!(&ops("SET NAMES 'UTF8'")[0], SessionOp::Set { key, .. } if key == "client_encoding")
        );
        assert!(
            matches!(&ops("SET \"MyApp.Tenant\" = 'x'")[0], SessionOp::Set { key, .. } if key == "MyApp.Tenant")
        );
        assert!(
            matches!(&ops("set myapp.tenant = 'x'")[0], SessionOp::Set { key, .. } if key == "myapp.tenant")
        );
    }

    #[test]
    fn transaction_scoped_sets_are_ignored() {
        assert!(ops("SET LOCAL work_mem = '1MB'").is_empty());
        assert!(ops("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE").is_empty());
        assert!(ops("SET CONSTRAINTS ALL DEFERRED").is_empty());
    }

    #[test]
    fn reset_discard_deallocate() {
        assert_eq!(ops("RESET ALL"), vec![SessionOp::ResetAll]);
        assert_eq!(
            ops("reset work_mem"),
            vec![SessionOp::Reset {
                key: "work_mem".into()
            }]
        );
        assert_eq!(ops("DISCARD ALL"), vec![SessionOp::DiscardAll]);
        assert_eq!(
            ops("DEALLOCATE s1"),
            vec![SessionOp::Deallocate(Some("s1".into()))]
        );
        assert_eq!(
            ops("DEALLOCATE PREPARE ALL"),
            vec![SessionOp::Deallocate(None)]
        );
    }

    #[test]
    fn pinning_statements() {
        for s in [
            "PREPARE p AS SELECT 1",
            "LISTEN chan",
            "CREATE TEMP TABLE t (a int)",
            "create local temporary table t (a int)",
            "SELECT pg_advisory_lock(1)",
            "select pg_try_advisory_lock(1)",
            "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
            "SET ROLE other",
            "SET SESSION AUTHORIZATION other",
        ] {
            assert!(matches!(ops(s).as_slice(), [SessionOp::Pin(_)]), "{s}");
        }
        assert!(ops("SELECT pg_advisory_xact_lock(1)").is_empty());
        assert!(ops("CREATE TABLE t (a int)").is_empty());
    }

    #[test]
    fn several_statements_and_quoting() {
        let o = ops("BEGIN; SET a.b = 'x;y'; SELECT $$;SET c.d=1;$$; RESET e.f; COMMIT");
        assert_eq!(
            o,
            vec![
                SessionOp::Begin,
                SessionOp::Set {
                    key: "a.b".into(),
                    stmt: "SET a.b = 'x;y'".into()
                },
                SessionOp::Reset { key: "e.f".into() },
                SessionOp::Commit,
            ]
        );
        assert_eq!(
            split_statements("select 'a'';b'; select E'\\';x'; -- ;\n select 1").len(),
            3
        );
        assert_eq!(split_statements("select /* ; /* ; */ ; */ 1").len(), 1);
        assert_eq!(split_statements("select $tag$ ; $tag$; select $1").len(), 2);
    }

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
