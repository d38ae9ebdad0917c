//! A MySQL listener: `fulcrum_cluster::serve`'s accept loop, with this
//! protocol's part of it ([`Frontend`]): the handshake and authentication
//! (`login`), an ERR packet for a client turned away, the session, and
//! the session of a client a binary upgrade's old process handed over.

use std::sync::Arc;

use bytes::BytesMut;
use fulcrum_cluster::clients::ClientHandle;
use fulcrum_cluster::serve::{Ending, Frontend, Refusal};
use fulcrum_net::{Accepted, Connection, PendingTicket};
use fulcrum_tls::ClientStream;

use super::context::MyClusterContext;
use super::error::SessionError;
use super::login::{login, Login};
use super::session::{HandedOver, Session};
use super::wire::send_error;
use crate::codec::err::codes;

impl Frontend for MyClusterContext {
    type Client = Connection<ClientStream>;
    type Login = Login;
    type Error = SessionError;

    fn accept(stream: Accepted) -> Connection<ClientStream> {
        Connection::with_read_buf(
            stream.into_stream::<ClientStream>(),
            BytesMut::with_capacity(fulcrum_net::CLIENT_READ_CHUNK),
        )
        .with_chunk(fulcrum_net::CLIENT_READ_CHUNK)
    }

    async fn login(
        clusters: &[Arc<MyClusterContext>],
        conn: &mut Connection<ClientStream>,
        ticket: &PendingTicket,
    ) -> Result<Option<(Arc<MyClusterContext>, Login)>, SessionError> {
        login(clusters, conn, ticket).await.map(Some)
    }

    /// An ERR in the login's sequence: the handshake response's reply
    /// (2) while logging in, else the packet that would have completed it.
    async fn refuse(
        conn: &mut Connection<ClientStream>,
        login: Option<&Login>,
        why: Refusal,
        message: &str,
    ) {
        let code = match why {
            Refusal::TimedOut => codes::HANDSHAKE,
            Refusal::Crowded | Refusal::Full => codes::CON_COUNT,
        };
        let seq = login.map_or(2, |l| l.next_seq);
        send_error(conn.stream_mut(), seq, code, message).await;
    }

    fn identity(login: &Login) -> (Arc<str>, Arc<str>) {
        let schema = login.schema.as_deref().unwrap_or("").into();
        (login.user.clone(), schema)
    }

    /// The session is made before its future, so the future holds it
    /// once, not also the arguments it was made from (issue 44: memory
    /// per idle client).
    fn run(
        ctx: Arc<MyClusterContext>,
        conn: Connection<ClientStream>,
        login: Login,
        entry: ClientHandle,
    ) -> impl std::future::Future<Output = Result<(), SessionError>> + Send {
        let seq = login.next_seq;
        let mut session = Session::new(ctx, conn, login, entry);
        async move { session.run(seq).await }
    }

    /// A client the old process handed over (a binary upgrade): its
    /// session rebuilt from the snapshot as the login would have made it,
    /// under the connection id it was given there (registered for `KILL`
    /// and the process list), then its commands served; no greeting, no OK.
    async fn resume(
        ctx: Arc<MyClusterContext>,
        stream: Accepted,
        head: fulcrum_cluster::handover::ClientHead,
        entry: ClientHandle,
    ) -> Result<(), SessionError> {
        let Some(mut carried) = HandedOver::read(&head.state).filter(|_| head.protocol == "mysql")
        else {
            // Another version's snapshot: the client is closed and
            // connects again.
            tracing::warn!("upgrade: a handed-over MySQL session this version cannot read: closed");
            return Ok(());
        };
        let id = carried.connection_id();
        if !ctx.claim_connection_id(id) {
            let new = ctx.connection_id();
            tracing::warn!(id, new, "upgrade: a handed-over client's connection id is taken here; its CONNECTION_ID() changes");
            carried.renumber(new);
        }
        let login = carried.login(&head.user);
        let mut session = Session::new(ctx, Self::accept(stream), login, entry);
        session.run_resumed(carried).await
    }

    fn ending(error: &SessionError) -> Ending<'_> {
        match error {
            SessionError::ClientGone => Ending::Left,
            SessionError::Refused(reason) => Ending::Refused(reason),
            _ => Ending::Failed,
        }
    }
}
