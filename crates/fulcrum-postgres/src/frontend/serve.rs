//! A PostgreSQL listener: `fulcrum_cluster::serve`'s accept loop, with
//! this protocol's part of it ([`Frontend`]): the startup and
//! authentication (`login`), a FATAL ErrorResponse for a client turned
//! away, and the session with its cancel key.

use std::sync::Arc;

use bytes::BytesMut;
use fulcrum_cluster::clients::ClientHandle;
use fulcrum_cluster::serve::{Ending, Frontend, Refusal};
use fulcrum_net::{Accepted, PendingTicket};
use fulcrum_tls::ClientStream;
use tokio::io::AsyncWriteExt;

use super::context::ClusterContext;
use super::error::SessionError;
use super::login::{login, Login};
use super::session::{HandedOver, Session};
use crate::codec::backend_msg::{self, sqlstate};

impl Frontend for ClusterContext {
    /// The socket, and what was read of it ahead of the session.
    type Client = (ClientStream, BytesMut);
    type Login = Login;
    type Error = SessionError;

    fn accept(stream: Accepted) -> (ClientStream, BytesMut) {
        (
            stream.into_stream(),
            BytesMut::with_capacity(fulcrum_net::CLIENT_READ_CHUNK),
        )
    }

    async fn login(
        clusters: &[Arc<ClusterContext>],
        (stream, buf): &mut (ClientStream, BytesMut),
        ticket: &PendingTicket,
    ) -> Result<Option<(Arc<ClusterContext>, Login)>, SessionError> {
        login(clusters, stream, buf, ticket).await
    }

    async fn refuse(
        (stream, _): &mut (ClientStream, BytesMut),
        _: Option<&Login>,
        why: Refusal,
        message: &str,
    ) {
        let code = match why {
            Refusal::TimedOut => sqlstate::PROTOCOL_VIOLATION,
            Refusal::Crowded | Refusal::Full => sqlstate::TOO_MANY_CONNECTIONS,
        };
        let mut out = BytesMut::new();
        backend_msg::error_response(&mut out, "FATAL", code, message);
        let _ = stream.write_all(&out).await;
        let _ = stream.flush().await;
    }

    fn identity(login: &Login) -> (Arc<str>, Arc<str>) {
        (login.user.clone(), login.database.clone())
    }

    /// The session is made before its future, so the future holds it
    /// once, not also the arguments it was made from (issue 44: memory
    /// per idle client).
    fn run(
        ctx: Arc<ClusterContext>,
        (stream, buf): (ClientStream, BytesMut),
        login: Login,
        entry: ClientHandle,
    ) -> impl std::future::Future<Output = Result<(), SessionError>> + Send {
        let owner = (login.user.clone(), entry.clone_entry());
        let registration = ctx.cancels.register_for(Some(owner));
        let mut session = Session::new(
            ctx,
            fulcrum_net::Connection::with_read_buf(stream, buf)
                .with_chunk(fulcrum_net::CLIENT_READ_CHUNK),
            login,
            registration.slot.clone(),
            entry,
        );
        async move {
            let r = session.run().await;
            drop(registration);
            r
        }
    }

    async fn resume(
        ctx: Arc<ClusterContext>,
        stream: fulcrum_net::Accepted,
        head: fulcrum_cluster::handover::ClientHead,
        entry: ClientHandle,
    ) -> Result<(), SessionError> {
        let Some(carried) = HandedOver::read(&head.state).filter(|_| head.protocol == "postgres")
        else {
            // Another version's snapshot: the client is closed and
            // connects again.
            tracing::warn!(
                "upgrade: a handed-over PostgreSQL session this version cannot read: closed"
            );
            return Ok(());
        };
        let owner = (Arc::<str>::from(head.user.as_str()), entry.clone_entry());
        let registration = ctx.cancels.register_as(Some(owner), Some(carried.cancel));
        let login = Login {
            user: head.user.as_str().into(),
            pool_user: carried.pool_user.as_str().into(),
            database: head.database.as_str().into(),
            startup: carried.startup.clone(),
        };
        let mut session = Session::new(
            ctx.clone(),
            fulcrum_net::Connection::new(stream.into_stream())
                .with_chunk(fulcrum_net::CLIENT_READ_CHUNK),
            login,
            registration.slot.clone(),
            entry,
        );
        let r = session.run_resumed(carried).await;
        drop(registration);
        r
    }

    fn ending(error: &SessionError) -> Ending<'_> {
        match error {
            SessionError::ClientGone => Ending::Left,
            SessionError::Refused(reason) => Ending::Refused(reason),
            _ => Ending::Failed,
        }
    }
}
