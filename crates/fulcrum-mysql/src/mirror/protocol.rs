//! MySQL's part of mirroring (`fulcrum_cluster::mirror`): a connection to
//! the target as the client (its wire format and character set, its schema
//! at login), a command replayed as the client sent it and read to the end
//! of its answer (`Reply`), and a command known by the digest of its text.

use std::time::Duration;

use fulcrum_cluster::mirror::{MirrorProtocol, Target, Unit};
use fulcrum_sql::{fingerprint, normalize, Dialect};
use mysql_common::constants::CapabilityFlags as C;

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};

use super::Outcome;
use crate::backend::{connect, ServerConn, ServerTarget};
use crate::codec::command::{parse_prepare_ok, set_statement_id};
use crate::codec::packet::{scan_message, write_packet, HEADER_LEN, MAX_PAYLOAD};
use crate::frontend::context::MyClusterContext;
use crate::frontend::reply::{Reply, Shape};

/// Longest digest text kept (SHOW MIRROR).
const QUERY_TEXT_MAX: usize = 200;
/// Largest answer message read from the target.
const MESSAGE_MAX: usize = 1 << 30;

/// The way to one target for one client.
pub struct MyMirror {
    server: ServerTarget,
    schema: Option<String>,
    connect_timeout: Duration,
}

impl MyMirror {
    /// For a client of `user` (`None`: the target has no login for it).
    pub fn new(
        ctx: &MyClusterContext,
        target: &Target,
        user: &str,
        schema: Option<&str>,
        wire_format: C,
        charset: u8,
    ) -> Option<MyMirror> {
        let (login_user, password) = target.config.login_for(user)?;
        Some(MyMirror {
            server: ServerTarget {
                address: target.config.address.clone(),
                user: login_user.to_owned(),
                password: password.to_owned(),
                wire_format,
                charset,
                local_infile: false,
                track_gtid: false,
                tls: crate::backend::connect::ServerTls::from_config(&target.config.tls),
                native_stage1: None,
            },
            schema: schema.map(str::to_owned),
            connect_timeout: ctx.config.connect_timeout,
        })
    }
}

/// The answer's shape of a command (its first payload byte).
fn shape_of(command: u8) -> Shape {
    match command {
        0x04 => Shape::FieldList,
        0x09 => Shape::OnePacket,
        _ => Shape::Results,
    }
}

impl MirrorProtocol for MyMirror {
    type Conn = ServerConn;
    type Outcome = Outcome;
    /// Statements prepared on the target, by text: its id for each.
    type Memory = HashMap<Vec<u8>, u32>;

    async fn connect(&self) -> Result<ServerConn, String> {
        let mut conn = Box::pin(connect(&self.server, self.connect_timeout))
            .await
            .map_err(|e| e.to_string())?;
        if let Some(schema) = &self.schema {
            conn.use_schema(schema).await.map_err(|e| e.to_string())?;
        }
        Ok(conn)
    }

    async fn replay(
        &self,
        conn: &mut ServerConn,
        unit: &Unit<Outcome>,
        memory: &mut Self::Memory,
    ) -> std::io::Result<Outcome> {
        let command = unit.frames.get(HEADER_LEN).copied().unwrap_or(0);
        if command == COM_STMT_PREPARE {
            return execute_by_text(conn, &unit.frames, memory).await;
        }
        conn.io.send(&unit.frames).await?;
        read_answer(conn, shape_of(command)).await
    }

    fn digest(&self, frames: &[u8], _memory: Option<&mut Self::Memory>) -> (u64, String) {
        digest_of(frames)
    }

    fn describe(outcome: &Outcome) -> String {
        outcome.describe()
    }
}

const COM_STMT_PREPARE: u8 = 0x16;

/// A prepared statement's execute, mirrored by text: a COM_STMT_PREPARE of
/// `sql`, then the COM_STMT_EXECUTE `body` (its id set on the target).
pub(super) fn by_text(sql: &str, body: &[u8]) -> Bytes {
    let mut out = BytesMut::new();
    let mut prepare = vec![COM_STMT_PREPARE];
    prepare.extend_from_slice(sql.as_bytes());
    write_packet(&mut out, 0, &prepare);
    write_packet(&mut out, 0, body);
    out.freeze()
}

/// Replays a `by_text` unit: prepares the statement on the target the
/// first time (its own id, remembered), then executes it there.
async fn execute_by_text(
    conn: &mut ServerConn,
    frames: &[u8],
    prepared: &mut HashMap<Vec<u8>, u32>,
) -> std::io::Result<Outcome> {
    let bad = |what: &str| std::io::Error::other(what.to_owned());
    let prepare = scan_message(frames, MESSAGE_MAX)
        .ok()
        .flatten()
        .ok_or_else(|| bad("a malformed mirrored execute"))?;
    let sql = frames[HEADER_LEN + 1..prepare.total].to_vec();
    let id = match prepared.get(&sql) {
        Some(&id) => id,
        None => {
            conn.io.send(&frames[..prepare.total]).await?;
            let (first, outcome) = read_prepare(conn).await?;
            let Some(first) = first else {
                return Ok(outcome); // The target refused to prepare it.
            };
            let id = parse_prepare_ok(&first)
                .map_err(|e| bad(&e.to_string()))?
                .statement_id;
            prepared.insert(sql, id);
            id
        }
    };
    let mut body = frames[prepare.total + HEADER_LEN..].to_vec();
    set_statement_id(&mut body, id).map_err(|e| bad(&e.to_string()))?;
    let mut msg = BytesMut::with_capacity(body.len() + HEADER_LEN);
    write_packet(&mut msg, 0, &body);
    conn.io.send(&msg).await?;
    read_answer(conn, Shape::Results).await
}

/// Reads a COM_STMT_PREPARE's answer: its first message when it is the
/// statement's OK, else the error's outcome.
async fn read_prepare(conn: &mut ServerConn) -> std::io::Result<(Option<Vec<u8>>, Outcome)> {
    let mut reply = Reply::new(Shape::Prepare, conn.caps);
    let mut first = None;
    while !reply.is_done() {
        let frame = next_message(conn).await?;
        let payload = &frame[HEADER_LEN..];
        if first.is_none() {
            first = Some(payload.to_vec());
        }
        reply
            .on_message(payload)
            .map_err(|e| std::io::Error::other(e.0))?;
    }
    let mut outcome = Outcome::default();
    outcome.end(&reply);
    Ok(((!reply.error).then_some(first).flatten(), outcome))
}

/// The next whole message from the target.
async fn next_message(conn: &mut ServerConn) -> std::io::Result<BytesMut> {
    let span = loop {
        match scan_message(&conn.io.read_buf, MESSAGE_MAX) {
            Ok(Some(span)) => break span,
            Ok(None) => {
                if conn.io.read_more().await? == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
            }
            Err(e) => return Err(std::io::Error::other(e.to_string())),
        }
    };
    Ok(conn.io.read_buf.split_to(span.total))
}

/// Reads one command's answer to its end; its outcome.
async fn read_answer(conn: &mut ServerConn, shape: Shape) -> std::io::Result<Outcome> {
    {
        let mut reply = Reply::new(shape, conn.caps);
        let mut outcome = Outcome::default();
        while !reply.is_done() {
            let frame = next_message(conn).await?;
            let first =
                &frame[HEADER_LEN..HEADER_LEN + (frame.len() - HEADER_LEN).min(MAX_PAYLOAD)];
            let rows = reply.in_rows();
            reply
                .on_message(first)
                .map_err(|e| std::io::Error::other(e.0))?;
            if reply.wants_file() {
                return Err(std::io::Error::other("LOAD DATA LOCAL is not replayed"));
            }
            if rows && reply.in_rows() {
                outcome.row(first);
            }
        }
        outcome.end(&reply);
        Ok(outcome)
    }
}

/// A command's digest: a COM_QUERY's statement, else the command's name.
fn digest_of(frames: &[u8]) -> (u64, String) {
    // The first packet's payload (a mirrored execute has a second).
    let len = frames.get(..3).map_or(0, |h| {
        usize::from(h[0]) | usize::from(h[1]) << 8 | usize::from(h[2]) << 16
    });
    let payload = frames
        .get(HEADER_LEN..HEADER_LEN + len)
        .or_else(|| frames.get(HEADER_LEN..))
        .unwrap_or_default();
    match payload.split_first() {
        Some((&(0x03 | COM_STMT_PREPARE), text)) => {
            let text = String::from_utf8_lossy(&text[..text.len().min(MAX_PAYLOAD)]);
            (
                fingerprint(&text, Dialect::MySql),
                normalize(&text, Dialect::MySql, QUERY_TEXT_MAX),
            )
        }
        Some((&c, _)) => {
            let name = match c {
                0x02 => "COM_INIT_DB".to_owned(),
                0x04 => "COM_FIELD_LIST".to_owned(),
                0x09 => "COM_STATISTICS".to_owned(),
                c => format!("command 0x{c:02x}"),
            };
            (fingerprint(&name, Dialect::MySql), name)
        }
        None => (0, "(empty)".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_known_by_its_statement() {
        let text = b"SELECT c FROM sbtest1 WHERE id=7";
        let mut frame = vec![text.len() as u8 + 1, 0, 0, 0, 0x03];
        frame.extend_from_slice(text);
        let (key, text) = digest_of(&frame);
        assert_eq!(
            key,
            fingerprint("SELECT c FROM sbtest1 WHERE id=8", Dialect::MySql)
        );
        assert!(text.contains("sbtest1"), "{text}");
        let init = [2, 0, 0, 0, 0x02, b'd'];
        assert_eq!(digest_of(&init).1, "COM_INIT_DB");
        // A prepared execute mirrored by text: known by its statement, not
        // by its parameters.
        let one = by_text(
            "SELECT c FROM sbtest1 WHERE id=?",
            &[0x17, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 0, 7, 0, 0, 0],
        );
        let two = by_text(
            "SELECT c FROM sbtest1 WHERE id=?",
            &[0x17, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 0, 9, 0, 0, 0],
        );
        assert_eq!(digest_of(&one), digest_of(&two));
        assert!(digest_of(&one).1.contains("sbtest1"));
    }
}
