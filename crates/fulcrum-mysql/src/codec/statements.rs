//! Where a COM_QUERY text's second statement starts, read as the server
//! reads it: `;` separates statements outside quotes (`'`, `"`, backquotes,
//! with backslash escapes and doubled quotes) and comments (`-- `, `#`,
//! `/* */`). A client that did not enable CLIENT_MULTI_STATEMENTS gets the
//! server's syntax error for a text with a second statement; one trailing
//! `;` (and white space or comments after it) is still one statement. Pure.

/// The byte offset of the second statement of `text`, if it has one.
pub fn second_statement(text: &[u8]) -> Option<usize> {
    if !text.contains(&b';') {
        return None;
    }
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            q @ (b'\'' | b'"' | b'`') => i = skip_quoted(text, i, q),
            b'#' => i = skip_line(text, i),
            b'-' if text.get(i + 1) == Some(&b'-')
                && text
                    .get(i + 2)
                    .is_none_or(|c| c.is_ascii_whitespace() || c.is_ascii_control()) =>
            {
                i = skip_line(text, i)
            }
            b'/' if text.get(i + 1) == Some(&b'*') => {
                i = text[i + 2..]
                    .windows(2)
                    .position(|w| w == b"*/")
                    .map_or(text.len(), |p| i + 2 + p + 2);
            }
            b';' => {
                let rest = i + 1;
                return (!blank(&text[rest..])).then(|| rest + leading_space(&text[rest..]));
            }
            _ => i += 1,
        }
    }
    None
}

/// What the server's syntax error (1064) shows "near": the rest of the text
/// from `at`, at most 80 characters, and the line it starts on.
pub fn syntax_error_near(text: &[u8], at: usize) -> (String, usize) {
    let rest = String::from_utf8_lossy(&text[at..]);
    let near: String = rest.chars().take(80).collect();
    let line = 1 + text[..at].iter().filter(|&&b| b == b'\n').count();
    (near, line)
}

fn skip_quoted(text: &[u8], start: usize, quote: u8) -> usize {
    let mut i = start + 1;
    while i < text.len() {
        match text[i] {
            b'\\' if quote != b'`' => i += 2,
            c if c == quote => {
                if text.get(i + 1) == Some(&quote) {
                    i += 2;
                } else {
                    return i + 1;
                }
            }
            _ => i += 1,
        }
    }
    text.len()
}

fn skip_line(text: &[u8], start: usize) -> usize {
    text[start..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(text.len(), |p| start + p + 1)
}

fn leading_space(text: &[u8]) -> usize {
    text.iter().take_while(|b| b.is_ascii_whitespace()).count()
}

/// Only white space, `;` and comments.
fn blank(text: &[u8]) -> bool {
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            c if c.is_ascii_whitespace() || c == b';' => i += 1,
            b'#' => i = skip_line(text, i),
            b'-' if text.get(i + 1) == Some(&b'-') => i = skip_line(text, i),
            b'/' if text.get(i + 1) == Some(&b'*') && text.get(i + 2) != Some(&b'!') => {
                match text[i + 2..].windows(2).position(|w| w == b"*/") {
                    Some(p) => i += 2 + p + 2,
                    None => return true,
                }
            }
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_statement_with_or_without_a_trailing_semicolon() {
        for sql in [
            "SELECT 1",
            "SELECT 1;",
            "SELECT 1; ",
            "SELECT 1;\n-- done\n",
            "SELECT 1; /* done */",
            "SELECT ';'",
            "SELECT \"a;b\"",
            "SELECT `we;ird` FROM t",
            "SELECT 'it''s; fine'",
            "SELECT 'a\\'; b'",
            "SELECT 1 -- x; y\n",
            "SELECT 1 # x; y",
            "SELECT /* ; */ 1",
        ] {
            assert_eq!(second_statement(sql.as_bytes()), None, "{sql}");
        }
    }

    #[test]
    fn a_second_statement_is_found_where_it_starts() {
        let cases = [
            ("SELECT 1; SELECT 2", 10),
            ("SELECT 1;SELECT 2", 9),
            ("SELECT ';'; DROP TABLE t", 12),
            ("SELECT 1;\n\nSELECT 2", 11),
            ("SELECT 1; /*!50000 SELECT 2 */", 10),
        ];
        for (sql, at) in cases {
            assert_eq!(second_statement(sql.as_bytes()), Some(at), "{sql}");
        }
        // "--" without a space after it is not a comment in MySQL.
        assert_eq!(second_statement(b"SELECT 1--1; SELECT 2"), Some(13));
    }

    #[test]
    fn the_error_shows_what_the_server_shows() {
        let sql = b"SELECT 1;\nSELECT 2";
        let at = second_statement(sql).unwrap();
        assert_eq!(syntax_error_near(sql, at), ("SELECT 2".to_string(), 2));
        let long = format!("SELECT 1; SELECT '{}'", "x".repeat(200));
        let (near, line) = syntax_error_near(long.as_bytes(), 10);
        assert_eq!((near.chars().count(), line), (80, 1));
    }
}
