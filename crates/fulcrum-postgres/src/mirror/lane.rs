//! One mirrored client's lane to one target: the task that owns the
//! target connection (opened at the first unit, again after a failure, at
//! most every `RETRY_AFTER` while the target is down), replays each unit's
//! frames, reads the answer to its end, and records the diff by digest.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fulcrum_config::MirrorMode;
use fulcrum_sql::{fingerprint, normalize, Dialect};
use tokio::sync::mpsc;

use super::{Batch, Lane, Outcome, Target, Unit};
use crate::backend::{connect, Credential, ServerConn, ServerTarget};
use crate::codec::frame::check_frame;
use crate::codec::frontend_msg::{bind_msg, parse_msg, query_text};
use crate::frontend::context::ClusterContext;

/// How long a target that refused a connection is left alone.
const RETRY_AFTER: Duration = Duration::from_secs(2);
/// How long one unit may take on the target before its connection is dropped.
const UNIT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest digest text kept (SHOW MIRROR).
const QUERY_TEXT_MAX: usize = 200;

/// Starts a lane for a client of `user` on `database` (`None`: the target
/// has no login for that user).
pub(super) fn start(
    ctx: &Arc<ClusterContext>,
    target: &Arc<Target>,
    user: &str,
    database: &str,
) -> Option<Lane> {
    let own = ctx
        .users
        .get(user)
        .map(|u| (u.server_user.as_str(), u.server_password.as_str()));
    let (login_user, password) = target.config.login_for(user, own)?;
    let server = ServerTarget {
        address: target.config.address.as_str().into(),
        user: login_user.to_owned(),
        credential: Credential::Password(password.to_owned()),
        database: ctx
            .config
            .server_database(database)
            .unwrap_or(database)
            .to_owned(),
        allow_cleartext: ctx.config.server_cleartext,
        tls: None,
    };
    let depth = match target.config.mirror_mode {
        MirrorMode::Async => target.config.mirror_queue as usize,
        MirrorMode::Sync => target.config.mirror_queue.max(1) as usize,
    };
    let (tx, rx) = mpsc::channel(depth);
    tokio::spawn(run(
        target.clone(),
        server,
        ctx.config.connect_timeout,
        ctx.name().to_owned(),
        rx,
    ));
    Some(Lane {
        target: target.clone(),
        tx,
        txn: Vec::new(),
        txn_bytes: 0,
        txn_writes: false,
    })
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

/// Counts `units` as dropped, by digest.
pub(super) fn dropped_units(target: &Target, units: &[Unit]) {
    for u in units {
        let (key, text) = digest_of(&u.frames, None);
        target.stats.dropped(key, &|| text.clone(), 1);
    }
}

/// The lane's task: until the client's session ends (its sender drops).
async fn run(
    target: Arc<Target>,
    server: ServerTarget,
    connect_timeout: Duration,
    cluster: String,
    mut rx: mpsc::Receiver<Batch>,
) {
    let mut conn: Option<ServerConn> = None;
    let mut down_until: Option<Instant> = None;
    // The client's statement names and their text (digests of Binds).
    let mut names: HashMap<Vec<u8>, String> = HashMap::new();
    while let Some(batch) = rx.recv().await {
        if conn.is_none() && down_until.is_none_or(|t| Instant::now() >= t) {
            match Box::pin(connect(&server, connect_timeout)).await {
                Ok(c) => {
                    conn = Some(c);
                    down_until = None;
                }
                Err(e) => {
                    tracing::debug!(cluster = %cluster, target = %target.config.name, error = %e, "mirror target refused a connection");
                    down_until = Some(Instant::now() + RETRY_AFTER);
                }
            }
        }
        for unit in &batch.units {
            remember_names(&unit.frames, &mut names);
            let (key, text) = digest_of(&unit.frames, Some(&names));
            let query = || text.clone();
            let Some(c) = conn.as_mut().filter(|_| !unit.skip) else {
                target.stats.dropped(key, &query, 1);
                continue;
            };
            let started = Instant::now();
            match tokio::time::timeout(UNIT_TIMEOUT, replay(c, &unit.frames)).await {
                Ok(Ok(outcome)) => {
                    let Some(primary) = unit.outcome else {
                        continue; // Fulcrum's own BEGIN: nothing to compare.
                    };
                    let mirror_us = started.elapsed().as_micros() as u64;
                    let differs = outcome != primary;
                    if target
                        .stats
                        .answered(key, &query, unit.primary_us, mirror_us, differs)
                    {
                        tracing::warn!(cluster = %cluster, target = %target.config.name, digest = %format!("{key:016x}"), query = %text, primary = %primary.describe(), mirror = %outcome.describe(), "mirror: the first answer of this digest that differs");
                    }
                }
                _ => {
                    tracing::debug!(cluster = %cluster, target = %target.config.name, "mirror connection lost or too slow; opened again at the next unit");
                    target.stats.dropped(key, &query, 1);
                    conn = None;
                }
            }
        }
        if let Some(done) = batch.done {
            let _ = done.send(());
        }
    }
}

/// Statement names a unit's Parse messages define.
fn remember_names(frames: &Bytes, names: &mut HashMap<Vec<u8>, String>) {
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
