//! The extended-protocol units the PostgreSQL result cache may answer, as
//! found whole at the front of the client buffer: a Bind of a named
//! statement (`pgbench -M prepared`, `PQexecPrepared`) or the unnamed
//! statement's Parse and Bind (`pgbench -M extended`, psycopg,
//! tokio-postgres `query_typed`), with their Describe, an Execute of all
//! rows and Sync. Pure functions over bytes; the session keys and answers.

use crate::codec::frame::check_frame;
use crate::codec::frontend_msg::{bind_msg, parse_msg};

/// An extended-protocol unit the cache may answer.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::frontend::session) struct ExtendedUnit<'a> {
    /// Its bytes, all frames to Sync.
    pub total: usize,
    /// The unnamed statement's Parse, when the unit opens with one.
    pub parse: Option<UnnamedParse<'a>>,
    /// The named statement bound (empty: the unit's own Parse).
    pub statement: &'a [u8],
    /// The Bind after its statement name: parameter formats and values,
    /// result formats.
    pub bind_rest: &'a [u8],
    /// What is described, in order, as the answer's frames follow it:
    /// `[before the Bind, after it]`, each `0` (nothing), `b'S'` (the
    /// statement: ParameterDescription and RowDescription) or `b'P'` (the
    /// portal: RowDescription).
    pub described: [u8; 2],
}

/// The Parse of the unnamed statement a unit opens with.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::frontend::session) struct UnnamedParse<'a> {
    /// The whole frame (what the session remembers as the client's
    /// unnamed statement).
    pub frame: &'a [u8],
    /// Query text, NUL, parameter type OIDs: the statement's definition.
    pub definition: &'a [u8],
    pub query: &'a [u8],
}

/// The frames of `buf` from `at`, each as (tag, body, whole length); stops
/// at the first one not whole in `buf`.
struct Frames<'a> {
    buf: &'a [u8],
    at: usize,
    max: u64,
}

impl<'a> Frames<'a> {
    fn next(&mut self) -> Option<(u8, &'a [u8])> {
        let h = check_frame(self.buf.get(self.at..)?, self.max).ok()??;
        let body = self.buf.get(self.at + 5..self.at + h.total)?;
        self.at += h.total;
        Some((h.tag, body))
    }
}

/// The unit at the front of `buf` when it is one the cache may answer:
/// `[Parse("")] [Describe('S', "")] Bind [Describe] Execute(all rows) Sync`,
/// all whole, where a Bind with no Parse before it names a statement (the
/// unnamed one's text is the Parse's), a Describe before the Bind is of the
/// unnamed statement (after a Parse), and one after it is of the Bind's
/// portal or of the statement bound (unnamed only: a named statement's
/// Describe is mapped to its server-side name).
pub(in crate::frontend::session) fn extended_unit(
    buf: &[u8],
    max: u64,
) -> Option<ExtendedUnit<'_>> {
    let mut frames = Frames { buf, at: 0, max };
    let (mut tag, mut body) = frames.next()?;
    let mut parse = None;
    let mut described = [0u8; 2];
    if tag == b'P' {
        let p = parse_msg(body).filter(|p| p.name.is_empty())?;
        parse = Some(UnnamedParse {
            frame: &buf[..frames.at],
            definition: p.definition,
            query: p.query,
        });
        (tag, body) = frames.next()?;
        if tag == b'D' {
            described[0] = unnamed_statement(body)?;
            (tag, body) = frames.next()?;
        }
    }
    if tag != b'B' {
        return None;
    }
    let bind = bind_msg(body)?;
    // Named with no Parse; the unnamed one right after its Parse.
    if bind.statement.is_empty() != parse.is_some() {
        return None;
    }
    (tag, body) = frames.next()?;
    if tag == b'D' {
        described[1] = match body.split_first()? {
            (b'P', name) if name.strip_suffix(b"\0")? == bind.portal => b'P',
            (b'S', _) if parse.is_some() => unnamed_statement(body)?,
            _ => return None,
        };
        (tag, body) = frames.next()?;
    }
    // Execute of this portal, all rows (a row limit suspends the portal).
    let (portal, rows) = body.split_at_checked(body.len().checked_sub(4)?)?;
    if tag != b'E' || portal.strip_suffix(b"\0")? != bind.portal || rows != [0, 0, 0, 0] {
        return None;
    }
    if frames.next()?.0 != b'S' {
        return None;
    }
    Some(ExtendedUnit {
        total: frames.at,
        parse,
        statement: bind.statement,
        bind_rest: bind.rest,
        described,
    })
}

/// `b'S'` when a Describe's `body` is of the unnamed statement.
fn unnamed_statement(body: &[u8]) -> Option<u8> {
    (body == b"S\0").then_some(b'S')
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    use crate::codec::frontend_msg::{put_bind, put_parse};

    const SYNC: &[u8] = b"S\0\0\0\x04";

    fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut f = vec![tag];
        f.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        f.extend_from_slice(body);
        f
    }

    fn parse(name: &[u8], sql: &str, types: &[u32]) -> Vec<u8> {
        let mut def = sql.as_bytes().to_vec();
        def.push(0);
        def.extend_from_slice(&(types.len() as u16).to_be_bytes());
        for t in types {
            def.extend_from_slice(&t.to_be_bytes());
        }
        let mut b = BytesMut::new();
        put_parse(&mut b, name, &def);
        b.to_vec()
    }

    /// A Bind of one text parameter `value`, results in `format`.
    fn bind(portal: &[u8], statement: &[u8], value: &[u8], format: u16) -> Vec<u8> {
        let mut rest = vec![0, 0, 0, 1];
        rest.extend_from_slice(&(value.len() as u32).to_be_bytes());
        rest.extend_from_slice(value);
        rest.extend_from_slice(&[0, 1]);
        rest.extend_from_slice(&format.to_be_bytes());
        let mut b = BytesMut::new();
        put_bind(&mut b, portal, statement, &rest);
        b.to_vec()
    }

    fn describe(kind: u8, name: &[u8]) -> Vec<u8> {
        frame(b'D', &[&[kind], name, b"\0"].concat())
    }

    fn execute(portal: &[u8], rows: u32) -> Vec<u8> {
        frame(b'E', &[portal, b"\0", &rows.to_be_bytes()].concat())
    }

    const SQL: &str = "SELECT v FROM t WHERE id = $1";

    #[test]
    fn the_unnamed_statement_unit_is_found_with_what_it_describes() {
        let p = parse(b"", SQL, &[23]);
        for (describes, expect) in [
            (vec![], [0, 0]),
            (describe(b'P', b""), [0, b'P']),
            (describe(b'S', b""), [0, b'S']),
        ] {
            let unit = [
                p.clone(),
                bind(b"", b"", b"7", 0),
                describes,
                execute(b"", 0),
                SYNC.to_vec(),
                b"Qtrailing".to_vec(),
            ]
            .concat();
            let found = extended_unit(&unit, 1 << 20).expect("a unit");
            assert_eq!(found.total, unit.len() - 9);
            assert_eq!(found.described, expect);
            assert_eq!(found.statement, b"");
            let parsed = found.parse.expect("its Parse");
            assert_eq!(parsed.frame, &p[..]);
            assert_eq!(parsed.query, SQL.as_bytes());
            assert_eq!(parsed.definition, &p[6..], "text and type OIDs");
            assert_eq!(found.bind_rest, &bind(b"", b"", b"7", 0)[7..]);
        }
        // Described before the Bind (asyncpg's order).
        let unit = [
            p.clone(),
            describe(b'S', b""),
            bind(b"", b"", b"7", 1),
            execute(b"", 0),
            SYNC.to_vec(),
        ]
        .concat();
        let found = extended_unit(&unit, 1 << 20).expect("a unit");
        assert_eq!(found.described, [b'S', 0]);
        assert_eq!(found.total, unit.len());
    }

    #[test]
    fn a_named_statement_bind_is_found_as_before() {
        let unit = [
            bind(b"p", b"s1", b"7", 0),
            describe(b'P', b"p"),
            execute(b"p", 0),
            SYNC.to_vec(),
        ]
        .concat();
        let found = extended_unit(&unit, 1 << 20).expect("a unit");
        assert_eq!(found.parse, None);
        assert_eq!(found.statement, b"s1");
        assert_eq!(found.described, [0, b'P']);
        assert_eq!(found.total, unit.len());
    }

    #[test]
    fn anything_else_is_not_the_caches() {
        let p = parse(b"", SQL, &[]);
        let b = bind(b"", b"", b"7", 0);
        let (e, s) = (execute(b"", 0), SYNC.to_vec());
        let not = [
            // A named Parse, or a Bind of another statement after the Parse.
            [
                parse(b"s1", SQL, &[]),
                bind(b"", b"s1", b"7", 0),
                e.clone(),
                s.clone(),
            ]
            .concat(),
            [p.clone(), bind(b"", b"s2", b"7", 0), e.clone(), s.clone()].concat(),
            // The unnamed statement bound with no Parse in the unit.
            [b.clone(), e.clone(), s.clone()].concat(),
            // A row limit, another portal, a named statement's Describe.
            [p.clone(), b.clone(), execute(b"", 10), s.clone()].concat(),
            [p.clone(), b.clone(), execute(b"x", 0), s.clone()].concat(),
            [
                p.clone(),
                b.clone(),
                describe(b'P', b"x"),
                e.clone(),
                s.clone(),
            ]
            .concat(),
            [
                p.clone(),
                describe(b'S', b"s1"),
                b.clone(),
                e.clone(),
                s.clone(),
            ]
            .concat(),
            [
                bind(b"", b"s1", b"7", 0),
                describe(b'S', b"s1"),
                e.clone(),
                s.clone(),
            ]
            .concat(),
            // No Sync yet, a Flush instead, or cut short.
            [p.clone(), b.clone(), e.clone()].concat(),
            [p.clone(), b.clone(), e.clone(), b"H\0\0\0\x04".to_vec()].concat(),
            [p.clone(), b.clone(), e.clone(), s.clone()].concat()[..20].to_vec(),
        ];
        for (i, unit) in not.iter().enumerate() {
            assert_eq!(extended_unit(unit, 1 << 20), None, "case {i}");
        }
    }
}
