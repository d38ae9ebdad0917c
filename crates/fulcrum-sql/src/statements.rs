//! Statement boundaries and first words: the small lexer the classifier and
//! the front ends share (quotes, dollar quotes and nested comments skipped),
//! so no caller keeps a second one. Pure over the text.

/// The first word of a statement (comments and white space skipped), as bytes.
/// Read once per Query (PostgreSQL) and per COM_QUERY (MySQL): each step
/// looks at a byte through `get`, so no slice is bounds-checked twice, and
/// the word's bytes are told by the fingerprint's table.
pub fn first_word(text: &[u8]) -> &[u8] {
    let mut i = 0;
    loop {
        while text.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        match (text.get(i), text.get(i + 1)) {
            (Some(b'-'), Some(b'-')) => {
                i += 2;
                while text.get(i).is_some_and(|&c| c != b'\n') {
                    i += 1;
                }
            }
            (Some(b'/'), Some(b'*')) => match text[i + 2..].windows(2).position(|w| w == b"*/") {
                Some(p) => i += p + 4,
                None => return &[],
            },
            _ => break,
        }
    }
    let rest = &text[i..];
    let n = rest
        .iter()
        .take_while(|&&c| crate::fingerprint::LOWER_WORD[c as usize] != 0)
        .count();
    &rest[..n]
}

pub fn skip_space_and_comments(mut t: &str) -> &str {
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
    match crate::fingerprint::block_comment_end(t.as_bytes(), 0) {
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
pub(crate) fn head_words(stmt: &str, n: usize) -> Vec<String> {
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
            // One character, however many bytes it takes.
            t.chars().next().map_or(1, char::len_utf8)
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

/// True when `text` holds exactly one statement (a trailing `;` allowed).
pub fn is_single_statement(text: &str) -> bool {
    split_statements(text).len() == 1
}

/// Whether a statement text may commit a transaction if it runs: it
/// mentions COMMIT anywhere (COMMIT, COMMIT PREPARED, `...; COMMIT`) or
/// starts with END. A false positive only makes a lost connection's error
/// say "may have committed" (08007) instead of "not committed".
pub fn may_commit(text: &[u8]) -> bool {
    let start = text
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(text.len());
    let first = &text[start..];
    let word_end = first
        .iter()
        .position(|b| !b.is_ascii_alphanumeric() && *b != b'_')
        .unwrap_or(first.len());
    first[..word_end].eq_ignore_ascii_case(b"end")
        || text.windows(6).any(|w| w.eq_ignore_ascii_case(b"commit"))
}

/// True when `text` is one plain `COMMIT` or `END` (optionally `WORK` or
/// `TRANSACTION`, trailing semicolons and whitespace): the statement whose
/// outcome a new primary can be asked about (`pg_xact_status`) when its
/// server dies with it in flight. `COMMIT AND CHAIN`, `COMMIT PREPARED`,
/// comments and anything stacked with it are not plain.
pub fn is_plain_commit(text: &[u8]) -> bool {
    let mut words = text
        .split(|b| b.is_ascii_whitespace() || *b == b';')
        .filter(|w| !w.is_empty());
    let first = words.next().unwrap_or_default();
    if !(first.eq_ignore_ascii_case(b"commit") || first.eq_ignore_ascii_case(b"end")) {
        return false;
    }
    let rest: Vec<&[u8]> = words.collect();
    let plain = match rest.as_slice() {
        [] => true,
        [w] => w.eq_ignore_ascii_case(b"work") || w.eq_ignore_ascii_case(b"transaction"),
        _ => false,
    };
    // Semicolons only at the end: `COMMIT; COMMIT` is two statements.
    let body_end = text
        .iter()
        .rposition(|b| !b.is_ascii_whitespace() && *b != b';')
        .map_or(0, |i| i + 1);
    plain && !text[..body_end].contains(&b';')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_commit_is_one_commit_or_end_alone() {
        for yes in [
            &b"COMMIT"[..],
            b"commit;",
            b"  END ;\n",
            b"end",
            b"COMMIT WORK",
            b"commit transaction;;",
        ] {
            assert!(is_plain_commit(yes), "{}", String::from_utf8_lossy(yes));
        }
        for no in [
            &b"COMMIT AND CHAIN"[..],
            b"COMMIT PREPARED 'x'",
            b"COMMIT; COMMIT",
            b"UPDATE t SET a = 1; COMMIT",
            b"/* c */ COMMIT",
            b"ROLLBACK",
            b"",
            b"ENDX",
        ] {
            assert!(!is_plain_commit(no), "{}", String::from_utf8_lossy(no));
        }
    }

    #[test]
    fn first_word_skips_comments() {
        assert_eq!(first_word(b"  /* x */ -- y\n BEGIN;"), b"BEGIN");
        assert_eq!(first_word(b"select 1"), b"select");
        assert_eq!(first_word(b"/* open"), b"");
        assert_eq!(first_word(b""), b"");
    }

    /// `first_word` as it was before it read through `get`: the same
    /// answer for every text.
    fn first_word_by_slices(text: &[u8]) -> &[u8] {
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

    #[test]
    fn first_word_reads_as_before() {
        let texts: [&[u8]; 22] = [
            b"SELECT abalance FROM pgbench_accounts WHERE aid = 1;",
            b"  /* x */ -- y\n BEGIN;",
            b"--",
            b"-- only a comment",
            b"-- c\n",
            b"-- c\n-- d\nset x = 1",
            b"-",
            b"-x",
            b"/",
            b"/*",
            b"/*/",
            b"/**/",
            b"/**/x",
            b"/* a */ /* b */ _under_score9(",
            b"\t\r\n\x0cshow all",
            b"\xc3\xa9t\xc3\xa9",
            b"x",
            b"1abc def",
            b"(select 1)",
            b" ",
            b"COMMIT",
            b"BEGIN\xff",
        ];
        for t in texts {
            assert_eq!(
                first_word(t),
                first_word_by_slices(t),
                "{}",
                String::from_utf8_lossy(t)
            );
        }
    }

    #[test]
    fn statements_split_outside_quotes_comments_and_dollar_quotes() {
        assert_eq!(
            split_statements("select 'a'';b'; select E'\\';x'; -- ;\n select 1").len(),
            3
        );
        assert_eq!(split_statements("select /* ; /* ; */ ; */ 1").len(), 1);
        assert_eq!(split_statements("select $tag$ ; $tag$; select $1").len(), 2);
        assert_eq!(
            split_statements("BEGIN; SET a.b = 'x;y'; COMMIT;"),
            vec!["BEGIN", " SET a.b = 'x;y'", " COMMIT"]
        );
        assert!(is_single_statement("select 1;  "));
        assert!(!is_single_statement("select 1; select 2"));
        assert!(split_statements(" ; -- nothing\n").is_empty());
    }

    #[test]
    fn head_words_fold_unquoted_names_only() {
        assert_eq!(
            head_words("SET \"MyApp.Tenant\" = 'x'", 3),
            vec!["set", "MyApp.Tenant", "="]
        );
        assert_eq!(
            head_words("/* c */ Reset  Work_Mem", 5),
            vec!["reset", "work_mem"]
        );
    }

    #[test]
    fn head_words_step_over_multibyte_characters() {
        // Found by fuzz/classify: a word starting with a character of more
        // than one byte was cut inside it (a panic on the char boundary).
        assert_eq!(
            head_words("INSERT INTO t\u{a7e}\u{fffd}UES ($1)", 6),
            vec!["insert", "into", "t", "\u{a7e}", "\u{fffd}", "ues"]
        );
        assert_eq!(head_words("é", 2), vec!["é"]);
    }
}
