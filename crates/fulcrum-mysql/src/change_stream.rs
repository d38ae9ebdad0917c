//! The change stream of a MariaDB/MySQL cluster's result cache
//! (`[cluster.cache] invalidation = "stream"`; docs/routing.md, "Cache"):
//! the primary's binlog, read as a replica reads it (mysql_async's binlog
//! stream, under a server id of this instance's own), from its current end.
//! Every table a row event maps (`TABLE_MAP_EVENT`, which precedes each
//! row event in ROW format) is invalidated as it arrives; a statement
//! logged as text (DDL, or DML under `binlog_format` STATEMENT or MIXED)
//! invalidates the whole cache, since its text may name any database.
//!
//! One binlog serves every database: while the stream is up, each database
//! the cache asks for is served; on any error, a lost connection or a new
//! primary, every one goes down (its entries drop) until the stream is back
//! from the new end. A primary without a binlog cannot give one: the cache
//! then falls back to Fulcrum's own writes (`Cache::without_stream`).

use std::sync::Arc;
use std::time::Duration;

use fulcrum_cache::{Cache, Source};
use futures_util::StreamExt;
use mysql_async::binlog::events::EventData;
use mysql_async::prelude::Queryable;
use mysql_async::BinlogStreamRequest;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::frontend::MyClusterContext;

/// How often the loop takes the databases the cache asks for and checks
/// the primary, while the stream is quiet.
const TICK: Duration = Duration::from_millis(50);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Why a stream ended.
enum Ended {
    Stopped,
    PrimaryMoved,
    /// The primary writes no binlog: no stream can be had.
    NoBinlog,
    Failed(String),
}

/// Starts `ctx`'s binlog stream when its cache wants one, until its health
/// loop stops (start that first).
pub fn start(ctx: &Arc<MyClusterContext>) -> Option<JoinHandle<()>> {
    let cache = ctx.cache.clone()?;
    if !cache.uses_streams() {
        return None;
    }
    let stop = ctx.health_stopped()?;
    Some(tokio::spawn(run(ctx.clone(), cache, stop)))
}

/// Keeps the stream up on the current primary until stopped.
async fn run(ctx: Arc<MyClusterContext>, cache: Cache, mut stop: watch::Receiver<bool>) {
    let cluster = ctx.config.name.clone();
    // Its own id among the primary's replicas (a second dump with the same
    // id would end the first): random, away from the small ids operators use.
    let server_id = 0x4655_0000 | (rand::random::<u32>() & 0xffff);
    let mut served: Vec<Arc<str>> = Vec::new();
    let mut backoff = BACKOFF_MIN;
    let mut last_failure: Option<String> = None;
    while !*stop.borrow() && cache.uses_streams() {
        // The primary this try is for (`stream` reads the same).
        let seen = ctx.router.primary();
        let ended = stream(&ctx, &cache, server_id, &mut served, &mut stop).await;
        for db in &served {
            cache.set_stream_up(db, false);
        }
        let pause = match ended {
            Ended::Stopped => break,
            Ended::NoBinlog => {
                tracing::warn!(cluster = %cluster, "the primary writes no binlog (log_bin is off): the cache falls back to invalidation by the writes that pass through Fulcrum only, as with invalidation = \"proxy\"; a write made directly on the server is seen only when the entry's TTL runs out");
                cache.without_stream();
                break;
            }
            Ended::PrimaryMoved => {
                tracing::info!(cluster = %cluster, "cache binlog stream down: the primary changed; reconnecting to the new one (nothing is served from the cache meanwhile)");
                backoff = BACKOFF_MIN;
                BACKOFF_MIN
            }
            Ended::Failed(reason) => {
                if last_failure.as_ref() != Some(&reason) {
                    tracing::warn!(cluster = %cluster, %reason, "cache binlog stream down: nothing is served from the cache until it is back");
                    last_failure = Some(reason);
                }
                let pause = backoff;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                pause
            }
        };
        // A failover ends the pause at once: the stream follows the new
        // primary without waiting out a backoff that began while the old
        // one was down.
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => {}
            Some(_) = ctx.router.wait_primary(seen, pause) => backoff = BACKOFF_MIN,
        }
    }
    for db in &served {
        cache.set_stream_up(db, false);
    }
}

/// One stream from the primary's current binlog end: up once the server
/// has sent its first event, serving each database asked for meanwhile.
async fn stream(
    ctx: &MyClusterContext,
    cache: &Cache,
    server_id: u32,
    served: &mut Vec<Arc<str>>,
    stop: &mut watch::Receiver<bool>,
) -> Ended {
    let Some(primary) = ctx.router.primary() else {
        return Ended::Failed("no primary".into());
    };
    let Some(b) = ctx.config.backends.get(primary) else {
        return Ended::Failed("no such backend".into());
    };
    let health = &ctx.config.health;
    let connect =
        crate::backend::health::connect(&b.address, &b.tls, &health.user, &health.password, "");
    let mut conn = match tokio::time::timeout(ctx.config.connect_timeout, connect).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return Ended::Failed(format!("cannot log in as the health user: {e}")),
        Err(_) => return Ended::Failed("connect timed out".into()),
    };
    // Where the binlog ends now: the stream starts there.
    let status: Option<(String, u64)> = match conn
        .query_first::<mysql_async::Row, _>("SHOW MASTER STATUS")
        .await
    {
        Ok(row) => row.and_then(|r| Some((r.get::<String, _>(0)?, r.get::<u64, _>(1)?))),
        Err(e) => return Ended::Failed(format!("SHOW MASTER STATUS: {e}")),
    };
    let Some((file, position)) = status else {
        return Ended::NoBinlog;
    };
    let request = BinlogStreamRequest::new(server_id)
        .with_filename(file.as_bytes())
        .with_pos(position);
    let mut events = match conn.get_binlog_stream(request).await {
        Ok(s) => s,
        Err(e) => {
            return Ended::Failed(format!(
                "the binlog dump was refused (the health user needs REPLICATION SLAVE): {e}"
            ))
        }
    };
    let mut up = false;
    let mut tick = tokio::time::interval(TICK);
    loop {
        tokio::select! {
            event = events.next() => {
                let event = match event {
                    Some(Ok(event)) => event,
                    Some(Err(e)) => return Ended::Failed(format!("binlog stream: {e}")),
                    None => return Ended::Failed("the primary ended the binlog stream".into()),
                };
                if !up {
                    up = true;
                    for db in served.iter() {
                        cache.set_stream_up(db, true);
                    }
                    tracing::info!(cluster = %ctx.config.name, server = %b.address, file = %file, position, "cache binlog stream up: reads are served from the cache");
                }
                match event.read_data() {
                    Ok(Some(EventData::TableMapEvent(map))) => {
                        let table = fulcrum_cache::table(&map.database_name(), &map.table_name(), false);
                        cache.invalidate([&table], Source::Stream);
                    }
                    Ok(Some(EventData::QueryEvent(q))) if changes_data(&q.query()) => {
                        cache.invalidate_all(Source::Stream);
                    }
                    // Other events change nothing the cache keeps; one this
                    // library cannot read (MariaDB's own: GTID, annotations)
                    // is not a row change (those are mapped first).
                    _ => {}
                }
            }
            _ = tick.tick() => {
                for db in cache.wanted_streams() {
                    if up {
                        cache.set_stream_up(&db, true);
                    }
                    served.push(db);
                }
                if ctx.router.primary() != Some(primary) {
                    return Ended::PrimaryMoved;
                }
            }
            _ = stop.changed() => return Ended::Stopped,
        }
    }
}

/// A statement logged as text that may change data: not a transaction's
/// own BEGIN, COMMIT or XA markers, nor the comment-only dummy events
/// MariaDB sends a replica in place of its own event types (GTID lists,
/// annotations) that a MySQL-protocol reader does not ask for.
fn changes_data(query: &str) -> bool {
    let query = query.trim_start();
    if query.is_empty() || query.starts_with('#') {
        return false;
    }
    let first = query
        .split(|c: char| c.is_whitespace() || c == ';')
        .next()
        .unwrap_or("");
    !["BEGIN", "COMMIT", "XA", "SAVEPOINT", "ROLLBACK"]
        .iter()
        .any(|w| first.eq_ignore_ascii_case(w))
}

#[cfg(test)]
mod tests {
    use super::changes_data;

    #[test]
    fn transaction_markers_change_no_data() {
        assert!(!changes_data("BEGIN"));
        assert!(!changes_data("  commit;"));
        assert!(!changes_data("XA END 'x'"));
        assert!(!changes_data("# Dummy event replacing event type 160"));
        assert!(!changes_data(""));
        assert!(changes_data("ALTER TABLE t ADD c int"));
        assert!(changes_data("UPDATE t SET v = 1"));
    }
}
