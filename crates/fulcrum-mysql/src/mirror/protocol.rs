//! MySQL's part of mirroring (`fulcrum_cluster::mirror`): a connection to
//! the target as the client (its wire format and character set, its schema
//! at login), a command replayed as the client sent it and read to the end
//! of its answer (`Reply`), and a command known by the digest of its text.

use std::time::Duration;

use fulcrum_cluster::mirror::{MirrorProtocol, Target, Unit};
use fulcrum_sql::{fingerprint, normalize, Dialect};
use mysql_common::constants::CapabilityFlags as C;

use super::Outcome;
use crate::backend::{connect, ServerConn, ServerTarget};
use crate::codec::packet::{scan_message, HEADER_LEN, MAX_PAYLOAD};
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
        let own = ctx
            .server_logins
            .get(user)
            .map(|(u, p)| (u.as_str(), p.as_str()));
        let (login_user, password) = target.config.login_for(user, own)?;
        Some(MyMirror {
            server: ServerTarget {
                address: target.config.address.clone(),
                user: login_user.to_owned(),
                password: password.to_owned(),
                wire_format,
                charset,
                local_infile: false,
                track_gtid: false,
                tls: None,
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
    type Memory = ();

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
        _memory: &mut (),
    ) -> std::io::Result<Outcome> {
        let command = unit.frames.get(HEADER_LEN).copied().unwrap_or(0);
        conn.io.send(&unit.frames).await?;
        let mut reply = Reply::new(shape_of(command), conn.caps);
        let mut outcome = Outcome::default();
        while !reply.is_done() {
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
            let frame = conn.io.read_buf.split_to(span.total);
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

    fn digest(&self, frames: &[u8], _memory: Option<&mut ()>) -> (u64, String) {
        digest_of(frames)
    }

    fn describe(outcome: &Outcome) -> String {
        outcome.describe()
    }
}

/// A command's digest: a COM_QUERY's statement, else the command's name.
fn digest_of(frames: &[u8]) -> (u64, String) {
    let payload = frames.get(HEADER_LEN..).unwrap_or_default();
    match payload.split_first() {
        Some((0x03, text)) => {
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
        let mut frame = vec![0, 0, 0, 0, 0x03];
        frame.extend_from_slice(b"SELECT c FROM sbtest1 WHERE id=7");
        let (key, text) = digest_of(&frame);
        assert_eq!(
            key,
            fingerprint("SELECT c FROM sbtest1 WHERE id=8", Dialect::MySql)
        );
        assert!(text.contains("sbtest1"), "{text}");
        let init = [0, 0, 0, 0, 0x02, b'd'];
        assert_eq!(digest_of(&init).1, "COM_INIT_DB");
    }
}
