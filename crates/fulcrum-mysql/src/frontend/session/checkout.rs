//! MySQL's side of checking out a server connection
//! (`fulcrum_cluster::attach` does the steps): the client's pool (by its
//! wire format and character set), what each error means, and the answers
//! in MySQL's words when the primary cannot take the work: a login the
//! server denies (1044, 1045, 1698) as the server's refusal of that user,
//! with its code; ERR 1040 only for a pool with no connection to give
//! within `pool_timeout`.

use fulcrum_cluster::attach::{Checkouts, Failure, Unattached};

use super::*;
use crate::backend::ConnectError;

/// A replay's wait for a primary tells the engine (`fulcrum_cluster::replay`).
impl fulcrum_cluster::replay::ReplaySession for Session {
    fn engine(&mut self) -> &mut Engine {
        &mut self.engine
    }
}

impl Checkouts for Session {
    type Conn = Checkout<ServerConn>;
    type Error = PoolError<ConnectError>;

    async fn checkout(&mut self, backend: BackendId) -> Result<Self::Conn, Self::Error> {
        self.connection(backend).await
    }

    fn failure(&self, _backend: BackendId, error: &Self::Error, primary: bool) -> Failure {
        match error {
            PoolError::Connect(e) if e.is_backend_down() => Failure::Down(e.to_string()),
            PoolError::Connect(e) if !primary => Failure::Refused(e.to_string()),
            _ => Failure::Other,
        }
    }

    async fn fits(&mut self, backend: BackendId, conn: &mut Self::Conn) -> bool {
        // Boxed: the check may ask the primary its position (a checkout,
        // perhaps a login), a state every client's task would carry.
        self.reads.for_unit() == fulcrum_config::Consistency::Eventual
            || Box::pin(self.causal_ok(backend, conn)).await
    }

    fn give_back(&mut self, conn: Self::Conn) {
        if conn.io.read_buf.is_empty() {
            conn.release();
        } else {
            conn.discard();
        }
    }

    fn waited(&mut self, waited: std::time::Duration) {
        self.client_entry.counts.waited(waited);
    }
}

impl Session {
    /// A connection of `backend` from the client's pool.
    pub(super) async fn connection(
        &mut self,
        backend: BackendId,
    ) -> Result<Checkout<ServerConn>, PoolError<ConnectError>> {
        let (wire, charset) = (self.hello.wire_format, self.hello.charset);
        let pool = match &self.pool {
            Some((b, p)) if *b == backend => p.clone(),
            _ => {
                let p = self.ctx.pool(backend, &self.user, wire, charset);
                self.pool = Some((backend, p.clone()));
                p
            }
        };
        pool.get(|| self.ctx.open(backend, &self.user, wire, charset))
            .await
    }

    /// Records which server connection serves the client now (`KILL
    /// <id>`, the process list).
    pub(super) fn set_running(&self, on: Option<(BackendId, u32)>) {
        if let Some(running) = &self.running {
            running.set(on);
        }
    }

    /// The client's answer when no connection could be attached, in MySQL's
    /// words (the answer to the command with sequence id `seq`); the
    /// session ends.
    pub(super) async fn unattached(
        &mut self,
        why: Unattached<PoolError<ConnectError>>,
        seq: u8,
    ) -> SessionError {
        let msg = match why {
            Unattached::NoPrimary(why) => {
                let msg = format!(
                    "fulcrum: {why}; cluster \"{}\" has no primary to take this work; waited {:?}, try again",
                    self.ctx.name(),
                    self.ctx.config.pool_timeout
                );
                put_error(
                    &mut self.client.write_buf,
                    seq,
                    codes::SERVER_SHUTDOWN,
                    &msg,
                );
                msg
            }
            Unattached::Final(PoolError::Connect(ConnectError::Server {
                address,
                user,
                code,
                message,
                payload,
            })) if matches!(code, 1044 | 1045 | 1698) => {
                // Access denied to Fulcrum's login for this user (a password
                // the server does not take, no such user, no right to the
                // database): the server's code, state and words, said to
                // be the server's, since the client's own login to Fulcrum
                // went through.
                tracing::warn!(code, server = %address, %user, %message, "server refused the login");
                let state = crate::codec::err::parse_err(&payload)
                    .ok()
                    .and_then(|e| e.sql_state)
                    .unwrap_or(if code == 1044 { *b"42000" } else { *b"28000" });
                let msg = format!(
                    "fulcrum: the server {address} refused the login of user '{user}': {message}"
                );
                put_err(&mut self.client.write_buf, seq, code, state, &msg);
                msg
            }
            Unattached::Final(PoolError::Connect(ConnectError::Server {
                payload,
                message,
                ..
            })) => {
                // The server's own refusal: passed on unchanged.
                write_packet(&mut self.client.write_buf, seq, &payload);
                message
            }
            Unattached::Final(PoolError::Connect(e @ ConnectError::ConnectQuery { .. })) => {
                let msg = format!(
                    "fulcrum: a new connection to {} (primary of cluster \"{}\") was closed: {e}; fix connect_query in the config and reload",
                    self.ctx.address(self.ctx.router.last_primary()),
                    self.ctx.name()
                );
                put_error(&mut self.client.write_buf, seq, codes::HANDSHAKE, &msg);
                msg
            }
            Unattached::Final(PoolError::Connect(e)) => {
                // Not a pool that is full: the login could not be made
                // (TLS, the server's answers).
                let msg = format!(
                    "fulcrum: cannot open a connection to {} (primary of cluster \"{}\") for user '{}': {e}",
                    self.ctx.address(self.ctx.router.last_primary()),
                    self.ctx.name(),
                    self.user
                );
                put_error(&mut self.client.write_buf, seq, codes::HANDSHAKE, &msg);
                msg
            }
            Unattached::Final(e) => {
                // ER_CON_COUNT_ERROR ("Too many connections"): the user's
                // pool had no server connection to give within pool_timeout.
                let what = match e {
                    PoolError::Timeout(waited, size) => format!(
                        "pool_timeout ({waited:?}) ran out waiting for a server connection: all {size} of the pool's connections are in use"
                    ),
                    other => other.to_string(),
                };
                let msg = format!(
                    "fulcrum: no server connection for user '{}' on {}: {what}; raise pool_size or pool_timeout for cluster \"{}\"",
                    self.user,
                    self.ctx.address(self.ctx.router.last_primary()),
                    self.ctx.name()
                );
                put_error(&mut self.client.write_buf, seq, codes::CON_COUNT, &msg);
                msg
            }
        };
        let _ = self.flush().await;
        SessionError::Refused(msg)
    }
}
