//! PostgreSQL's side of checking out a server connection
//! (`fulcrum_cluster::attach` does the steps): the client's pool and
//! session parameters, what each error means (a primary shutting down,
//! starting or in recovery counts as down, so the unit waits for it), and
//! the answers in PostgreSQL's words when the primary cannot take the work:
//! a login the server refuses (class 28) as the server's refusal of that
//! user, with its code; other server refusals passed on unchanged.

use fulcrum_cluster::attach::{Checkouts, Failure, Unattached};

use crate::codec::backend_msg::ErrorFields;

use super::*;

/// A checkout that failed: the pool's answer, or the client's session
/// parameters could not be restored on the connection.
pub enum CheckoutError {
    Pool(PoolError<ConnectError>),
    Params(InternalError),
}

/// A replay's wait for a primary tells the engine (`fulcrum_cluster::replay`).
impl fulcrum_cluster::replay::ReplaySession for Session {
    fn engine(&mut self) -> &mut Engine {
        &mut self.engine
    }
}

impl Checkouts for Session {
    type Conn = Checkout<ServerConn>;
    type Error = CheckoutError;

    async fn checkout(&mut self, backend: BackendId) -> Result<Self::Conn, CheckoutError> {
        // The pool handle is kept per backend: no map lookup per transaction.
        let pool = match &self.pool {
            Some((b, p)) if *b == backend => p.clone(),
            _ => {
                let p = self
                    .ctx
                    .pool(backend, &self.id.pool_user, &self.id.database);
                self.pool = Some((backend, p.clone()));
                p
            }
        };
        if self.ctx.router.is_primary(backend) {
            self.id.entry.set_waiting();
        }
        let (ctx, user, database) = (&self.ctx, &self.id.pool_user, &self.id.database);
        let mut server = pool
            .get(|| ctx.open(backend, user, database))
            .await
            .map_err(CheckoutError::Pool)?;
        // A reset or the client's settings are a round trip to the server:
        // boxed, so their state is not part of every client's task.
        let mut ready = Ok(());
        if server.reset_due {
            ready = Box::pin(run_reset(&self.ctx, &mut server)).await;
            server.reset_due = ready.is_err();
        }
        if ready.is_ok() && server.applied != self.params.desired {
            ready = Box::pin(sync_params(&mut server, &self.params.desired)).await;
        }
        if let Err(e) = ready {
            if !matches!(e, InternalError::Server { .. }) {
                server.discard();
            }
            return Err(CheckoutError::Params(e));
        }
        Ok(server)
    }

    fn failure(&self, backend: BackendId, error: &CheckoutError, primary: bool) -> Failure {
        let (name, server) = (self.ctx.name(), &self.ctx.backends[backend]);
        match error {
            CheckoutError::Pool(PoolError::Connect(ConnectError::Server { fields, .. }))
                if primary && fields.code.starts_with("57P") && self.stmts.rewrite =>
            {
                // Shutting down, starting up or in recovery: as good as down
                // for this unit, which may wait for the primary to come back.
                tracing::warn!(code = %fields.code, cluster = name, message = ?fields.message, "primary refused new connections");
                Failure::Down(format!(
                    "{server} (primary of cluster \"{name}\") refused the connection: {} ({})",
                    fields.message, fields.code
                ))
            }
            CheckoutError::Pool(PoolError::Connect(e)) if e.is_backend_down() => {
                if primary {
                    tracing::warn!(error = %e, cluster = name, "cannot reach the primary");
                }
                Failure::Down(format!(
                    "cannot open a connection to {server} (primary of cluster \"{name}\"): {e}"
                ))
            }
            CheckoutError::Pool(PoolError::Connect(e)) if !primary => {
                Failure::Refused(e.to_string())
            }
            _ => Failure::Other,
        }
    }

    async fn fits(&mut self, backend: BackendId, conn: &mut Self::Conn) -> bool {
        // Not boxed again: the full way of an attach that checks a
        // replica's position is boxed where it is awaited
        // (`attach_waiting`); a read at hand that needs no probe is checked
        // synchronously (`attach_now`, `Reads::serves_at_once`).
        !route_is_causal(self.reads.for_unit())
            || self.causal_check(backend, conn).await == fulcrum_session::Check::Serve
    }

    fn give_back(&mut self, conn: Self::Conn) {
        if conn.io.read_buf.is_empty() {
            conn.release();
        } else {
            conn.discard();
        }
    }

    fn forget(&mut self, backend: BackendId) {
        self.ctx
            .forget_pool_if_empty(backend, &self.id.pool_user, &self.id.database);
    }

    fn waited(&mut self, waited: std::time::Duration) {
        self.id.entry.counts.waited(waited);
    }
}

/// How the client is told that no connection could be attached.
enum Answer {
    /// A FATAL of Fulcrum's: its SQLSTATE and words; `forget`: the pool is
    /// forgotten too (the server refused this user's login).
    Fatal {
        code: String,
        msg: String,
        forget: bool,
    },
    /// The server's own ErrorResponse, passed on unchanged (e.g. 3D000
    /// unknown database); the pool is forgotten.
    Passed { frame: BytesMut, message: String },
}

impl Answer {
    fn fatal(code: &str, msg: String) -> Answer {
        Answer::Fatal {
            code: code.to_owned(),
            msg,
            forget: false,
        }
    }
}

impl Session {
    /// The client's answer when no connection could be attached, in
    /// PostgreSQL's words; the session ends.
    pub(super) async fn unattached(&mut self, why: Unattached<CheckoutError>) -> SessionError {
        let backend = self.ctx.router.last_primary();
        let answer = match why {
            Unattached::NoPrimary(why) => {
                Answer::fatal(sqlstate::CONNECTION_FAILURE, self.no_primary(&why))
            }
            Unattached::Final(CheckoutError::Pool(PoolError::Connect(e))) => {
                self.connect_refused(backend, e)
            }
            Unattached::Final(CheckoutError::Pool(e)) => self.pool_refused(backend, e),
            Unattached::Final(CheckoutError::Params(InternalError::Server { frame, fields })) => {
                server_refused(frame, fields)
            }
            Unattached::Final(CheckoutError::Params(e)) => Answer::fatal(
                sqlstate::CONNECTION_FAILURE,
                format!("fulcrum: server connection failed while restoring session settings: {e}"),
            ),
        };
        if matches!(
            answer,
            Answer::Passed { .. } | Answer::Fatal { forget: true, .. }
        ) {
            self.pool = None;
            self.ctx
                .forget_pool_if_empty(backend, &self.id.pool_user, &self.id.database);
        }
        match answer {
            Answer::Fatal { code, msg, .. } => self.fatal_client(&code, &msg).await,
            Answer::Passed { frame, message } => {
                self.client.queue(&frame);
                let _ = self.client.flush().await;
                SessionError::Refused(message)
            }
        }
    }

    /// No primary took the unit within `pool_timeout` (`why`: the last
    /// reason): the words, with what the cluster's state suggests.
    fn no_primary(&self, why: &str) -> String {
        format!(
            "fulcrum: {why}; cluster \"{}\" has no primary to take this work ({}); waited {:?}, try again",
            self.ctx.name(),
            if self.ctx.router.primary_expired() {
                "this instance is cut off from its coordinator; the primary may well be up"
            } else if self.ctx.config.health.failover == fulcrum_config::Failover::None {
                "it is down"
            } else {
                "it is down, or a failover is under way"
            },
            self.ctx.config.pool_timeout
        )
    }

    /// A new connection to the primary `backend` could not be opened or
    /// logged in.
    fn connect_refused(&self, backend: BackendId, e: ConnectError) -> Answer {
        let (server, cluster) = (&self.ctx.backends[backend], self.ctx.name());
        match e {
            ConnectError::Server {
                address,
                user,
                fields,
                ..
            } if fields.code.starts_with("28") => {
                // The server refused Fulcrum's login for this user (28P01 a
                // password it does not take, 28000 no such role, a role that
                // may not log in, a pg_hba.conf line): its code and words,
                // said to be the server's, since the client's own login to
                // Fulcrum went through.
                tracing::warn!(code = %fields.code, server = %address, %user, message = ?fields.message, "server refused the login");
                Answer::Fatal {
                    msg: format!(
                        "fulcrum: the server {address} refused the login of user \"{user}\": {}",
                        fields.message
                    ),
                    code: fields.code,
                    forget: true,
                }
            }
            ConnectError::Server { frame, fields, .. } => server_refused(frame, fields),
            e @ ConnectError::ConnectQuery { .. } => Answer::fatal(
                sqlstate::CONNECTION_FAILURE,
                format!(
                    "fulcrum: a new connection to {server} (primary of cluster \"{cluster}\") was closed: {e}; fix connect_query in the config and reload"
                ),
            ),
            e @ ConnectError::Auth { .. } => {
                // Fulcrum could not log in with what it holds (a method the
                // config's credential cannot answer, a refused cleartext
                // request, SCRAM without the server's proof): the server
                // is up, the login is what fails.
                tracing::warn!(error = %e, %cluster, "cannot log in to the server");
                Answer::fatal(
                    sqlstate::INVALID_AUTHORIZATION,
                    format!(
                        "fulcrum: cannot log in to {server} (primary of cluster \"{cluster}\") for user \"{}\": {e}",
                        self.id.user
                    ),
                )
            }
            e @ ConnectError::Tls { .. } => {
                tracing::warn!(error = %e, %cluster, "cannot open server connection");
                Answer::fatal(
                    sqlstate::CONNECTION_FAILURE,
                    format!(
                        "fulcrum: cannot open a connection to {server} (primary of cluster \"{cluster}\"): {e}; check server_tls and the server's certificate"
                    ),
                )
            }
            e => {
                tracing::warn!(error = %e, %cluster, "cannot open server connection");
                Answer::fatal(
                    sqlstate::CANNOT_CONNECT_NOW,
                    format!(
                        "fulcrum: cannot open a connection to {server} (primary of cluster \"{cluster}\"): {e}; the server may be down, try again when it is back"
                    ),
                )
            }
        }
    }

    /// The pool of the primary `backend` had no connection to give (not a
    /// connect's failure: [`Session::connect_refused`]).
    fn pool_refused(&self, backend: BackendId, e: PoolError<ConnectError>) -> Answer {
        let (server, cluster) = (&self.ctx.backends[backend], self.ctx.name());
        let msg = match e {
            e @ PoolError::Budget(..) => {
                format!("fulcrum: {e} on {server}; raise it or pool_timeout for cluster \"{cluster}\"")
            }
            e => format!(
                "fulcrum: {e} for user \"{}\" database \"{}\" on {server}; raise pool_size or pool_timeout for cluster \"{cluster}\"",
                self.id.user, self.id.database
            ),
        };
        Answer::fatal(sqlstate::TOO_MANY_CONNECTIONS, msg)
    }
}

/// The server's own refusal (e.g. 3D000 unknown database): passed on
/// unchanged.
fn server_refused(frame: BytesMut, fields: ErrorFields) -> Answer {
    tracing::info!(code = %fields.code, message = ?fields.message, "server refused login");
    Answer::Passed {
        frame,
        message: fields.message,
    }
}
