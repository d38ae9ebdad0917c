//! One MySQL cluster's listener: admits connections while they log in (at
//! most `max_pending_logins` at once, the oldest closed to make room), then
//! clients up to `max_client_connections`; runs each session on its own
//! task, and stops accepting on shutdown.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use fulcrum_net::{Connection, PendingLogins, PendingTicket};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tracing::Instrument;

use super::context::MyClusterContext;
use super::error::SessionError;
use super::login::login;
use super::session::Session;
use super::wire::send_error;
use crate::codec::err::codes;

/// A connection that has sent nothing of its login for this long counts as
/// idle: at `max_pending_logins` it is the first to be closed.
const IDLE_GRACE: Duration = Duration::from_secs(1);

/// Accepts clients on `listener` until `shutdown` turns true.
/// On shutdown, waits up to `drain` for the sessions to end at their next
/// transaction boundary.
/// `current` has the context now of each cluster on this port (several
/// share it when the client's database picks the cluster), in config order:
/// a config reload swaps them, and each new client takes the ones current
/// when it connects. Listener settings are the first cluster's.
pub async fn serve(
    current: Vec<watch::Receiver<Arc<MyClusterContext>>>,
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
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let clusters: Vec<Arc<MyClusterContext>> =
            current.iter().map(|c| c.borrow().clone()).collect();
        let ctx = clusters[0].clone();
        let session_shutdown = shutdown.clone();
        let ticket = pending.admit();
        let limit = limit.clone();
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

async fn handle(
    clusters: Vec<Arc<MyClusterContext>>,
    stream: TcpStream,
    peer: std::net::SocketAddr,
    shutdown: watch::Receiver<bool>,
    ticket: PendingTicket,
    limit: Arc<Semaphore>,
) -> Result<(), SessionError> {
    let mut conn = Connection::with_read_buf(
        fulcrum_tls::ClientStream::from(stream),
        BytesMut::with_capacity(8 * 1024),
    );
    let ctx = clusters[0].clone();
    let end = tokio::select! {
        r = tokio::time::timeout(ctx.config.client_login_timeout, login(&clusters, &mut conn, &ticket)) => r.ok(),
        _ = ticket.evicted() => {
            let msg = format!(
                "fulcrum: too many connections logging in (max_pending_logins = {}); this one waited longest",
                ctx.config.max_pending_logins
            );
            send_error(conn.stream_mut(), 2, codes::CON_COUNT, &msg).await;
            return Err(SessionError::Refused(
                "closed while logging in to make room (max_pending_logins)".into(),
            ));
        }
    };
    drop(ticket);
    let (ctx, login) = match end {
        Some(r) => r?,
        None => {
            ctx.metrics.timeout("login");
            let code = codes::HANDSHAKE;
            let msg = format!(
                "fulcrum: login not finished within client_login_timeout ({:?})",
                ctx.config.client_login_timeout
            );
            send_error(conn.stream_mut(), 2, code, &msg).await;
            return Err(SessionError::Refused("login timed out".into()));
        }
    };
    let seq = login.next_seq;
    let Ok(_permit) = limit.try_acquire_owned() else {
        let msg = format!(
            "fulcrum: too many client connections (max_client_connections = {})",
            ctx.config.max_client_connections
        );
        send_error(conn.stream_mut(), seq, codes::CON_COUNT, &msg).await;
        return Err(SessionError::Refused("too many client connections".into()));
    };
    let schema: std::sync::Arc<str> = login.schema.as_deref().unwrap_or("").into();
    let span = tracing::Span::current();
    span.record("user", &*login.user);
    span.record("database", &*schema);
    tracing::debug!("client logged in");
    let client = fulcrum_cluster::clients::registry().register(
        &ctx.config.name,
        login.user.clone(),
        schema,
        peer,
    );
    // Counted until the session ends, however it ends (a panic included).
    let _counted = ctx.metrics.client_connected();
    Session::new(ctx.clone(), conn, login, shutdown, client)
        .run(seq)
        .await
}
