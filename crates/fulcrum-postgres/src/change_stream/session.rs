//! One change stream session: a replication connection (`replication =
//! database`) to one database on the primary as the health user, a
//! temporary `test_decoding` slot, `START_REPLICATION`, then every decoded
//! change line invalidates its tables until the connection ends, the
//! primary moves or the stream is told to stop. Keepalives are answered
//! and the position is confirmed every few seconds, so the slot advances
//! and `wal_sender_timeout` never fires.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use fulcrum_cache::{Cache, Source, Table};
use fulcrum_pool::BackendId;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::{connect_with, ConnectError, ServerConn, ServerTarget};
use crate::codec::backend_msg::parse_error_fields;
use crate::codec::check_frame;
use crate::codec::frontend_msg::put_query;
use crate::codec::replication::{
    decoded_tables, parse_stream_message, pg_now_micros, put_standby_status, StreamMessage,
};

/// How often the position is confirmed even with nothing asked (well
/// under the default `wal_sender_timeout` of 60 s).
const STATUS_EVERY: Duration = Duration::from_secs(10);
/// How often the primary is checked while the stream is quiet.
const PRIMARY_CHECK: Duration = Duration::from_millis(100);
/// The walsender's `application_name` (how `pg_stat_replication` names it).
pub const APPLICATION_NAME: &str = "fulcrum_cache";

/// How a session ended.
#[derive(Debug)]
pub(super) enum Ended {
    /// Told to stop (the health loop stopped).
    Stopped,
    /// The router's primary is no longer the one streamed from.
    PrimaryMoved,
    /// The primary cannot decode (`wal_level` is not `logical`).
    NoLogical(String),
    /// The health user may not replicate (SQLSTATE 42501).
    NoPrivilege(String),
    /// Anything else: connection lost, refused, an error from the server.
    Failed(String),
}

/// What a session needs to know.
pub(super) struct Session<'a> {
    pub target: ServerTarget,
    pub timeout: Duration,
    pub primary: BackendId,
    pub router: &'a fulcrum_pool::Router,
    pub cache: &'a Cache,
    /// The database as the cache names it (the sessions' database).
    pub database: &'a Arc<str>,
}

impl Session<'_> {
    /// Runs the session; `up` is called once the stream has started.
    pub async fn run(&self, stop: &mut watch::Receiver<bool>, up: impl FnOnce()) -> Ended {
        let extra = [
            ("replication", "database"),
            ("application_name", APPLICATION_NAME),
        ];
        let mut conn = match connect_with(&self.target, &extra, self.timeout).await {
            Ok(c) => c,
            Err(ConnectError::Server { fields, .. }) if fields.code == "42501" => {
                return Ended::NoPrivilege(fields.message)
            }
            Err(e) => return Ended::Failed(e.to_string()),
        };
        match conn.query_rows("SHOW wal_level").await {
            Ok(rows) => {
                let level = rows.first().and_then(|r| r.first().cloned().flatten());
                if level.as_deref() != Some("logical") {
                    return Ended::NoLogical(format!(
                        "wal_level is {}",
                        level.as_deref().unwrap_or("unknown")
                    ));
                }
            }
            Err(e) => return Ended::Failed(format!("SHOW wal_level: {e}")),
        }
        let slot = format!("fulcrum_cache_{:016x}", rand::random::<u64>());
        let create = format!(
            "CREATE_REPLICATION_SLOT {slot} TEMPORARY LOGICAL test_decoding NOEXPORT_SNAPSHOT"
        );
        if let Err(e) = conn.query_rows(&create).await {
            return match &e {
                crate::backend::internal::InternalError::Server { fields, .. } => {
                    match fields.code.as_str() {
                        "55000" => Ended::NoLogical(fields.message.clone()),
                        "42501" => Ended::NoPrivilege(fields.message.clone()),
                        _ => Ended::Failed(format!("creating slot {slot}: {e}")),
                    }
                }
                _ => Ended::Failed(format!("creating slot {slot}: {e}")),
            };
        }
        if let Err(e) = start_replication(&mut conn, &slot).await {
            return Ended::Failed(format!("START_REPLICATION: {e}"));
        }
        up();
        self.stream(&mut conn, stop).await
    }

    /// Reads the stream until it ends.
    async fn stream(&self, conn: &mut ServerConn, stop: &mut watch::Receiver<bool>) -> Ended {
        let mut received = 0u64;
        let mut next_status = Instant::now() + STATUS_EVERY;
        let mut out = BytesMut::new();
        loop {
            // Every frame read so far.
            loop {
                let h = match check_frame(&conn.io.read_buf, u32::MAX as u64) {
                    Ok(Some(h)) if conn.io.read_buf.len() >= h.total => h,
                    Ok(_) => break,
                    Err(e) => return Ended::Failed(format!("malformed frame: {e}")),
                };
                let frame = conn.io.read_buf.split_to(h.total);
                match h.tag {
                    b'd' => match parse_stream_message(&frame[5..]) {
                        Some(StreamMessage::XLogData { start, data, .. }) => {
                            self.invalidate(data);
                            received = received.max(start);
                        }
                        Some(StreamMessage::Keepalive { end, reply }) => {
                            received = received.max(end);
                            if reply {
                                next_status = Instant::now();
                            }
                        }
                        None => {}
                    },
                    b'E' => {
                        let f = parse_error_fields(&frame[5..]);
                        return Ended::Failed(format!("{}: {}", f.code, f.message));
                    }
                    b'c' => return Ended::Failed("the server ended the stream".into()),
                    _ => {}
                }
            }
            if self.router.primary() != Some(self.primary) {
                return Ended::PrimaryMoved;
            }
            if Instant::now() >= next_status {
                out.clear();
                put_standby_status(&mut out, received, pg_now_micros());
                if let Err(e) = conn.io.send(&out).await {
                    return Ended::Failed(format!("sending status: {e}"));
                }
                next_status = Instant::now() + STATUS_EVERY;
            }
            let wake = (Instant::now() + PRIMARY_CHECK).min(next_status);
            tokio::select! {
                read = conn.io.read_more() => match read {
                    Ok(0) => return Ended::Failed("the server closed the connection".into()),
                    Ok(_) => {}
                    Err(e) => return Ended::Failed(format!("connection lost: {e}")),
                },
                _ = tokio::time::sleep_until(wake) => {}
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return Ended::Stopped;
                    }
                }
            }
        }
    }

    /// Invalidates the tables a decoded line names (nothing for `BEGIN`,
    /// `COMMIT` and the like). A name is invalidated as the cache keys it
    /// (`fulcrum_cache::table`: what follows the last dot, lower case) and,
    /// when it holds a dot (a quoted `"a.b"`), whole as well.
    fn invalidate(&self, line: &[u8]) {
        let tables = decoded_tables(line);
        if tables.is_empty() {
            return;
        }
        let mut named: Vec<Table> = Vec::with_capacity(tables.len());
        for (_, name) in &tables {
            named.push(fulcrum_cache::table(self.database, name, false));
            if name.contains('.') {
                named.push((self.database.clone(), name.to_ascii_lowercase().into()));
            }
        }
        self.cache.invalidate(&named, Source::Stream);
    }
}

/// Sends `START_REPLICATION` and waits for CopyBothResponse.
async fn start_replication(conn: &mut ServerConn, slot: &str) -> Result<(), String> {
    let mut out = BytesMut::new();
    put_query(
        &mut out,
        &format!("START_REPLICATION SLOT {slot} LOGICAL 0/0"),
    );
    conn.io.send(&out).await.map_err(|e| e.to_string())?;
    loop {
        let h = match check_frame(&conn.io.read_buf, u32::MAX as u64) {
            Ok(Some(h)) if conn.io.read_buf.len() >= h.total => h,
            Ok(_) => {
                if conn.io.read_more().await.map_err(|e| e.to_string())? == 0 {
                    return Err("the server closed the connection".into());
                }
                continue;
            }
            Err(e) => return Err(e.to_string()),
        };
        let frame = conn.io.read_buf.split_to(h.total);
        match h.tag {
            b'W' => return Ok(()),
            b'E' => {
                let f = parse_error_fields(&frame[5..]);
                return Err(format!("{}: {}", f.code, f.message));
            }
            _ => {}
        }
    }
}
