//! Where the next unit of work goes: classifies the statements of the client
//! messages buffered up to the end of the unit (a Query, or extended-protocol
//! messages up to Sync) and combines them, strictest first. A unit that is
//! not wholly buffered yet goes to the primary: a later message of it could
//! write. Pure over the buffered bytes.

use std::collections::HashMap;
use std::sync::Arc;

use fulcrum_sql::Decision;

use super::statements::ClientStatement;
use crate::codec::frame::check_frame;
use crate::codec::frontend_msg::{bind_msg, parse_msg, query_text};

/// What the unit at the front of `buf` is, for routing.
pub fn unit_decision(
    buf: &[u8],
    max: u64,
    classify: &dyn Fn(&[u8]) -> Decision,
    statements: &HashMap<Vec<u8>, Arc<ClientStatement>>,
    unnamed: Decision,
) -> Decision {
    let mut pos = 0;
    let mut decision: Option<Decision> = None;
    let mut unnamed = unnamed;
    let combine = |d: Option<Decision>, e: Decision| Some(d.map_or(e, |d| d.combine(e)));
    loop {
        let Ok(Some(h)) = check_frame(&buf[pos..], max) else {
            return Decision::Write;
        };
        if buf.len() - pos < h.total {
            return Decision::Write;
        }
        let body = &buf[pos + 5..pos + h.total];
        match h.tag {
            b'Q' => {
                if decision.is_some() {
                    // Extended messages without a Sync, then a Query: be safe.
                    return Decision::Write;
                }
                return match query_text(body) {
                    Some(text) => classify(text),
                    None => Decision::Write,
                };
            }
            b'P' => {
                let d = match parse_msg(body) {
                    Some(p) => classify(p.query),
                    None => Decision::Write,
                };
                if parse_msg(body).is_some_and(|p| p.name.is_empty()) {
                    unnamed = d;
                }
                decision = combine(decision, d);
            }
            b'B' => {
                let d = match bind_msg(body) {
                    Some(b) if b.statement.is_empty() => unnamed,
                    Some(b) => statements
                        .get(b.statement)
                        .map_or(Decision::Write, |s| s.decision),
                    None => Decision::Write,
                };
                decision = combine(decision, d);
            }
            b'S' => return decision.unwrap_or(Decision::Read),
            b'F' => return Decision::Write,
            b'X' => return decision.unwrap_or(Decision::Read),
            _ => {}
        }
        pos += h.total;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use fulcrum_sql::{Classifier, ClassifierConfig, Dialect};

    use crate::codec::frontend_msg::{put_bind, put_parse, put_query};

    fn classifier() -> impl Fn(&[u8]) -> Decision {
        let c = Classifier::new(
            Dialect::Postgres,
            &ClassifierConfig {
                cache_size: 10,
                ..Default::default()
            },
        );
        move |sql: &[u8]| c.classify_bytes(sql).decision
    }

    fn sync(b: &mut BytesMut) {
        b.extend_from_slice(b"S\0\0\0\x04");
    }

    fn parse(b: &mut BytesMut, name: &[u8], sql: &str) {
        let mut def = sql.as_bytes().to_vec();
        def.extend_from_slice(b"\0\0\0");
        put_parse(b, name, &def);
    }

    #[test]
    fn a_query_is_its_own_unit() {
        let c = classifier();
        let mut b = BytesMut::new();
        put_query(&mut b, "SELECT 1");
        put_query(&mut b, "UPDATE t SET a = 1");
        assert_eq!(
            unit_decision(&b, 1 << 20, &c, &HashMap::new(), Decision::Write),
            Decision::Read
        );
    }

    #[test]
    fn extended_unit_combines_to_the_strictest() {
        let c = classifier();
        let mut b = BytesMut::new();
        parse(&mut b, b"", "SELECT 1");
        put_bind(&mut b, b"", b"", b"\0\0\0\0\0\0");
        sync(&mut b);
        assert_eq!(
            unit_decision(&b, 1 << 20, &c, &HashMap::new(), Decision::Write),
            Decision::Read
        );
        let mut b = BytesMut::new();
        parse(&mut b, b"", "SELECT 1");
        parse(&mut b, b"", "DELETE FROM t");
        sync(&mut b);
        assert_eq!(
            unit_decision(&b, 1 << 20, &c, &HashMap::new(), Decision::Write),
            Decision::Write
        );
    }

    #[test]
    fn an_unfinished_unit_goes_to_the_primary() {
        let c = classifier();
        let mut b = BytesMut::new();
        parse(&mut b, b"", "SELECT 1");
        assert_eq!(
            unit_decision(&b, 1 << 20, &c, &HashMap::new(), Decision::Read),
            Decision::Write
        );
        let mut b = BytesMut::new();
        put_query(&mut b, "SELECT 1");
        b.truncate(b.len() - 1);
        assert_eq!(
            unit_decision(&b, 1 << 20, &c, &HashMap::new(), Decision::Read),
            Decision::Write
        );
    }

    #[test]
    fn bind_of_a_known_statement_uses_its_decision() {
        let c = classifier();
        let reg = super::super::statements::StatementRegistry::default();
        let mut stmts = HashMap::new();
        stmts.insert(
            b"s1".to_vec(),
            reg.statement(b"SELECT 1\0\0\0", b"SELECT 1", Decision::Read),
        );
        let mut b = BytesMut::new();
        put_bind(&mut b, b"", b"s1", b"\0\0\0\0\0\0");
        sync(&mut b);
        assert_eq!(
            unit_decision(&b, 1 << 20, &c, &stmts, Decision::Write),
            Decision::Read
        );
        let mut b = BytesMut::new();
        put_bind(&mut b, b"", b"nope", b"\0\0\0\0\0\0");
        sync(&mut b);
        assert_eq!(
            unit_decision(&b, 1 << 20, &c, &stmts, Decision::Read),
            Decision::Write
        );
    }
}
