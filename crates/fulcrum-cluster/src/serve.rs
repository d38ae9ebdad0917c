//! A client listener, the same for every protocol: accepts connections
//! (on its TCP socket and its Unix-domain socket when it has one, both
//! the same from here on),
//! admits them while they log in (at most `max_pending_logins` at once, the
//! oldest closed to make room, each within `client_login_timeout`), then
//! clients up to `max_client_connections` (the first cluster's settings
//! when several share the port); runs each session on its own task with a
//! `client` span, and on shutdown stops accepting and waits for the
//! sessions to end at a transaction boundary. With `workers` > 1 each
//! session runs on a worker event loop (`crate::workers`).
//!
//! What is the protocol's (logging a client in, refusing one in its
//! protocol's words, running the session) is the [`Frontend`] trait, which
//! each protocol's cluster context implements.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use fulcrum_metrics::ClientCount;
use fulcrum_net::{Accepted, ClientListener, ClientPeer, PendingLogins, PendingTicket};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;

use crate::clients::{self, ClientHandle};
use crate::context::ProtocolContext;
use crate::handover::{self, Arrival};

/// A connection that has sent nothing of its login for this long counts as
/// idle: at `max_pending_logins` it is the first to be closed.
const IDLE_GRACE: Duration = Duration::from_secs(1);

/// Why the listener turns a client away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Closed while logging in to make room for a newer connection
    /// (`max_pending_logins`).
    Crowded,
    /// Its login did not finish within `client_login_timeout`.
    TimedOut,
    /// Logged in, but `max_client_connections` clients are there already.
    Full,
}

/// How a client's task ended, as the listener logs it.
pub enum Ending<'a> {
    /// The client left (or went away).
    Left,
    /// Fulcrum refused it, and told it why.
    Refused(&'a str),
    /// Anything else (logged at debug level).
    Failed,
}

/// One protocol's part of a listener: what it does with a client the
/// listener accepted.
pub trait Frontend: ProtocolContext {
    /// A client's socket while it logs in.
    type Client: Send;
    /// What a finished login hands the session.
    type Login: Send;
    /// Why a login or a session ended other than cleanly.
    type Error: std::fmt::Display + Send;

    /// The socket just accepted (TCP or Unix), ready to log in.
    fn accept(stream: Accepted) -> Self::Client;

    /// Logs `client` in to one of `clusters` (those sharing the port, in
    /// config order): that cluster and the login, or `None` when the
    /// connection needed no session (a cancel request).
    fn login(
        clusters: &[Arc<Self>],
        client: &mut Self::Client,
        ticket: &PendingTicket,
    ) -> impl Future<Output = Result<Option<LoggedIn<Self>>, Self::Error>> + Send;

    /// Tells `client` why it is turned away (`login`: where it got that
    /// far), best effort.
    fn refuse(
        client: &mut Self::Client,
        login: Option<&Self::Login>,
        why: Refusal,
        message: &str,
    ) -> impl Future<Output = ()> + Send;

    /// The login's user and database (its schema, empty for none).
    fn identity(login: &Self::Login) -> (Arc<str>, Arc<str>);

    /// Runs the session of a logged-in client until it ends.
    fn run(
        ctx: Arc<Self>,
        client: Self::Client,
        login: Self::Login,
        entry: ClientHandle,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Resumes the session of a client the process this one replaced
    /// handed over (a binary upgrade, `crate::handover`): `head.state` is
    /// this protocol's snapshot of it; the client is not greeted again.
    fn resume(
        ctx: Arc<Self>,
        stream: Accepted,
        head: handover::ClientHead,
        entry: ClientHandle,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// How `error` ended the client's task.
    fn ending(error: &Self::Error) -> Ending<'_>;
}

/// The cluster a client logged in to, and its login.
pub type LoggedIn<F> = (Arc<F>, <F as Frontend>::Login);

/// Accepts clients on `listener` (its TCP and Unix sockets, under one
/// `max_client_connections` and `max_pending_logins`) until `shutdown`
/// turns true; the sockets close (the Unix socket's file removed) when
/// draining starts.
/// On shutdown, waits up to `drain` for the sessions to end at their next
/// transaction boundary. `current` has each cluster's context now, in
/// config order: a config reload swaps them, and each new client takes the
/// ones current when it connects. Listener settings are the first cluster's.
/// `arrivals` are the clients a binary upgrade's old process hands over
/// (`handover::inbox`), resumed here under the same `max_client_connections`.
pub async fn serve<F: Frontend>(
    current: Vec<watch::Receiver<Arc<F>>>,
    listener: ClientListener,
    mut arrivals: tokio::sync::mpsc::UnboundedReceiver<Arrival>,
    mut shutdown: watch::Receiver<bool>,
    drain: Duration,
) {
    let first = current[0].borrow().clone();
    let config = &first.core().config;
    let max = config.max_client_connections;
    let limit = Arc::new(Semaphore::new(max as usize));
    let pending = PendingLogins::new(
        config.max_pending_logins as usize,
        IDLE_GRACE,
        config.client_login_timeout / 3,
    );
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            Some(arrival) = arrivals.recv() => {
                resume(&current, arrival, &limit);
                continue;
            }
            _ = shutdown.changed() => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and friends: back off briefly rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if let Accepted::Tcp(tcp) = &stream {
            let _ = tcp.set_nodelay(true);
        }
        let clusters: Vec<Arc<F>> = current.iter().map(|c| c.borrow().clone()).collect();
        let ticket = pending.admit();
        let limit = limit.clone();
        // A debug-level span: disabled (and free) at the usual info level,
        // where entering it on every poll of the session costs measurably.
        let span = tracing::debug_span!(
            "client",
            cluster = %clusters[0].core().config.name,
            peer = %peer,
            user = tracing::field::Empty,
            database = tracing::field::Empty
        );
        crate::workers::spawn(stream, move |stream| {
            // The login and admission, boxed: what they hold (the login's
            // state, the listener's ticket, the clusters, the peer) is
            // freed when they end, and the client's task keeps only its
            // session.
            let admitted = Box::pin(admit(clusters, stream, peer, ticket, limit));
            handle(admitted).instrument(span)
        });
    }
    drop(listener);
    let name = &config.name;
    if let Some(keep) = handed_over() {
        // An upgrade: the next process accepts from now on; the clients
        // here stay until they leave, up to `upgrade_timeout`.
        let busy = max as usize - limit.available_permits();
        if busy > 0 {
            tracing::info!(cluster = %name, clients = busy, "upgrade: the clients connected here stay until they leave (up to {keep:?})");
        }
        if tokio::time::timeout(keep, limit.acquire_many(max))
            .await
            .is_ok()
        {
            tracing::info!(cluster = %name, "upgrade: every client connected here has left or moved");
            return;
        }
        let left = max as usize - limit.available_permits();
        tracing::info!(cluster = %name, clients = left, "upgrade_timeout reached: ending the clients still here at their next transaction boundary");
        if let Some(sink) = handover::sink() {
            sink.closed(left as u64);
        }
    }
    // Every session ends at its next transaction boundary.
    clients::registry().drain_all();
    let busy = max as usize - limit.available_permits();
    if busy > 0 {
        tracing::info!(cluster = %name, clients = busy, "draining: waiting up to {drain:?} for transactions in progress");
    }
    let drained = tokio::time::timeout(drain, limit.acquire_many(max)).await;
    match drained {
        Ok(_) => {
            tracing::info!(cluster = %name, "drained: every client left at a transaction boundary")
        }
        Err(_) => tracing::warn!(
            cluster = %name,
            clients = max as usize - limit.available_permits(),
            "shutdown_timeout reached: closing the clients still in a transaction"
        ),
    }
}

/// A client handed over by the old process: its session resumes on the
/// cluster it logged in to (a worker's loop, as an accepted one), counted
/// under `max_client_connections`; at the limit it is closed (it connects
/// again).
fn resume<F: Frontend>(
    current: &[watch::Receiver<Arc<F>>],
    arrival: Arrival,
    limit: &Arc<Semaphore>,
) {
    let Arrival { head, socket } = arrival;
    let ctx = current
        .iter()
        .map(|c| c.borrow().clone())
        .find(|c| c.core().config.name == head.cluster);
    let Some(ctx) = ctx else {
        tracing::warn!(cluster = %head.cluster, "upgrade: a handed-over client's cluster is not on this listener: closed");
        return;
    };
    let Ok(permit) = limit.clone().try_acquire_owned() else {
        tracing::warn!(cluster = %head.cluster, "upgrade: a handed-over client is over max_client_connections: closed");
        return;
    };
    let stream = match socket.into_tokio() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "upgrade: cannot take a handed-over client's socket");
            return;
        }
    };
    let span = tracing::debug_span!(
        "client",
        cluster = %head.cluster,
        peer = %head.peer,
        user = %head.user,
        database = %head.database,
        resumed = true
    );
    crate::workers::spawn(stream, move |stream| {
        async move {
            let _permit = permit;
            let core = ctx.core();
            let entry = clients::registry().register(
                &core.config.name,
                head.user.as_str().into(),
                head.database.as_str().into(),
                head.peer.clone(),
            );
            let _counted = core.metrics.client_connected();
            tracing::debug!("client handed over by the old process");
            match F::resume(ctx.clone(), stream, head, entry).await {
                Ok(()) => tracing::debug!("client left"),
                Err(e) => match F::ending(&e) {
                    Ending::Left => tracing::debug!("client left"),
                    Ending::Refused(reason) => tracing::info!(?reason, "client refused"),
                    Ending::Failed => tracing::debug!(error = %e, "client session ended"),
                },
            }
        }
        .instrument(span)
    });
}

/// The clients' stay after an upgrade handed the listeners over.
static HANDED_OVER: std::sync::Mutex<Option<Duration>> = std::sync::Mutex::new(None);

/// An upgrade handed this process's listeners to the next process: the
/// shutdown that follows stops accepting but lets connected clients stay
/// until they leave, up to `keep` (`upgrade_timeout`), before they are
/// ended at their next transaction boundary as on any shutdown.
pub fn hand_over(keep: Duration) {
    *HANDED_OVER.lock().unwrap_or_else(|e| e.into_inner()) = Some(keep);
}

fn handed_over() -> Option<Duration> {
    *HANDED_OVER.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a client's task stopped short.
enum Stop<E> {
    /// The listener refused it (and told it why).
    Refused(&'static str),
    /// The protocol's login or session ended with an error.
    Failed(E),
}

/// How a login ended.
enum LoginEnd<T> {
    Done(T),
    TimedOut,
    /// Closed to make room for a newer connection (`max_pending_logins`).
    Evicted,
}

/// A client logged in and admitted: what its session runs with, and what
/// it holds until the session ends (its place under
/// `max_client_connections`, its count in the clients gauge).
struct Admitted<F: Frontend> {
    ctx: Arc<F>,
    client: F::Client,
    login: F::Login,
    entry: ClientHandle,
    permit: OwnedSemaphorePermit,
    counted: ClientCount,
}

/// One accepted client: its login and admission (`admitted`, boxed by the
/// caller and freed when it ends), then its session. The task holds the
/// session's state and nothing of the login's (issue 44: memory per idle
/// client); how the session ended is logged with the peer and cluster of
/// its registry entry.
async fn handle<F: Frontend>(admitted: Pin<Box<impl Future<Output = Option<Admitted<F>>>>>) {
    let Some(Admitted {
        ctx,
        client,
        login,
        entry,
        permit,
        counted,
    }) = admitted.await
    else {
        return;
    };
    let who = entry.clone_entry();
    let r = F::run(ctx, client, login, entry).await;
    drop((permit, counted));
    match r {
        Ok(()) => tracing::debug!("client left"),
        Err(e) => ended::<F>(&e, &who.peer, &who.cluster),
    }
}

/// Logs why a client was turned away.
fn refused(peer: &ClientPeer, cluster: &str, reason: &str) {
    tracing::info!(%peer, %cluster, ?reason, "client refused");
}

/// Logs how a client's login or session ended with `error`.
fn ended<F: Frontend>(error: &F::Error, peer: &ClientPeer, cluster: &str) {
    match F::ending(error) {
        Ending::Left => tracing::debug!("client left"),
        Ending::Refused(reason) => refused(peer, cluster, reason),
        Ending::Failed => tracing::debug!(error = %error, "client session ended"),
    }
}

/// Logs an accepted client in and admits it ([`login_and_admit`]); a
/// refusal or a failed login is logged here. `None` when there is no
/// session to run.
async fn admit<F: Frontend>(
    clusters: Vec<Arc<F>>,
    stream: Accepted,
    peer: ClientPeer,
    ticket: PendingTicket,
    limit: Arc<Semaphore>,
) -> Option<Admitted<F>> {
    let first = clusters[0].clone();
    let cluster = &first.core().config.name;
    match login_and_admit(clusters, stream, peer.clone(), ticket, limit).await {
        Ok(Some(a)) => Some(a),
        Ok(None) => {
            tracing::debug!("client left");
            None
        }
        Err(Stop::Refused(reason)) => {
            refused(&peer, cluster, reason);
            None
        }
        Err(Stop::Failed(e)) => {
            ended::<F>(&e, &peer, cluster);
            None
        }
    }
}

/// Logs an accepted client in and admits it (`max_pending_logins`,
/// `client_login_timeout`, `max_client_connections`), registering it;
/// `None` when the connection needed no session (a cancel request).
async fn login_and_admit<F: Frontend>(
    clusters: Vec<Arc<F>>,
    stream: Accepted,
    peer: ClientPeer,
    ticket: PendingTicket,
    limit: Arc<Semaphore>,
) -> Result<Option<Admitted<F>>, Stop<F::Error>> {
    let mut client = F::accept(stream);
    let first = clusters[0].core();
    let end = tokio::select! {
        r = tokio::time::timeout(first.config.client_login_timeout, F::login(&clusters, &mut client, &ticket)) => match r {
            Ok(r) => LoginEnd::Done(r),
            Err(_) => LoginEnd::TimedOut,
        },
        _ = ticket.evicted() => LoginEnd::Evicted,
    };
    drop(ticket);
    let login = match end {
        LoginEnd::Done(r) => r.map_err(Stop::Failed)?,
        LoginEnd::Evicted => {
            let msg = format!(
                "fulcrum: too many connections logging in (max_pending_logins = {}); this one waited longest",
                first.config.max_pending_logins
            );
            F::refuse(&mut client, None, Refusal::Crowded, &msg).await;
            return Err(Stop::Refused(
                "closed while logging in to make room (max_pending_logins)",
            ));
        }
        LoginEnd::TimedOut => {
            first.metrics.timeout("login");
            let msg = format!(
                "fulcrum: login not finished within client_login_timeout ({:?})",
                first.config.client_login_timeout
            );
            F::refuse(&mut client, None, Refusal::TimedOut, &msg).await;
            return Err(Stop::Refused("login timed out"));
        }
    };
    let Some((ctx, login)) = login else {
        return Ok(None);
    };
    let core = ctx.core();
    let Ok(permit) = limit.try_acquire_owned() else {
        let msg = format!(
            "fulcrum: too many client connections (max_client_connections = {})",
            core.config.max_client_connections
        );
        F::refuse(&mut client, Some(&login), Refusal::Full, &msg).await;
        return Err(Stop::Refused("too many client connections"));
    };
    let (user, database) = F::identity(&login);
    let span = tracing::Span::current();
    span.record("user", &*user);
    span.record("database", &*database);
    tracing::debug!("client logged in");
    let entry = clients::registry().register(&core.config.name, user, database, peer);
    // Counted until the session ends, however it ends (a panic included).
    let counted = core.metrics.client_connected();
    Ok(Some(Admitted {
        ctx: ctx.clone(),
        client,
        login,
        entry,
        permit,
        counted,
    }))
}
