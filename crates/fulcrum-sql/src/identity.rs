//! Whether a MySQL unit asks for connection ids: it calls `CONNECTION_ID()`
//! or reads the process list (`SHOW PROCESSLIST`,
//! `information_schema.PROCESSLIST`). A pooled client was given Fulcrum's
//! id at login, not its server thread's, so such a unit's answer is
//! translated. And whether it names `SQL_CALC_FOUND_ROWS`, whose
//! `FOUND_ROWS()` needs the same connection next. Identifiers only: string literals and comments are skipped,
//! so the answer does not depend on the literals the decision cache
//! normalises away. Pure, one pass over the bytes, made on a cache miss.

/// What connection ids a unit asks for, and whether it ties the next
/// command to its connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Identity {
    /// It names `PROCESSLIST`: its rows' `Id` column holds thread ids.
    pub processlist: bool,
    /// It calls `CONNECTION_ID()`.
    pub connection_id: bool,
    /// It names `SQL_CALC_FOUND_ROWS`: the `FOUND_ROWS()` after it must
    /// run on the same server connection.
    pub found_rows: bool,
}

use crate::lex::{line_end, skip_quoted};

/// The ids `sql` asks for (MySQL).
pub(crate) fn of(sql: &str) -> Identity {
    let mut found = Identity::default();
    words(sql, |word, call| {
        found.processlist |= word.eq_ignore_ascii_case(b"processlist");
        found.connection_id |= call.is_some() && word.eq_ignore_ascii_case(b"connection_id");
        found.found_rows |= word.eq_ignore_ascii_case(b"sql_calc_found_rows");
    });
    found
}

/// `sql` with each `CONNECTION_ID()` call made the literal `id` (a unit
/// that does not read the process list, whose ids are translated in its
/// rows instead).
pub fn with_connection_id(sql: &str, id: u32) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut done = 0;
    words(sql, |word, call| {
        if let Some(end) = call.filter(|_| word.eq_ignore_ascii_case(b"connection_id")) {
            let start = word.as_ptr() as usize - sql.as_ptr() as usize;
            out.push_str(&sql[done..start]);
            out.push_str(&id.to_string());
            done = end;
        }
    });
    out.push_str(&sql[done..]);
    out
}

/// The column name of `SELECT CONNECTION_ID() [[AS] name]` (the call as
/// written, or the alias), when that is the whole statement.
pub fn select_connection_id(sql: &str) -> Option<&str> {
    let sql = sql.trim().trim_end_matches(';').trim_end();
    let rest = strip_word(sql, "select")?;
    // Every SELECT comes here: a look at its next word, no scan of the rest.
    if !rest
        .get(.."connection_id".len())
        .is_some_and(|w| w.eq_ignore_ascii_case("connection_id"))
    {
        return None;
    }
    let call_end = rest.find(')')? + 1;
    let call = &rest[..call_end];
    let name: String = call.chars().filter(|c| !c.is_whitespace()).collect();
    if !name.eq_ignore_ascii_case("connection_id()") {
        return None;
    }
    let alias = rest[call_end..].trim();
    if alias.is_empty() {
        return Some(call);
    }
    let alias = strip_word(alias, "as").unwrap_or(alias);
    let bare = alias.trim_matches('`');
    let plain = |c: char| c.is_ascii_alphanumeric() || c == '_';
    (!bare.is_empty() && bare.chars().all(plain)).then_some(bare)
}

/// `text` after its first word `word` (ASCII case ignored) and the spaces
/// after it.
fn strip_word<'a>(text: &'a str, word: &str) -> Option<&'a str> {
    let head = text.get(..word.len())?;
    let rest = &text[word.len()..];
    (head.eq_ignore_ascii_case(word) && rest.starts_with(char::is_whitespace))
        .then(|| rest.trim_start())
}

/// Calls `f` with each identifier of `sql` (backquoted ones too) and, for a
/// word followed by `(` and `)` with only spaces between, the index after
/// the `)`: a call without arguments.
fn words(sql: &str, mut f: impl FnMut(&[u8], Option<usize>)) {
    let b = sql.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            q @ (b'\'' | b'"') => i = skip_quoted(b, i + 1, q, true),
            b'`' => {
                let end = skip_quoted(b, i + 1, b'`', false);
                f(&b[i + 1..end.saturating_sub(1).max(i + 1)], None);
                i = end;
            }
            b'#' => i = line_end(b, i),
            b'-' if b.get(i + 1) == Some(&b'-') => i = line_end(b, i),
            // Not `/*! ... */` or `/*M! ... */`: MySQL runs those.
            b'/' if b.get(i + 1) == Some(&b'*') && !executable(&b[i + 2..]) => {
                i = crate::fingerprint::block_comment_end(b, i).unwrap_or(b.len());
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'$')
                {
                    i += 1;
                }
                let skip_spaces = |mut j: usize| {
                    while j < b.len() && b[j].is_ascii_whitespace() {
                        j += 1;
                    }
                    j
                };
                let open = skip_spaces(i);
                let close = skip_spaces(open + 1);
                let call = (b.get(open) == Some(&b'(') && b.get(close) == Some(&b')'))
                    .then_some(close + 1);
                f(&b[start..i], call);
            }
            _ => i += 1,
        }
    }
}

fn executable(rest: &[u8]) -> bool {
    rest.starts_with(b"!") || rest.starts_with(b"M!")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_asked_for_by_identifiers_only() {
        let id = |sql| of(sql);
        assert!(id("SHOW PROCESSLIST").processlist);
        assert!(id("show full processlist").processlist);
        assert!(id("SELECT ID FROM information_schema.PROCESSLIST").processlist);
        assert!(id("SELECT * FROM information_schema.`PROCESSLIST`").processlist);
        assert!(id("SELECT CONNECTION_ID()").connection_id);
        assert!(id("select connection_id ( ) as me").connection_id);
        assert!(id("/*!SELECT*/ connection_id()").connection_id);
        assert!(id("SELECT /*M! connection_id() */ 1").connection_id);
        assert!(id("SELECT SQL_CALC_FOUND_ROWS * FROM t LIMIT 1").found_rows);
        assert!(id("select /*! sql_calc_found_rows */ a from t").found_rows);
        for sql in [
            "SELECT 'processlist', 'connection_id()'",
            "SELECT \"CONNECTION_ID()\"",
            "SELECT 1 -- processlist\n",
            "SELECT 1 # connection_id()\n",
            "SELECT /* processlist */ 1",
            "SELECT connection_id FROM t",
            "SELECT my_processlist FROM t",
            "SELECT 'it\\'s processlist'",
            "SELECT 'sql_calc_found_rows' FROM t",
            "SELECT 1 /* SQL_CALC_FOUND_ROWS */",
        ] {
            assert_eq!(id(sql), Identity::default(), "{sql}");
        }
    }

    #[test]
    fn connection_id_calls_become_the_literal() {
        assert_eq!(
            with_connection_id("SELECT CONNECTION_ID() + 1, 'connection_id()' FROM t", 7),
            "SELECT 7 + 1, 'connection_id()' FROM t"
        );
        assert_eq!(
            with_connection_id("select connection_id ( ), connection_id()", 42),
            "select 42, 42"
        );
        assert_eq!(with_connection_id("SELECT 1", 3), "SELECT 1");
    }

    #[test]
    fn the_whole_select_of_the_id_is_recognised() {
        let name = select_connection_id;
        assert_eq!(name("SELECT CONNECTION_ID()"), Some("CONNECTION_ID()"));
        assert_eq!(
            name("  select connection_id( ) ;"),
            Some("connection_id( )")
        );
        assert_eq!(name("SELECT CONNECTION_ID() AS me"), Some("me"));
        assert_eq!(name("SELECT CONNECTION_ID() `id`"), Some("id"));
        assert_eq!(name("SELECT CONNECTION_ID() + 1"), None);
        assert_eq!(name("SELECT CONNECTION_ID(), 1"), None);
        assert_eq!(name("SELECT CONNECTION_ID() FROM t"), None);
        assert_eq!(name("SELECT 1"), None);
    }
}
