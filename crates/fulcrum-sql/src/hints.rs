//! Routing hints written in comments: `/* fulcrum:primary */` and
//! `/* fulcrum:replica */`, anywhere in the statement.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hint {
    Primary,
    Replica,
}

/// The hint in a comment of `sql`, if any; `primary` wins when both appear.
/// Text inside string literals is not a hint.
pub fn hint(sql: &str) -> Option<Hint> {
    let at = sql.find("fulcrum:")?;
    let mut found = None;
    for comment in comments(sql, at) {
        if comment.contains("fulcrum:primary") {
            return Some(Hint::Primary);
        }
        if comment.contains("fulcrum:replica") {
            found = Some(Hint::Replica);
        }
    }
    found
}

/// `/* fulcrum:nocache */` in a comment of `sql`: the result cache neither
/// answers nor keeps this statement.
pub fn no_cache(sql: &str) -> bool {
    sql.find("fulcrum:nocache").is_some_and(|at| {
        comments(sql, at)
            .iter()
            .any(|c| c.contains("fulcrum:nocache"))
    })
}

/// The comments of `sql` that end after byte `from` (a cheap lexer that
/// skips quoted strings and identifiers).
fn comments(sql: &str, from: usize) -> Vec<&str> {
    let b = sql.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            q @ (b'\'' | b'"' | b'`') => {
                i += 1;
                while i < b.len() && b[i] != q {
                    if b[i] == b'\\' && q != b'"' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                let end = sql[i..].find('\n').map_or(b.len(), |p| i + p);
                if end > from {
                    out.push(&sql[i..end]);
                }
                i = end;
            }
            b'#' => {
                let end = sql[i..].find('\n').map_or(b.len(), |p| i + p);
                if end > from {
                    out.push(&sql[i..end]);
                }
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let end = sql[i + 2..].find("*/").map_or(b.len(), |p| i + 2 + p + 2);
                if end > from {
                    out.push(&sql[i..end.min(b.len())]);
                }
                i = end;
            }
            _ => i += 1,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_hints_anywhere() {
        assert_eq!(hint("/* fulcrum:primary */ SELECT 1"), Some(Hint::Primary));
        assert_eq!(hint("SELECT 1 /* fulcrum:replica */"), Some(Hint::Replica));
        assert_eq!(
            hint("SELECT 1 -- fulcrum:replica fulcrum:primary"),
            Some(Hint::Primary)
        );
        assert_eq!(hint("SELECT 'fulcrum:' /* none */"), None);
        assert_eq!(
            hint("SELECT * FROM t WHERE f = 'fulcrum:replica' FOR UPDATE"),
            None
        );
        assert_eq!(hint("SELECT 'x' # fulcrum:replica"), Some(Hint::Replica));
        assert_eq!(hint("SELECT 1"), None);
    }

    #[test]
    fn the_no_cache_hint_is_a_comment() {
        assert!(no_cache("SELECT v FROM t /* fulcrum:nocache */"));
        assert!(no_cache("-- fulcrum:nocache\nSELECT v FROM t"));
        assert!(!no_cache("SELECT 'fulcrum:nocache' FROM t"));
        assert!(!no_cache("SELECT v FROM t"));
    }
}
