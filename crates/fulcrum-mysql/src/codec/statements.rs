//! Where a COM_QUERY text's second statement starts, read as the server
//! reads it: `;` separates statements outside quotes (`'`, `"`, backquotes,
//! with backslash escapes and doubled quotes) and comments (`-- `, `#`,
//! `/* */`), and not inside the `BEGIN ... END` (and `IF`, `CASE`, `LOOP`,
//! `WHILE`, `REPEAT` ... `END`) blocks of a compound statement: a stored
//! program's body (`CREATE PROCEDURE / FUNCTION / TRIGGER / EVENT`) or
//! MariaDB's compound statements outside one (`BEGIN NOT ATOMIC`, `IF`,
//! ...). A client that did not enable CLIENT_MULTI_STATEMENTS gets the
//! server's syntax error for a text with a second statement; one trailing
//! `;` (and white space or comments after it) is still one statement. Pure.

/// The byte offset of the second statement of `text`, if it has one.
pub fn second_statement(text: &[u8]) -> Option<usize> {
    if !text.contains(&b';') {
        return None;
    }
    // Blocks open in a compound statement (none is ever opened otherwise).
    let compound = is_compound(text);
    let mut depth = 0u32;
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            q @ (b'\'' | b'"' | b'`') => i = skip_quoted(text, i, q),
            c if compound && is_word_start(text, i, c) => {
                (depth, i) = block_depth(text, i, word_end(text, i), depth);
            }
            b';' if depth > 0 => i += 1,
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

/// Whether `text` is a compound statement, whose body's `;` are its own:
/// `CREATE [OR REPLACE] [DEFINER = ...] [AGGREGATE] PROCEDURE | FUNCTION |
/// TRIGGER | EVENT`, or one of MariaDB's compound statements.
fn is_compound(text: &[u8]) -> bool {
    let mut words = Words { text, at: 0 };
    let Some(first) = words.next() else {
        return false;
    };
    match first.to_ascii_uppercase().as_slice() {
        b"BEGIN" => words.next().is_some_and(|w| w.eq_ignore_ascii_case(b"NOT")),
        b"IF" | b"CASE" | b"LOOP" | b"WHILE" | b"REPEAT" => true,
        // A label: `lbl: BEGIN NOT ATOMIC` and the like.
        w if w.ends_with(b":") => true,
        b"CREATE" => {
            // Up to the object type, past OR REPLACE, DEFINER = x, etc.
            for _ in 0..8 {
                match words.next().map(|w| w.to_ascii_uppercase()) {
                    Some(w)
                        if matches!(
                            w.as_slice(),
                            b"PROCEDURE" | b"FUNCTION" | b"TRIGGER" | b"EVENT"
                        ) =>
                    {
                        return true
                    }
                    Some(w) if matches!(w.as_slice(), b"TABLE" | b"VIEW" | b"INDEX") => {
                        return false
                    }
                    Some(_) => {}
                    None => return false,
                }
            }
            false
        }
        _ => false,
    }
}

/// The words of a statement's head (white space and comments between them;
/// a quoted name is one word).
struct Words<'a> {
    text: &'a [u8],
    at: usize,
}

impl<'a> Iterator for Words<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let t = self.text;
        loop {
            while self.at < t.len() && t[self.at].is_ascii_whitespace() {
                self.at += 1;
            }
            match t.get(self.at) {
                Some(b'/') if t.get(self.at + 1) == Some(&b'*') => {
                    self.at = t[self.at + 2..]
                        .windows(2)
                        .position(|w| w == b"*/")
                        .map_or(t.len(), |p| self.at + 2 + p + 2);
                }
                Some(b'#') => self.at = skip_line(t, self.at),
                Some(b'-') if t.get(self.at + 1) == Some(&b'-') => self.at = skip_line(t, self.at),
                Some(&q @ (b'\'' | b'"' | b'`')) => {
                    let start = self.at;
                    self.at = skip_quoted(t, start, q);
                    return Some(&t[start..self.at]);
                }
                Some(_) => {
                    let start = self.at;
                    while self.at < t.len()
                        && !t[self.at].is_ascii_whitespace()
                        && !matches!(t[self.at], b'(' | b';' | b'=')
                    {
                        self.at += 1;
                    }
                    if self.at == start {
                        self.at += 1;
                    }
                    return Some(&t[start..self.at]);
                }
                None => return None,
            }
        }
    }
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80
}

/// Whether a word starts at `i` (an identifier character after a
/// non-identifier one).
fn is_word_start(text: &[u8], i: usize, c: u8) -> bool {
    c.is_ascii_alphabetic() && (i == 0 || !is_ident(text[i - 1]) && text[i - 1] != b'.')
}

fn word_end(text: &[u8], i: usize) -> usize {
    i + text[i..].iter().take_while(|&&c| is_ident(c)).count()
}

/// The next non-blank byte at or after `i`, and where it is.
fn next_non_blank(text: &[u8], i: usize) -> Option<(usize, u8)> {
    text[i..]
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .map(|p| (i + p, text[i + p]))
}

/// The block depth after the word `text[start..end]` of a compound
/// statement: `BEGIN`, `CASE`, `LOOP`, `WHILE`, and `IF` / `REPEAT` as
/// statements (not the `IF(...)` and `REPEAT(...)` functions, nor `IF
/// [NOT] EXISTS`) open a block; `END` closes one (its `END IF`, `END LOOP`
/// ... is read with it). Returns the depth and where scanning goes on.
fn block_depth(text: &[u8], start: usize, end: usize, depth: u32) -> (u32, usize) {
    let word = text[start..end].to_ascii_uppercase();
    let next_word = || {
        next_non_blank(text, end).and_then(|(at, c)| {
            c.is_ascii_alphabetic()
                .then(|| text[at..word_end(text, at)].to_ascii_uppercase())
        })
    };
    match word.as_slice() {
        b"BEGIN" | b"CASE" | b"LOOP" | b"WHILE" => (depth + 1, end),
        b"IF" | b"REPEAT" => {
            let call = next_non_blank(text, end).is_some_and(|(_, c)| c == b'(');
            let exists = next_word().is_some_and(|w| w == b"EXISTS" || w == b"NOT");
            if call || exists {
                (depth, end)
            } else {
                (depth + 1, end)
            }
        }
        b"END" => {
            // `END IF` etc. close the block their opener opened: the
            // opener's word is read with the END.
            let closes = next_word().filter(|w| {
                matches!(
                    w.as_slice(),
                    b"IF" | b"CASE" | b"LOOP" | b"WHILE" | b"REPEAT"
                )
            });
            let after = match closes {
                Some(w) => next_non_blank(text, end).map_or(end, |(at, _)| at + w.len()),
                None => end,
            };
            (depth.saturating_sub(1), after)
        }
        _ => (depth, end),
    }
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
    fn a_compound_statement_is_one_statement() {
        for sql in [
            "CREATE PROCEDURE p() BEGIN SELECT 1; SELECT 2; END",
            "CREATE PROCEDURE p() BEGIN SELECT 1; SELECT 2; END;",
            "create or replace definer = `root`@`%` procedure p(x INT)\nbegin\n  declare y int;\n  set y = x;\n  if y > 1 then select 1; elseif y = 0 then select 0; else select 2; end if;\n  while y > 0 do set y = y - 1; end while;\n  lbl: loop leave lbl; end loop lbl;\n  repeat set y = y + 1; until y > 3 end repeat;\n  select case when y then 1 else 0 end;\n  case y when 1 then select 1; else select 2; end case;\n  drop table if exists t;\n  select if(y, 1, 2), repeat('a', 2);\nend",
            "CREATE FUNCTION f() RETURNS INT DETERMINISTIC BEGIN DECLARE x INT; SET x = 1; RETURN x; END",
            "CREATE TRIGGER t BEFORE INSERT ON items FOR EACH ROW BEGIN SET NEW.v = 1; SET NEW.w = 2; END",
            "CREATE EVENT e ON SCHEDULE EVERY 1 DAY DO BEGIN DELETE FROM a; DELETE FROM b; END",
            "BEGIN NOT ATOMIC SELECT 1; SELECT 2; END",
            "IF 1 = 1 THEN SELECT 1; ELSE SELECT 2; END IF",
            "CREATE PROCEDURE p() BEGIN SELECT 'END; x'; /* END; */ SELECT `end`; END",
        ] {
            assert_eq!(second_statement(sql.as_bytes()), None, "{sql}");
        }
        // Stacked statements stay stacked, compound or not.
        for (sql, at) in [
            ("CREATE PROCEDURE p() BEGIN SELECT 1; END; SELECT 2", 42),
            ("CREATE PROCEDURE p() SELECT 1; SELECT 2", 31),
            ("BEGIN; SELECT 1", 7),
            ("CREATE TABLE t (a INT); SELECT 1", 24),
            ("SELECT IF(1, 2, 3); SELECT 2", 20),
        ] {
            assert_eq!(second_statement(sql.as_bytes()), Some(at), "{sql}");
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
