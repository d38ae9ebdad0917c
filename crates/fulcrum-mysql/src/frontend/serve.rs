//! A MySQL listener: `fulcrum_cluster::serve`'s accept loop, with this
//! protocol's part of it ([`Frontend`]): the handshake and authentication
//! (`login`), an ERR packet for a client turned away, and the session.

use std::sync::Arc;

use bytes::BytesMut;
use fulcrum_cluster::clients::ClientHandle;
use fulcrum_cluster::serve::{Ending, Frontend, Refusal};
use fulcrum_net::{Accepted, Connection, PendingTicket};
use fulcrum_tls::ClientStream;

use super::context::MyClusterContext;
use super::error::SessionError;
use super::login::{login, Login};
use super::session::Session;
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

    async fn run(
        ctx: Arc<MyClusterContext>,
        conn: Connection<ClientStream>,
        login: Login,
        entry: ClientHandle,
    ) -> Result<(), SessionError> {
        let seq = login.next_seq;
        let mut session = Session::new(ctx, conn, login, entry);
        session.run(seq).await
    }

    /// MySQL sessions are not handed over yet (they stay on the old
    /// process until they leave, `Stay::Pinned` is not claimed for them):
    /// nothing sends one, and one that arrives is closed.
    async fn resume(
        _ctx: Arc<MyClusterContext>,
        _stream: Accepted,
        _head: fulcrum_cluster::handover::ClientHead,
        _entry: ClientHandle,
    ) -> Result<(), SessionError> {
        tracing::warn!(
            "upgrade: a handed-over MySQL session: not supported by this version, closed"
        );
        Ok(())
    }

    fn ending(error: &SessionError) -> Ending<'_> {
        match error {
            SessionError::ClientGone => Ending::Left,
            SessionError::Refused(reason) => Ending::Refused(reason),
            _ => Ending::Failed,
        }
    }
}
