//! A listener of one cluster, or of several sharing the port (the
//! client's database picks one): admits connections while they log in (at
//! most `max_pending_logins` at once, the oldest closed to make room), then
//! clients up to `max_client_connections` (the first cluster's settings);
//! runs each session on its own task, and stops accepting on shutdown.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use fulcrum_net::{PendingLogins, PendingTicket};
use fulcrum_tls::ClientStream;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tracing::Instrument;

use super::context::ClusterContext;
use super::error::SessionError;
use super::login::login;
use super::session::Session;
use crate::codec::backend_msg::{self, sqlstate};

/// A connection that has sent nothing of its login for this long counts as
/// idle: at `max_pending_logins` it is the first to be closed.
const IDLE_GRACE: Duration = Duration::from_secs(1);

/// Accepts clients on `listener` until `shutdown` turns true.
/// On shutdown, waits up to `drain` for the sessions to end at their next
/// transaction boundary. `current` has each cluster's context now, in
/// config order: a config reload swaps them, and each new client takes the
/// ones current when it connects.
pub async fn serve(
    current: Vec<watch::Receiver<Arc<ClusterContext>>>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
    drain: Duration,
) {
    let ctx = current[0].borrow().clone();
    let max = ctx.config.max_client_connections;
    let limit = Arc::new(Semaphore::new(max as usize));
    let pending = PendingLogins::new(
        ctx.config.max_pending_logins as usize,
        IDLE_GRACE,
        ctx.config.client_login_timeout / 3,
    );
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
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
        let _ = stream.set_nodelay(true);
        let clusters: Vec<Arc<ClusterContext>> =
            current.iter().map(|c| c.borrow().clone()).collect();
        let ctx = clusters[0].clone();
        let session_shutdown = shutdown.clone();
        let ticket = pending.admit();
        let limit = limit.clone();
        // A debug-level span: disabled (and free) at the usual info level,
        // where entering it on every poll of the session costs measurably.
        let span = tracing::debug_span!(
            "client",
            cluster = %ctx.config.name,
            peer = %peer,
            user = tracing::field::Empty,
            database = tracing::field::Empty
        );
        tokio::spawn(
            async move {
                let cluster = ctx.config.name.clone();
                match handle(clusters, stream, peer, session_shutdown, ticket, limit).await {
                    Ok(()) | Err(SessionError::ClientGone) => tracing::debug!("client left"),
                    Err(SessionError::Refused(reason)) => {
                        tracing::info!(%peer, %cluster, ?reason, "client refused")
                    }
                    Err(e) => tracing::debug!(error = %e, "client session ended"),
                }
            }
            .instrument(span),
        );
    }
    drop(listener);
    let busy = max as usize - limit.available_permits();
    if busy > 0 {
        tracing::info!(cluster = %ctx.config.name, clients = busy, "draining: waiting up to {drain:?} for transactions in progress");
    }
    let drained = tokio::time::timeout(drain, limit.acquire_many(max)).await;
    match drained {
        Ok(_) => {
            tracing::info!(cluster = %ctx.config.name, "drained: every client left at a transaction boundary")
        }
        Err(_) => tracing::warn!(
            cluster = %ctx.config.name,
            clients = max as usize - limit.available_permits(),
            "shutdown_timeout reached: closing the clients still in a transaction"
        ),
    }
}

async fn refuse(stream: &mut ClientStream, msg: &str) {
    let mut out = BytesMut::new();
    backend_msg::error_response(&mut out, "FATAL", sqlstate::TOO_MANY_CONNECTIONS, msg);
    let _ = stream.write_all(&out).await;
    let _ = stream.flush().await;
}

/// How a login ended.
enum LoginEnd<T> {
    Done(T),
    TimedOut,
    /// Closed to make room for a newer connection (`max_pending_logins`).
    Evicted,
}

async fn handle(
    clusters: Vec<Arc<ClusterContext>>,
    stream: TcpStream,
    peer: std::net::SocketAddr,
    shutdown: watch::Receiver<bool>,
    ticket: PendingTicket,
    limit: Arc<Semaphore>,
) -> Result<(), SessionError> {
    let mut buf = BytesMut::with_capacity(8 * 1024);
    let mut stream = ClientStream::from(stream);
    let ctx = clusters[0].clone();
    let end = tokio::select! {
        r = tokio::time::timeout(ctx.config.client_login_timeout, login(&clusters, &mut stream, &mut buf, &ticket)) => match r {
            Ok(r) => LoginEnd::Done(r),
            Err(_) => LoginEnd::TimedOut,
        },
        _ = ticket.evicted() => LoginEnd::Evicted,
    };
    drop(ticket);
    let login = match end {
        LoginEnd::Done(r) => r?,
        LoginEnd::Evicted => {
            let msg = format!(
                "fulcrum: too many connections logging in (max_pending_logins = {}); this one waited longest",
                ctx.config.max_pending_logins
            );
            refuse(&mut stream, &msg).await;
            return Err(SessionError::Refused(
                "closed while logging in to make room (max_pending_logins)".into(),
            ));
        }
        LoginEnd::TimedOut => {
            ctx.metrics.timeout("login");
            let mut out = BytesMut::new();
            let msg = format!(
                "fulcrum: login not finished within client_login_timeout ({:?})",
                ctx.config.client_login_timeout
            );
            backend_msg::error_response(&mut out, "FATAL", sqlstate::PROTOCOL_VIOLATION, &msg);
            let _ = stream.write_all(&out).await;
            let _ = stream.flush().await;
            return Err(SessionError::Refused("login timed out".into()));
        }
    };
    let Some((ctx, login)) = login else {
        return Ok(());
    };
    let Ok(_permit) = limit.try_acquire_owned() else {
        let msg = format!(
            "fulcrum: too many client connections (max_client_connections = {})",
            ctx.config.max_client_connections
        );
        refuse(&mut stream, &msg).await;
        return Err(SessionError::Refused("too many client connections".into()));
    };
    let span = tracing::Span::current();
    span.record("user", &*login.user);
    span.record("database", &*login.database);
    tracing::debug!("client logged in");
    let client = fulcrum_cluster::clients::registry().register(
        &ctx.config.name,
        login.user.clone(),
        login.database.clone(),
        peer,
    );
    let registration = ctx.cancels.register();
    let _counted = ctx.metrics.client_connected();
    let session = Session::new(
        ctx.clone(),
        fulcrum_net::Connection::with_read_buf(stream, buf),
        login,
        registration.slot.clone(),
        shutdown,
        client,
    );
    let r = session.run().await;
    drop(registration);
    r
}
