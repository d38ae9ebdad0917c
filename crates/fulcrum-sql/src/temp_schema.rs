//! Whether a PostgreSQL unit names the session's temporary schema
//! (`pg_temp`, `pg_temp_3`, quoted or not) as an identifier: a table, view,
//! sequence or function made there is session state whatever keyword made
//! it (`CREATE TABLE pg_temp.x`, `SELECT ... INTO pg_temp.x`), and such a
//! name can shadow a real table for the next client. Identifiers only:
//! string literals, dollar-quoted bodies and comments are skipped, so the
//! answer does not depend on the literals the decision cache normalises
//! away. Pure, one pass over the bytes.

use crate::lex::{line_end, skip_quoted};

/// True when `sql` has an identifier `pg_temp` or `pg_temp_<n>`.
pub(crate) fn names_temp_schema(sql: &str) -> bool {
    let b = sql.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\'' => i = skip_quoted(b, i + 1, b'\'', false),
            b'"' => {
                let end = skip_quoted(b, i + 1, b'"', false);
                let close = if end > i + 1 && b[end - 1] == b'"' {
                    end - 1
                } else {
                    end
                };
                let inner = &b[i + 1..close];
                if is_temp_schema(inner) {
                    return true;
                }
                i = end;
            }
            b'-' if b.get(i + 1) == Some(&b'-') => i = line_end(b, i),
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i = crate::fingerprint::block_comment_end(b, i).unwrap_or(b.len());
            }
            b'$' => i = skip_dollar(b, i),
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'$')
                {
                    i += 1;
                }
                if is_temp_schema(&b[start..i]) {
                    return true;
                }
            }
            _ => i += 1,
        }
    }
    false
}

fn is_temp_schema(word: &[u8]) -> bool {
    if word.len() < 7 || !word[..7].eq_ignore_ascii_case(b"pg_temp") {
        return false;
    }
    let rest = &word[7..];
    rest.is_empty()
        || (rest[0] == b'_' && rest.len() > 1 && rest[1..].iter().all(u8::is_ascii_digit))
}

/// After a `$tag$ ... $tag$` body, or past a lone `$` (a parameter `$1`).
fn skip_dollar(b: &[u8], i: usize) -> usize {
    let mut j = i + 1;
    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
        j += 1;
    }
    if b.get(j) != Some(&b'$') || b[i + 1..j].first().is_some_and(u8::is_ascii_digit) {
        return j;
    }
    let tag = &b[i..=j];
    let mut k = j + 1;
    while k + tag.len() <= b.len() {
        if &b[k..k + tag.len()] == tag {
            return k + tag.len();
        }
        k += 1;
    }
    b.len()
}

#[cfg(test)]
mod tests {
    use super::names_temp_schema;

    #[test]
    fn the_temporary_schema_is_found_as_an_identifier_only() {
        for sql in [
            "CREATE TABLE pg_temp.x (a int)",
            "create view PG_TEMP.v as select 1",
            "SELECT 1 INTO pg_temp.x",
            "CREATE TABLE \"pg_temp\".accounts (a int)",
            "CREATE SEQUENCE pg_temp_3.s",
            "SELECT pg_temp.f()",
            "/* x */ INSERT INTO pg_temp.t VALUES (1)",
        ] {
            assert!(names_temp_schema(sql), "{sql}");
        }
        for sql in [
            "SELECT 'pg_temp.x'",
            "SELECT $$pg_temp$$",
            "SELECT $body$ pg_temp $body$",
            "SELECT 1 -- pg_temp\n",
            "SELECT /* pg_temp */ 1",
            "SELECT pg_temporary FROM t",
            "SELECT my_pg_temp FROM pg_temp_x",
            "SELECT $1 FROM t",
        ] {
            assert!(!names_temp_schema(sql), "{sql}");
        }
    }
}
