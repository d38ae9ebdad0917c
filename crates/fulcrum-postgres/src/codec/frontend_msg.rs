//! Client-to-server messages: reading the few fields routing and statement
//! mapping need (statement and portal names, query text, auth payloads),
//! rebuilding a message with a different statement name, and naming a
//! logged statement for a failed replay's log line. Pure over bytes.

use bytes::{BufMut, BytesMut};

use super::frame::put_header;

fn split_cstr(body: &[u8]) -> Option<(&[u8], &[u8])> {
    let nul = memchr::memchr(0, body)?;
    Some((&body[..nul], &body[nul + 1..]))
}

/// A Parse body: statement name, then `rest` = query text, NUL, parameter types.
#[derive(Debug, PartialEq, Eq)]
pub struct ParseMsg<'a> {
    pub name: &'a [u8],
    pub query: &'a [u8],
    /// Everything after the name: identifies the statement's definition.
    pub definition: &'a [u8],
}

pub fn parse_msg(body: &[u8]) -> Option<ParseMsg<'_>> {
    let (name, definition) = split_cstr(body)?;
    let (query, types) = split_cstr(definition)?;
    if types.len() < 2 {
        return None;
    }
    Some(ParseMsg {
        name,
        query,
        definition,
    })
}

/// A Bind body: portal name, statement name, then the parameters (`rest`).
#[derive(Debug, PartialEq, Eq)]
pub struct BindMsg<'a> {
    pub portal: &'a [u8],
    pub statement: &'a [u8],
    pub rest: &'a [u8],
}

pub fn bind_msg(body: &[u8]) -> Option<BindMsg<'_>> {
    let (portal, after) = split_cstr(body)?;
    let (statement, rest) = split_cstr(after)?;
    Some(BindMsg {
        portal,
        statement,
        rest,
    })
}

/// Parameter `index` (0-based) of a Bind, from `rest` (the body after the
/// statement name): `Some(None)` for NULL, `Some(Some(bytes))` for a
/// value in either format, `None` when the Bind is malformed or has no
/// such parameter. Lengths are checked before any slice is taken.
pub fn bind_param(rest: &[u8], index: usize) -> Option<Option<&[u8]>> {
    let int16 = |at: usize| -> Option<usize> {
        let b = rest.get(at..at + 2)?;
        usize::try_from(i16::from_be_bytes([b[0], b[1]])).ok()
    };
    let formats = int16(0)?;
    let mut at = 2 + formats * 2;
    let params = int16(at)?;
    if index >= params {
        return None;
    }
    at += 2;
    for i in 0..=index {
        let b = rest.get(at..at + 4)?;
        let len = i32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        at += 4;
        let value = if len < 0 {
            None
        } else {
            let len = len as usize;
            let v = rest.get(at..at + len)?;
            at += len;
            Some(v)
        };
        if i == index {
            return Some(value);
        }
    }
    None
}

/// Whether parameter `index` of a Bind (`rest`, after the statement name)
/// is sent in binary format; `None` when the format codes are malformed.
pub fn bind_param_binary(rest: &[u8], index: usize) -> Option<bool> {
    let count = i16::from_be_bytes([*rest.first()?, *rest.get(1)?]);
    let code = |i: usize| -> Option<bool> {
        let b = rest.get(2 + 2 * i..4 + 2 * i)?;
        Some(i16::from_be_bytes([b[0], b[1]]) == 1)
    };
    match count {
        0 => Some(false),
        1 => code(0),
        n if n > 1 => code(index),
        _ => None,
    }
}

/// `rest` (a Bind after its statement name) with parameter `index`'s value
/// replaced by `value`; `None` when the Bind is malformed.
pub fn with_bind_param(rest: &[u8], index: usize, value: &[u8]) -> Option<Vec<u8>> {
    let old = bind_param(rest, index)?;
    // The value's offset: where its bytes (after the length) start.
    let start = match old {
        Some(v) => v.as_ptr() as usize - rest.as_ptr() as usize,
        None => return None,
    };
    let len_at = start - 4;
    let mut out = Vec::with_capacity(rest.len() + value.len());
    out.extend_from_slice(&rest[..len_at]);
    out.extend_from_slice(&(value.len() as i32).to_be_bytes());
    out.extend_from_slice(value);
    out.extend_from_slice(&rest[start + old.map_or(0, <[u8]>::len)..]);
    Some(out)
}

/// Describe and Close bodies: 'S' (statement) or 'P' (portal), then a name.
pub fn target_msg(body: &[u8]) -> Option<(u8, &[u8])> {
    let (&kind, rest) = body.split_first()?;
    if kind != b'S' && kind != b'P' {
        return None;
    }
    let (name, tail) = split_cstr(rest)?;
    tail.is_empty().then_some((kind, name))
}

/// The text of a Query body, without its NUL.
pub fn query_text(body: &[u8]) -> Option<&[u8]> {
    let (text, tail) = split_cstr(body)?;
    tail.is_empty().then_some(text)
}

/// Writes a Parse message naming `name`, with the definition of another.
pub fn put_parse(out: &mut BytesMut, name: &[u8], definition: &[u8]) {
    put_header(out, b'P', name.len() + 1 + definition.len());
    out.extend_from_slice(name);
    out.put_u8(0);
    out.extend_from_slice(definition);
}

/// Writes a Bind message with the statement renamed.
pub fn put_bind(out: &mut BytesMut, portal: &[u8], statement: &[u8], rest: &[u8]) {
    put_header(out, b'B', portal.len() + statement.len() + 2 + rest.len());
    out.extend_from_slice(portal);
    out.put_u8(0);
    out.extend_from_slice(statement);
    out.put_u8(0);
    out.extend_from_slice(rest);
}

/// Writes a Describe ('D') or Close ('C') message.
pub fn put_target(out: &mut BytesMut, tag: u8, kind: u8, name: &[u8]) {
    put_header(out, tag, name.len() + 2);
    out.put_u8(kind);
    out.extend_from_slice(name);
    out.put_u8(0);
}

/// Writes a simple Query.
pub fn put_sync(out: &mut BytesMut) {
    put_header(out, b'S', 0);
}

/// Execute of `portal`, all its rows.
pub fn put_execute(out: &mut BytesMut, portal: &[u8]) {
    put_header(out, b'E', portal.len() + 1 + 4);
    out.extend_from_slice(portal);
    out.put_u8(0);
    out.put_u32(0);
}

pub fn put_query(out: &mut BytesMut, text: &str) {
    put_header(out, b'Q', text.len() + 1);
    out.extend_from_slice(text.as_bytes());
    out.put_u8(0);
}

/// PasswordMessage body: one C string (cleartext or `md5...`).
pub fn password_msg(body: &[u8]) -> Option<&[u8]> {
    query_text(body)
}

/// SASLInitialResponse body: mechanism, then an Int32 length (-1 = none) and data.
pub fn sasl_initial_msg(body: &[u8]) -> Option<(&[u8], &[u8])> {
    let (mechanism, rest) = split_cstr(body)?;
    if rest.len() < 4 {
        return None;
    }
    let len = i32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
    let data = &rest[4..];
    match len {
        -1 if data.is_empty() => Some((mechanism, &[])),
        n if n >= 0 && n as usize == data.len() => Some((mechanism, data)),
        _ => None,
    }
}

/// The `n`th statement (0-based) of logged client frames, for a log line:
/// a simple query's text, or the prepared statement an Execute ran (its
/// portal's Bind names it; the text if the Parse is in the log too).
pub fn nth_statement(frames: &[u8], n: usize) -> String {
    let mut texts: std::collections::HashMap<Vec<u8>, String> = std::collections::HashMap::new();
    let mut bound = String::new();
    let mut seen = 0;
    let mut at = 0;
    while at + 5 <= frames.len() {
        let len = u32::from_be_bytes([
            frames[at + 1],
            frames[at + 2],
            frames[at + 3],
            frames[at + 4],
        ]);
        let end = (at + 1 + len as usize).min(frames.len());
        let body = &frames[at + 5..end];
        let short = |t: &[u8]| {
            let t = String::from_utf8_lossy(t);
            t.chars().take(200).collect::<String>()
        };
        match frames[at] {
            b'Q' => {
                if seen == n {
                    return format!(
                        "the query {:?}",
                        short(query_text(body).unwrap_or_default())
                    );
                }
                seen += 1;
            }
            b'P' => {
                if let Some(p) = parse_msg(body) {
                    texts.insert(p.name.to_vec(), short(p.query));
                }
            }
            b'B' => {
                if let Some(b) = bind_msg(body) {
                    bound = texts.get(b.statement).cloned().unwrap_or_else(|| {
                        format!(
                            "prepared statement {:?}",
                            String::from_utf8_lossy(b.statement)
                        )
                    });
                }
            }
            b'E' => {
                if seen == n {
                    return format!("the execute of {bound:?}");
                }
                seen += 1;
            }
            _ => {}
        }
        at = end;
    }
    format!("statement {} (past the log)", n + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::frame::check_frame;

    #[test]
    fn nth_statement_names_a_query_or_the_prepared_statement_an_execute_ran() {
        let mut frames = BytesMut::new();
        put_query(&mut frames, "BEGIN");
        put_parse(&mut frames, b"s1", b"UPDATE t SET a = 1\0\0\0");
        put_bind(&mut frames, b"", b"s1", b"\0\0\0\0\0\0");
        put_execute(&mut frames, b"");
        put_bind(&mut frames, b"", b"s2", b"\0\0\0\0\0\0");
        put_execute(&mut frames, b"");
        assert_eq!(nth_statement(&frames, 0), "the query \"BEGIN\"");
        assert_eq!(
            nth_statement(&frames, 1),
            "the execute of \"UPDATE t SET a = 1\""
        );
        assert_eq!(
            nth_statement(&frames, 2),
            "the execute of \"prepared statement \\\"s2\\\"\""
        );
        assert_eq!(nth_statement(&frames, 3), "statement 4 (past the log)");
    }

    #[test]
    fn parse_fields_and_rename() {
        let body = b"s1\0SELECT $1\0\0\x01\0\0\0\x17";
        let p = parse_msg(body).unwrap();
        assert_eq!(p.name, b"s1");
        assert_eq!(p.query, b"SELECT $1");
        let mut out = BytesMut::new();
        put_parse(&mut out, b"fulcrum_7", p.definition);
        let h = check_frame(&out, 1000).unwrap().unwrap();
        assert_eq!(h.total, out.len());
        let q = parse_msg(&out[5..]).unwrap();
        assert_eq!(q.name, b"fulcrum_7");
        assert_eq!(q.definition, p.definition);
    }

    #[test]
    fn truncated_parse_is_none() {
        assert_eq!(parse_msg(b"s1\0SELECT 1\0\0"), None);
        assert_eq!(parse_msg(b"s1"), None);
    }

    #[test]
    fn bind_fields_and_rename() {
        let body = b"\0s1\0\0\0\0\0\0\0";
        let b = bind_msg(body).unwrap();
        assert_eq!((b.portal, b.statement), (&b""[..], &b"s1"[..]));
        let mut out = BytesMut::new();
        put_bind(&mut out, b.portal, b"fulcrum_1", b.rest);
        assert_eq!(check_frame(&out, 1000).unwrap().unwrap().total, out.len());
        let c = bind_msg(&out[5..]).unwrap();
        assert_eq!(c.statement, b"fulcrum_1");
        assert_eq!(c.rest, b.rest);
    }

    #[test]
    fn bind_parameters_are_read_by_index_and_bounded() {
        // one format code (text), three parameters: 'ab', NULL, 'c'; no result formats.
        let mut rest = vec![0, 1, 0, 0, 0, 3];
        rest.extend_from_slice(&2i32.to_be_bytes());
        rest.extend_from_slice(b"ab");
        rest.extend_from_slice(&(-1i32).to_be_bytes());
        rest.extend_from_slice(&1i32.to_be_bytes());
        rest.extend_from_slice(b"c");
        rest.extend_from_slice(&[0, 0]);
        assert_eq!(bind_param(&rest, 0), Some(Some(&b"ab"[..])));
        assert_eq!(bind_param(&rest, 1), Some(None));
        assert_eq!(bind_param(&rest, 2), Some(Some(&b"c"[..])));
        assert_eq!(bind_param(&rest, 3), None, "no such parameter");
        assert_eq!(bind_param(&rest[..9], 0), None, "cut short");
        let mut huge = vec![0, 0, 0, 1];
        huge.extend_from_slice(&i32::MAX.to_be_bytes());
        assert_eq!(bind_param(&huge, 0), None, "a length past the frame");
        assert_eq!(bind_param(&[0xff, 0xff], 0), None, "a negative count");
        assert_eq!(bind_param_binary(&rest, 0), Some(false));
        assert_eq!(
            bind_param_binary(&[0, 1, 0, 1], 5),
            Some(true),
            "one code for all"
        );
        assert_eq!(bind_param_binary(&[0, 2, 0, 0, 0, 1], 1), Some(true));
        assert_eq!(bind_param_binary(&[0, 0], 3), Some(false));
        assert_eq!(bind_param_binary(&[0, 2, 0, 0], 1), None, "cut short");
        let swapped = with_bind_param(&rest, 2, b"xyz").unwrap();
        assert_eq!(bind_param(&swapped, 2), Some(Some(&b"xyz"[..])));
        assert_eq!(bind_param(&swapped, 0), Some(Some(&b"ab"[..])));
        assert_eq!(
            &swapped[swapped.len() - 2..],
            &[0, 0],
            "result formats kept"
        );
        assert_eq!(with_bind_param(&rest, 1, b"1"), None, "NULL stays");
    }

    #[test]
    fn describe_close_targets() {
        assert_eq!(target_msg(b"Ss1\0"), Some((b'S', &b"s1"[..])));
        assert_eq!(target_msg(b"P\0"), Some((b'P', &b""[..])));
        assert_eq!(target_msg(b"Xs1\0"), None);
        assert_eq!(target_msg(b"Ss1"), None);
        let mut out = BytesMut::new();
        put_target(&mut out, b'C', b'S', b"x");
        assert_eq!(&out[..], b"C\0\0\0\x07Sx\0");
    }

    #[test]
    fn query_and_auth_bodies() {
        assert_eq!(query_text(b"SELECT 1\0"), Some(&b"SELECT 1"[..]));
        assert_eq!(query_text(b"SELECT 1"), None);
        let mut body = b"SCRAM-SHA-256\0".to_vec();
        body.extend_from_slice(&3i32.to_be_bytes());
        body.extend_from_slice(b"abc");
        assert_eq!(
            sasl_initial_msg(&body),
            Some((&b"SCRAM-SHA-256"[..], &b"abc"[..]))
        );
        body.push(b'x');
        assert_eq!(sasl_initial_msg(&body), None);
        let mut out = BytesMut::new();
        put_query(&mut out, "RESET ALL");
        assert_eq!(&out[..], b"Q\0\0\0\x0eRESET ALL\0");
    }
}
