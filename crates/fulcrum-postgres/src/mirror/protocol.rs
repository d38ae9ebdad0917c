//! PostgreSQL's part of mirroring (`fulcrum_cluster::mirror`): a
//! connection to the target as the client, a unit's frames replayed as the
//! client sent them and read to their last ReadyForQuery, and a unit known
//! by the digest of its first statement (a Bind by the Parse it names).

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use fulcrum_cluster::mirror::{MirrorProtocol, Target, Unit};
use fulcrum_sql::{fingerprint, normalize, Dialect};

use super::Outcome;
use crate::backend::conn::SessionParams;
use crate::backend::{connect, Credential, ServerConn, ServerTarget};
use crate::codec::frame::check_frame;
use crate::codec::frontend_msg::{bind_msg, parse_msg, query_text};
use crate::frontend::context::ClusterContext;

/// Longest digest text kept (SHOW MIRROR).
const QUERY_TEXT_MAX: usize = 200;

/// The way to one target for one client.
pub struct PgMirror {
    server: ServerTarget,
    connect_timeout: Duration,
    /// The client's startup parameters, as statements run at connect.
    startup: String,
}

impl PgMirror {
    /// For a client of `user` on `database` (`None`: the target has no
    /// login for that user).
    pub fn new(
        ctx: &ClusterContext,
        target: &Target,
        user: &str,
        database: &str,
        startup: &SessionParams,
    ) -> Option<PgMirror> {
        let (login_user, password) = target.config.login_for(user)?;
        Some(PgMirror {
            server: ServerTarget {
                address: target.config.address.as_str().into(),
                user: login_user.to_owned(),
                credential: Credential::Password(password.to_owned()),
                database: ctx
                    .config
                    .server_database(database)
                    .unwrap_or(database)
                    .to_owned(),
                allow_cleartext: ctx.config.server_cleartext,
                tls: crate::backend::connect::ServerTlsTarget::from_config(&target.config.tls),
            },
            connect_timeout: ctx.config.connect_timeout,
            startup: startup.values().cloned().collect::<Vec<_>>().join(";"),
        })
    }
}

impl MirrorProtocol for PgMirror {
    type Conn = ServerConn;
    type Outcome = Outcome;
    /// The client's statement names and their text (digests of Binds).
    type Memory = HashMap<Vec<u8>, String>;

    async fn connect(&self) -> Result<ServerConn, String> {
        let mut conn = Box::pin(connect(&self.server, self.connect_timeout))
            .await
            .map_err(|e| e.to_string())?;
        if !self.startup.is_empty() {
            // The client's DateStyle, TimeZone, application_name, ...
            conn.run_internal(&self.startup)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(conn)
    }

    async fn replay(
        &self,
        conn: &mut ServerConn,
        unit: &Unit<Outcome>,
        _memory: &mut Self::Memory,
    ) -> std::io::Result<Outcome> {
        replay(conn, &unit.frames).await
    }

    fn digest(&self, frames: &[u8], memory: Option<&mut Self::Memory>) -> (u64, String) {
        match memory {
            Some(names) => {
                remember_names(frames, names);
                digest_of(frames, Some(names))
            }
            None => digest_of(frames, None),
        }
    }

    fn describe(outcome: &Outcome) -> String {
        outcome.describe()
    }
}
/// The digest of a unit, and its text for SHOW MIRROR: its first statement
/// (a Query's, a Parse's, or the statement a Bind names, from `names`).
fn digest_of(frames: &[u8], names: Option<&HashMap<Vec<u8>, String>>) -> (u64, String) {
    let mut at = 0;
    while let Ok(Some(h)) = check_frame(&frames[at..], u32::MAX as u64) {
        if at + h.total > frames.len() {
            break;
        }
        let body = &frames[at + 5..at + h.total];
        let text = match h.tag {
            b'Q' => query_text(body).and_then(|t| std::str::from_utf8(t).ok()),
            b'P' => parse_msg(body).and_then(|p| std::str::from_utf8(p.query).ok()),
            b'B' => bind_msg(body)
                .and_then(|b| names.and_then(|n| n.get(b.statement)))
                .map(String::as_str),
            _ => None,
        };
        if let Some(text) = text {
            return (
                fingerprint(text, Dialect::Postgres),
                normalize(text, Dialect::Postgres, QUERY_TEXT_MAX),
            );
        }
        at += h.total;
    }
    (0, "(a prepared statement)".to_owned())
}

/// Statement names a unit's Parse messages define.
fn remember_names(frames: &[u8], names: &mut HashMap<Vec<u8>, String>) {
    let mut at = 0;
    while let Ok(Some(h)) = check_frame(&frames[at..], u32::MAX as u64) {
        if at + h.total > frames.len() {
            break;
        }
        if h.tag == b'P' {
            if let Some(p) = parse_msg(&frames[at + 5..at + h.total]) {
                if !p.name.is_empty() && names.len() < 10_000 {
                    names.insert(
                        p.name.to_vec(),
                        String::from_utf8_lossy(p.query).into_owned(),
                    );
                }
            }
        }
        at += h.total;
    }
}

/// Sends a unit's frames and reads the answer to its last ReadyForQuery.
async fn replay(conn: &mut ServerConn, frames: &Bytes) -> std::io::Result<Outcome> {
    let mut owed = 0;
    let mut at = 0;
    while let Ok(Some(h)) = check_frame(&frames[at..], u32::MAX as u64) {
        if at + h.total > frames.len() {
            break;
        }
        if matches!(h.tag, b'Q' | b'S' | b'F') {
            owed += 1;
        }
        at += h.total;
    }
    conn.io.send(frames).await?;
    let mut outcome = Outcome::default();
    while owed > 0 {
        let h = loop {
            match check_frame(&conn.io.read_buf, u32::MAX as u64) {
                Ok(Some(h)) if conn.io.read_buf.len() >= h.total => break h,
                Ok(_) => {
                    if conn.io.read_more().await? == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                }
                Err(e) => return Err(std::io::Error::other(e.to_string())),
            }
        };
        let frame = conn.io.read_buf.split_to(h.total);
        match h.tag {
            b'Z' => owed -= 1,
            b'G' | b'H' | b'W' => {
                return Err(std::io::Error::other("COPY is not replayed"));
            }
            tag => outcome.observe(tag, &frame[5..]),
        }
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    use crate::codec::frontend_msg::{put_bind, put_parse, put_query};

    #[test]
    fn a_unit_is_known_by_its_first_statement() {
        let mut b = BytesMut::new();
        put_query(&mut b, "SELECT abalance FROM a WHERE aid = 7");
        let (key, text) = digest_of(&b, None);
        assert_eq!(
            key,
            fingerprint("SELECT abalance FROM a WHERE aid = 8", Dialect::Postgres)
        );
        assert_eq!(
            text,
            normalize(
                "SELECT abalance FROM a WHERE aid = 7",
                Dialect::Postgres,
                200
            )
        );
        // A Bind of a statement parsed in an earlier unit: known by name.
        let mut parse = BytesMut::new();
        put_parse(&mut parse, b"s1", b"UPDATE a SET x = $1\0\0\0");
        let mut names = HashMap::new();
        remember_names(&parse.freeze(), &mut names);
        let mut bind = BytesMut::new();
        put_bind(&mut bind, b"", b"s1", b"\0\0\0\0\0\0");
        assert_eq!(
            digest_of(&bind, Some(&names)).0,
            fingerprint("UPDATE a SET x = $1", Dialect::Postgres)
        );
        assert_eq!(digest_of(&bind, None).0, 0);
    }
}
