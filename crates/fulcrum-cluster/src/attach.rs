//! Checking out a server connection for a unit of work, written once for
//! both protocols. A unit that may read on a replica tries the one the
//! router picks (unless it is a retry avoiding that one): a replica that
//! cannot be reached is made suspect, one that refuses the login is left
//! out of reads for a while, one that has no connection to give is
//! skipped, and one behind the client's read position (the protocol's
//! `fits`) is given back. Then the primary, waited for during a failover
//! (`fulcrum_pool::PrimaryWait`), with the pool-wait metrics counted. The
//! clock is read only when a checkout had to wait: an idle connection at
//! hand costs no read, and its wait is counted as zero.
//!
//! The protocol supplies the checkout itself (its pool, the client's
//! session state) and says what each of its errors means; an error the
//! client must see is answered by the protocol, in its words.

use std::future::Future;
use std::time::{Duration, Instant};

use fulcrum_pool::{BackendId, Checkout, Pool, Poolable, PrimaryWait, Route};

use crate::context::ClusterCore;

/// How long a replica that refused a login is left out of reads.
pub const REPLICA_BAN: Duration = Duration::from_secs(5);

/// What a failed checkout means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The backend cannot be reached, or takes no connections now: a
    /// replica is made suspect, the primary is waited for.
    Down(String),
    /// It refused this login: a replica is left out of reads for
    /// [`REPLICA_BAN`].
    Refused(String),
    /// Anything else: a replica is skipped; on the primary, the client is
    /// answered.
    Other,
}

/// The protocol's side of a checkout.
pub trait Checkouts {
    type Conn;
    type Error;
    /// A connection of `backend` for this client, its session state applied.
    fn checkout(
        &mut self,
        backend: BackendId,
    ) -> impl Future<Output = Result<Self::Conn, Self::Error>>;
    /// What `error` from `backend` means, on the primary or on a replica.
    fn failure(&self, backend: BackendId, error: &Self::Error, primary: bool) -> Failure;
    /// Whether a replica's connection may serve the unit (its read
    /// position); one that may not is given back.
    fn fits(&mut self, backend: BackendId, conn: &mut Self::Conn) -> impl Future<Output = bool>;
    /// Gives back a connection the unit does not use.
    fn give_back(&mut self, conn: Self::Conn);
    /// A replica refused the login: drop the client's pool there if it
    /// holds nothing.
    fn forget(&mut self, _backend: BackendId) {}
    /// A checkout of the primary waited `waited` (counted as the
    /// cluster's `pool_wait`, for the client's own figures).
    fn waited(&mut self, _waited: Duration) {}
}

/// Why no connection was attached.
#[derive(Debug)]
pub enum Unattached<E> {
    /// No primary took it within `pool_timeout`: the last reason.
    NoPrimary(String),
    /// The primary's answer, for the client.
    Final(E),
}

/// A connection attached for a unit.
#[derive(Debug)]
pub struct Attached<C> {
    pub backend: BackendId,
    pub conn: C,
    /// When the checkout ended, if it had to wait (the clock was read
    /// then); `None`: a connection was at hand, at the time the unit
    /// already holds.
    pub waited_until: Option<Instant>,
}

/// A wait: from the first time a future could not finish to its end.
#[derive(Debug, Clone, Copy)]
struct Wait {
    from: Instant,
    until: Instant,
}

/// Polls `f` to its end; when it had to wait, from when to when (the
/// clock is read only then). `f` is pinned by the caller: an `async fn`
/// taking the future by value would hold it twice in its state (the
/// argument, and the pinned copy it polls), and every client's session
/// task carries that state's size (issue 44: memory per idle client).
async fn clocked<F: Future>(mut f: std::pin::Pin<&mut F>) -> (F::Output, Option<Wait>) {
    let mut from = None;
    let out = std::future::poll_fn(|cx| {
        let p = f.as_mut().poll(cx);
        if p.is_pending() && from.is_none() {
            from = Some(Instant::now());
        }
        p
    })
    .await;
    let wait = from.map(|from| Wait {
        from,
        until: Instant::now(),
    });
    (out, wait)
}

/// A connection for a unit of `route` (a `Replica` route falls back to the
/// primary), and its backend. `avoid` is the replica a retried read must
/// not go back to. Any wait on the way (a checkout, a replica's position
/// check, a failover's wait for the primary) sets `waited_until`.
pub async fn attach<K: Checkouts, C, P, S>(
    core: &ClusterCore<C, P, S>,
    route: Route,
    avoid: Option<BackendId>,
    k: &mut K,
) -> Result<Attached<K::Conn>, Unattached<K::Error>> {
    attach_picked(core, core.router.pick(route), avoid, k).await
}

/// [`attach`] with the router's pick for the unit's route made already
/// (`picked`: `Router::pick`'s answer): a protocol that looked for a
/// connection at hand on the picked backend first goes on from that same
/// pick, so a read's balancing moves once a unit.
pub async fn attach_picked<K: Checkouts, C, P, S>(
    core: &ClusterCore<C, P, S>,
    picked: Option<BackendId>,
    avoid: Option<BackendId>,
    k: &mut K,
) -> Result<Attached<K::Conn>, Unattached<K::Error>> {
    let attaching = std::pin::pin!(attach_to(core, picked, avoid, k));
    let (attached, waited) = clocked(attaching).await;
    attached.map(|(backend, conn)| Attached {
        backend,
        conn,
        waited_until: waited.map(|w| w.until),
    })
}

/// [`attach`]'s common case without a future (whose state a unit would
/// copy about 400 instructions' worth of): the unit goes to the primary (a
/// write, or a read in a cluster of one), it avoids no backend, and an idle
/// connection of `pool` (the client's pool on the primary, if that is the
/// one it holds) is ready at once and `ready` for the client as it is.
/// `None` leaves the unit to [`attach`]. The caller holds the unit's
/// admission past the pause gate.
pub fn at_once<C: Poolable, P, S>(
    core: &ClusterCore<C, P, S>,
    route: Route,
    avoid: Option<BackendId>,
    pool: Option<&(BackendId, Pool<C>)>,
    ready: impl FnOnce(&C) -> bool,
) -> Option<(BackendId, Checkout<C>)> {
    let router = &core.router;
    if avoid.is_some() || (route == Route::Replica && router.backend_count() > 1) {
        return None;
    }
    let primary = router.primary()?;
    let (_, pool) = pool.filter(|(b, _)| *b == primary)?;
    ready_at_hand(core, pool, true, ready).map(|conn| (primary, conn))
}

/// An idle connection of `pool` taken without waiting (`Pool::try_get`:
/// none due a check) when `ready` says it serves the unit as it is, else
/// given back; both protocols' synchronous attach ends here. On the
/// `primary` it counts as a pool wait of zero, as the full way counts a
/// checkout that did not wait (a replica's checkouts are not counted).
#[inline]
pub fn ready_at_hand<C: Poolable, P, S>(
    core: &ClusterCore<C, P, S>,
    pool: &Pool<C>,
    primary: bool,
    ready: impl FnOnce(&C) -> bool,
) -> Option<Checkout<C>> {
    let conn = pool.try_get()?;
    if !ready(&conn) {
        conn.release();
        return None;
    }
    if primary {
        core.metrics.pool_wait.observe(0.0);
    }
    Some(conn)
}

async fn attach_to<K: Checkouts, C, P, S>(
    core: &ClusterCore<C, P, S>,
    picked: Option<BackendId>,
    avoid: Option<BackendId>,
    k: &mut K,
) -> Result<(BackendId, K::Conn), Unattached<K::Error>> {
    if let Some(b) = picked {
        if !core.router.is_primary(b) && avoid != Some(b) {
            match k.checkout(b).await {
                Ok(mut conn) => {
                    if k.fits(b, &mut conn).await {
                        return Ok((b, conn));
                    }
                    k.give_back(conn);
                }
                Err(e) => match k.failure(b, &e, false) {
                    Failure::Down(why) => {
                        tracing::warn!(replica = %core.address(b), error = %why, "replica unreachable; reads go elsewhere until the health check admits it again");
                        core.router.suspect(b);
                    }
                    Failure::Refused(why) => {
                        tracing::warn!(replica = %core.address(b), error = %why, "replica refused the connection; using the primary");
                        k.forget(b);
                        core.router.ban(b, REPLICA_BAN);
                    }
                    Failure::Other => {}
                },
            }
        }
    }
    let deadline =
        tokio::time::Instant::from_std(fulcrum_pool::coarse::now()) + core.config.pool_timeout;
    let mut primaries = PrimaryWait::new(&core.router, deadline, false);
    while let Some((primary, _)) = primaries.next().await {
        core.metrics.waiting.inc();
        let (got, waited) = {
            let checkout = std::pin::pin!(k.checkout(primary));
            clocked(checkout).await
        };
        core.metrics.waiting.dec();
        let took = waited.map_or(Duration::ZERO, |w| {
            w.until.saturating_duration_since(w.from)
        });
        core.metrics.pool_wait.observe(took.as_secs_f64());
        k.waited(took);
        match got {
            Ok(conn) => return Ok((primary, conn)),
            Err(e) => match k.failure(primary, &e, true) {
                Failure::Down(why) => primaries.down(primary, why),
                _ => return Err(Unattached::Final(e)),
            },
        }
    }
    Err(Unattached::NoPrimary(primaries.why().unwrap_or_else(
        || no_primary_reason(&core.router, core.address(core.router.last_primary())),
    )))
}

/// Why no primary took the work when no checkout failed: this instance is
/// cut off from its coordinator (its lease on the primary ran out; the
/// primary itself may well be up), or the primary is down.
fn no_primary_reason(router: &fulcrum_pool::Router, primary: &str) -> String {
    if router.primary_expired() {
        format!("this instance is cut off from its coordinator (no word from it within its lease), so it sends no writes to the primary it last knew ({primary}), which may well be up; writes resume when the coordinator answers again (on_coordinator_loss)")
    } else {
        format!("the primary {primary} is down")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_off_from_the_coordinator_is_not_called_down() {
        let router = fulcrum_pool::Router::new(0, 2, &[1], false);
        assert_eq!(no_primary_reason(&router, "p:1"), "the primary p:1 is down");
        router.set_primary_valid_until(Some(tokio::time::Instant::now()));
        // The router's clock counts in milliseconds.
        std::thread::sleep(Duration::from_millis(5));
        let why = no_primary_reason(&router, "p:1");
        assert!(
            why.contains("cut off from its coordinator") && !why.contains("is down"),
            "{why}"
        );
    }
}
