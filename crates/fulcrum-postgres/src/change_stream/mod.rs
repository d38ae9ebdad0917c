//! The change streams of a PostgreSQL cluster's result cache
//! (`[cluster.cache] invalidation = "stream"`; docs/routing.md, "Cache"):
//! the supervisor, which starts one stream per database the cache asks for
//! (`Cache::wanted_streams`), and each database's loop, which keeps a
//! stream (`session`) on the current primary, tells the cache when it is
//! up or down, and reconnects after a short backoff. It owns the streams'
//! state changes and their log lines; the wire side is `session`, the
//! messages' bytes `codec::replication`.
//!
//! A database is served from the cache only while its stream is up: on
//! any error, a lost connection or a new primary it goes down (its entries
//! drop) until the stream is back. A primary without `wal_level =
//! logical` cannot give one: the cache then falls back to Fulcrum's own
//! writes (`Cache::without_stream`), said once.

mod session;

use std::sync::Arc;
use std::time::Duration;

use fulcrum_cache::Cache;
use fulcrum_pool::{BackendId, Router};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backend::{Credential, ServerTarget, ServerTlsTarget};
use crate::frontend::ClusterContext;
use session::{Ended, Session};

pub use session::APPLICATION_NAME;

/// How often the supervisor asks the cache for databases to stream.
const SUPERVISE_EVERY: Duration = Duration::from_millis(50);
/// Reconnection backoff: from this, doubling, up to `BACKOFF_MAX`.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Retry after a refusal for want of the REPLICATION privilege.
const NO_PRIVILEGE_RETRY: Duration = Duration::from_secs(30);

/// What every stream of one cluster shares.
struct Shared {
    cluster: Arc<str>,
    cache: Cache,
    router: Arc<Router>,
    /// Per backend: where and as whom (the health user) to connect; the
    /// database is set per stream.
    targets: Vec<ServerTarget>,
    timeout: Duration,
    /// Client database name to server database name (`[[cluster.database]]`).
    server_names: Vec<(String, String)>,
}

/// Starts `ctx`'s change streams when its cache wants them (PostgreSQL,
/// `invalidation = "stream"`), until its health loop stops (start that
/// first). The supervisor holds what the streams need, not the context.
pub fn start(ctx: &Arc<ClusterContext>) -> Option<JoinHandle<()>> {
    let cache = ctx.cache.clone()?;
    if !cache.uses_streams() {
        return None;
    }
    let stop = ctx.health_stopped()?;
    let config = &ctx.config;
    let targets = config
        .backends
        .iter()
        .enumerate()
        .map(|(i, b)| ServerTarget {
            address: ctx.backends[i].clone(),
            user: config.health.user.clone(),
            credential: Credential::Password(config.health.password.clone()),
            database: String::new(),
            allow_cleartext: config.server_cleartext,
            tls: ServerTlsTarget::from_config(&b.tls),
        })
        .collect();
    let shared = Arc::new(Shared {
        cluster: config.name.as_str().into(),
        cache,
        router: ctx.router.clone(),
        targets,
        timeout: config.connect_timeout,
        server_names: config
            .databases
            .iter()
            .map(|d| (d.name.clone(), d.server_database.clone()))
            .collect(),
    });
    Some(tokio::spawn(supervise(shared, stop)))
}

/// Whether `stop` says stop (or its sender is gone).
fn stopping(stop: &watch::Receiver<bool>) -> bool {
    *stop.borrow() || stop.has_changed().is_err()
}

/// Starts a stream for each database the cache asks for, until stopped or
/// the cache no longer uses streams; then ends them.
async fn supervise(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut streams: Vec<(Arc<str>, JoinHandle<()>)> = Vec::new();
    while !stopping(&stop) && shared.cache.uses_streams() {
        for database in shared.cache.wanted_streams() {
            let task = tokio::spawn(stream_database(
                shared.clone(),
                database.clone(),
                stop.clone(),
            ));
            streams.push((database, task));
        }
        tokio::select! {
            _ = tokio::time::sleep(SUPERVISE_EVERY) => {}
            _ = stop.changed() => {}
        }
    }
    for (database, task) in streams {
        task.abort();
        shared.cache.set_stream_up(&database, false);
    }
}

/// Keeps `database`'s stream up on the current primary until stopped.
async fn stream_database(shared: Arc<Shared>, database: Arc<str>, mut stop: watch::Receiver<bool>) {
    let cluster = &shared.cluster;
    let server_database = shared
        .server_names
        .iter()
        .find(|(name, _)| **name == *database)
        .map_or(&*database, |(_, server)| server.as_str())
        .to_owned();
    let mut backoff = BACKOFF_MIN;
    // The last failure logged, so a stream failing the same way at every
    // retry says so once.
    let mut last_failure: Option<String> = None;
    while !stopping(&stop) && shared.cache.uses_streams() {
        let Some(primary) = shared.router.primary() else {
            let reason = "no primary".to_owned();
            if last_failure.as_ref() != Some(&reason) {
                tracing::warn!(cluster = %cluster, database = %database, "cache change stream waits: no primary; the database is not served from the cache");
                last_failure = Some(reason);
            }
            match wait_retry(&mut stop, backoff, &shared.router, None).await {
                Wake::Stopped => break,
                Wake::Moved => backoff = BACKOFF_MIN,
                Wake::Elapsed => backoff = (backoff * 2).min(BACKOFF_MAX),
            }
            continue;
        };
        let mut target = shared.targets[primary].clone();
        target.database = server_database.clone();
        let session = Session {
            target,
            timeout: shared.timeout,
            primary,
            router: &shared.router,
            cache: &shared.cache,
            database: &database,
        };
        let mut was_up = false;
        let ended = session
            .run(&mut stop, || {
                was_up = true;
                shared.cache.set_stream_up(&database, true);
                tracing::info!(cluster = %cluster, database = %database, server = %shared.targets[primary].address, "cache change stream up: the database is served from the cache");
            })
            .await;
        shared.cache.set_stream_up(&database, false);
        if was_up {
            backoff = BACKOFF_MIN;
            last_failure = None;
        }
        let pause = match ended {
            Ended::Stopped => break,
            Ended::NoLogical(reason) => {
                tracing::warn!(cluster = %cluster, database = %database, %reason, "the primary cannot give the cache a change stream (wal_level must be logical): the cache falls back to invalidation by the writes that pass through Fulcrum only, as with invalidation = \"proxy\"; a write made directly on the server is seen only when the entry's TTL runs out");
                shared.cache.without_stream();
                break;
            }
            Ended::NoPrivilege(reason) => {
                if last_failure.as_ref() != Some(&reason) {
                    tracing::warn!(cluster = %cluster, database = %database, %reason, user = %shared.targets[primary].user, "the health user may not start the cache's change stream: grant it REPLICATION (ALTER ROLE <health_user> REPLICATION); until then the database is not served from the cache (retried every 30 s)");
                    last_failure = Some(reason);
                }
                NO_PRIVILEGE_RETRY
            }
            Ended::PrimaryMoved => {
                tracing::info!(cluster = %cluster, database = %database, "cache change stream down: the primary changed; reconnecting to the new one (the database is not served from the cache meanwhile)");
                last_failure = None;
                BACKOFF_MIN
            }
            Ended::Failed(reason) => {
                if was_up || last_failure.as_ref() != Some(&reason) {
                    tracing::warn!(cluster = %cluster, database = %database, %reason, "cache change stream down: the database is not served from the cache until it is back");
                    last_failure = Some(reason);
                }
                backoff
            }
        };
        match wait_retry(&mut stop, pause, &shared.router, Some(primary)).await {
            Wake::Stopped => break,
            Wake::Moved => backoff = BACKOFF_MIN,
            Wake::Elapsed => backoff = (backoff * 2).min(BACKOFF_MAX),
        }
    }
    shared.cache.set_stream_up(&database, false);
}

/// How a wait before the next try ended.
#[derive(Debug, PartialEq, Eq)]
enum Wake {
    /// Told to stop.
    Stopped,
    /// The router named a primary other than the one the last try was for.
    Moved,
    /// The pause ran out.
    Elapsed,
}

/// Sleeps `d` before the next try, unless stopped first or the router names
/// a primary other than `seen` (the one the last try was for; `None` when
/// there was none): a failover ends the backoff at once, so the stream
/// follows the new primary without waiting out a pause (up to
/// `BACKOFF_MAX`) that began while the old one was down.
async fn wait_retry(
    stop: &mut watch::Receiver<bool>,
    d: Duration,
    router: &Router,
    seen: Option<BackendId>,
) -> Wake {
    tokio::select! {
        _ = tokio::time::sleep(d) => if stopping(stop) { Wake::Stopped } else { Wake::Elapsed },
        changed = stop.changed() => {
            if changed.is_err() || *stop.borrow() { Wake::Stopped } else { Wake::Elapsed }
        }
        Some(_) = router.wait_primary(seen, d) => Wake::Moved,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A retry pause ends as soon as the router names another primary; it
    /// runs its course while the primary stays the same (or none is named).
    #[tokio::test(start_paused = true)]
    async fn a_new_primary_ends_the_backoff() {
        let router = Arc::new(Router::new(0, 2, &[1], false));
        let (_tx, mut stop) = watch::channel(false);
        let start = tokio::time::Instant::now();
        let wake = wait_retry(&mut stop, BACKOFF_MAX, &router, Some(0)).await;
        assert_eq!((wake, start.elapsed()), (Wake::Elapsed, BACKOFF_MAX));

        router.set_primary(None);
        let promote = {
            let router = router.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                router.set_primary(Some(1));
            })
        };
        let start = tokio::time::Instant::now();
        let wake = wait_retry(&mut stop, BACKOFF_MAX, &router, None).await;
        assert_eq!(
            (wake, start.elapsed()),
            (Wake::Moved, Duration::from_millis(300))
        );
        promote.await.unwrap();
        // Already moved away from the old one: no wait at all.
        let wake = wait_retry(&mut stop, BACKOFF_MAX, &router, Some(0)).await;
        assert_eq!(wake, Wake::Moved);
        assert_eq!(start.elapsed(), Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_the_backoff() {
        let router = Router::new(0, 2, &[1], false);
        let (tx, mut stop) = watch::channel(false);
        tx.send(true).unwrap();
        let wake = wait_retry(&mut stop, BACKOFF_MAX, &router, Some(0)).await;
        assert_eq!(wake, Wake::Stopped);
    }
}
