//! One authenticated server connection and the state Fulcrum tracks on it:
//! the session parameters applied to it, the statements prepared on it, the
//! values the server reported with ParameterStatus, its cancel key.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::connect::ServerTlsTarget;
use super::stream::ServerStream;
use fulcrum_net::Connection;

/// The server's process id and secret, for CancelRequest.
#[derive(Debug, Clone)]
pub struct CancelKey {
    pub address: Arc<str>,
    pub process_id: i32,
    pub secret_key: i32,
    /// The TLS the connection used, for the cancel connection too.
    pub tls: Option<ServerTlsTarget>,
}

/// Session state applied on a connection, in a form both sides compare:
/// parameter key -> the statement that set it.
pub type SessionParams = BTreeMap<String, String>;

pub use super::server_statements::{Prepared, ServerStatements};
pub use super::settings::Settings;

pub struct ServerConn {
    /// The socket and what was read from it (frames at the front).
    pub io: Connection<ServerStream>,
    /// Shared with the client's cancel slot on every attach (a reference
    /// count, not a copy).
    pub cancel: Arc<CancelKey>,
    /// Latest value of each parameter the server reported (ParameterStatus;
    /// written through [`ServerConn::report`]).
    pub reported: BTreeMap<String, String>,
    /// The reported `client_encoding` is one Fulcrum cannot lex as the
    /// server does (`fulcrum_sql::encoding`): its client is pinned.
    pub lexes_apart: bool,
    /// Session parameters Fulcrum applied (replayed client settings).
    pub applied: Settings,
    /// Server-side names of statements prepared on this connection.
    pub prepared: ServerStatements,
    /// `server_reset_query_always`: the reset query is owed before the next
    /// client uses this connection.
    pub reset_due: bool,
}

impl ServerConn {
    /// The server reported `name` = `value` (ParameterStatus).
    pub fn report(&mut self, name: &str, value: &str) {
        self.reported.insert(name.to_owned(), value.to_owned());
        if name == "client_encoding" {
            self.lexes_apart = lexes_apart(&self.reported);
        }
    }

    /// Forgets statements that were sent but not confirmed (after an error the
    /// server skipped them).
    pub fn drop_pending_statements(&mut self) {
        self.prepared.drop_pending();
    }
}

/// Whether the `client_encoding` in `reported` is one Fulcrum cannot lex as
/// the server does (`fulcrum_sql::encoding`).
pub(crate) fn lexes_apart(reported: &BTreeMap<String, String>) -> bool {
    reported
        .get("client_encoding")
        .is_some_and(|e| !fulcrum_sql::encoding::lexes_like_the_server(e))
}

impl fulcrum_pool::Poolable for ServerConn {
    /// An idle connection must have nothing to read: EOF means the server
    /// closed it, data means it sent something unasked (e.g. a FATAL at shutdown).
    fn is_usable(&mut self) -> bool {
        if !self.io.read_buf.is_empty() {
            return false;
        }
        self.io.stream_mut().is_quiet()
    }

    /// `server_check_delay`: an empty query, answered with
    /// EmptyQueryResponse and ReadyForQuery (idle) by a live server.
    async fn check(&mut self) -> bool {
        matches!(self.run_internal("").await, Ok(b'I'))
    }

    /// Who this connection is, for SHOW SERVERS (read once, when the
    /// pool lists it).
    fn identity(&self) -> fulcrum_pool::ServerIdentity {
        let stream = self.io.stream();
        fulcrum_pool::ServerIdentity::of_socket(
            stream.addresses(),
            self.cancel.process_id.max(0) as u64,
            stream.tls_description(),
            self.reported
                .get("application_name")
                .cloned()
                .unwrap_or_default(),
        )
    }
}
