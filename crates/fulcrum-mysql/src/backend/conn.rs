//! One authenticated server connection and what Fulcrum tracks on it: the
//! capabilities and character set it was opened with, its current schema,
//! the session statements replayed on it, and a buffer of bytes read.
//! Reading whole messages and running Fulcrum's own commands live here too.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::BytesMut;
use fulcrum_net::Connection;
use fulcrum_tls::ServerStream;
use mysql_common::constants::{CapabilityFlags as C, StatusFlags};
use thiserror::Error;

use crate::codec::command::{build_command, Command};
use crate::codec::err::parse_err;
use crate::codec::packet::{scan_message, write_packet, HEADER_LEN, MAX_PAYLOAD};
use crate::codec::response::{classify, status_flags, ResponseKind};
use crate::codec::wire::{read_lenenc_int, read_lenenc_str};

/// Largest server message read whole by Fulcrum's own commands.
const INTERNAL_MAX: usize = 64 * 1024 * 1024;

pub struct ServerConn {
    /// The socket and what was read from it (messages at the front).
    pub io: Connection<ServerStream>,
    pub address: String,
    /// Flags in force on this connection.
    pub caps: C,
    pub charset: u8,
    /// The server's thread id (for KILL QUERY).
    pub connection_id: u32,
    /// Current default schema, as far as Fulcrum set it.
    pub schema: Option<String>,
    /// Session statements (SET ...) replayed on this connection, in order.
    pub applied: Vec<String>,
    /// Statements prepared on this connection, by text.
    pub prepared: HashMap<Arc<str>, ServerStmt, foldhash::fast::RandomState>,
    /// Counts statement uses here (`ServerStmt::used`).
    pub stmt_clock: u64,
    /// `last_gtid` is tracked on this connection (consistency `session`):
    /// set again after every COM_RESET_CONNECTION.
    pub track_gtid: bool,
    /// `connect_query`, run when the connection was opened and again after
    /// every COM_RESET_CONNECTION (which undoes what it set).
    pub connect_query: Option<Arc<str>>,
}

/// Adds `last_gtid` to MariaDB's tracked variables (its defaults kept), so
/// the OK of each committed write carries the transaction's GTID.
pub const TRACK_GTID_SQL: &str = "SET SESSION session_track_system_variables = \
     'autocommit,character_set_client,character_set_connection,character_set_results,time_zone,last_gtid'";

/// A statement prepared on one server connection.
#[derive(Debug, Clone)]
pub struct ServerStmt {
    pub id: u32,
    /// The server's whole answer to the prepare (PREPARE_OK and the
    /// definitions), replayed to the next client that prepares the same text.
    pub answer: Vec<u8>,
    /// The parameter types this statement was last executed with here.
    pub types: Option<std::sync::Arc<[u8]>>,
    /// When it was last used (a count of uses on this connection), for
    /// `max_prepared_statements`' least-recently-used eviction.
    pub used: u64,
}

#[derive(Debug, Error)]
pub enum InternalError {
    #[error("server connection failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("server closed the connection")]
    Closed,
    #[error("server sent a malformed message: {0}")]
    Protocol(String),
    /// The server answered with ERR; `payload` is it, to pass on.
    #[error("server error {code}: {message}")]
    Server {
        code: u16,
        message: String,
        payload: Vec<u8>,
    },
}

impl fulcrum_pool::Poolable for ServerConn {
    /// An idle connection must have nothing to read: EOF means the server
    /// closed it, data means it sent something unasked (an error at shutdown).
    fn is_usable(&mut self) -> bool {
        if !self.io.read_buf.is_empty() {
            return false;
        }
        self.io.stream_mut().is_quiet()
    }

    /// `server_check_delay`: COM_PING, answered with OK by a live server.
    async fn check(&mut self) -> bool {
        self.run_simple(Command::Ping, b"").await.is_ok()
    }

    /// Who this connection is, for SHOW SERVERS (read once, when the
    /// pool lists it).
    fn identity(&self) -> fulcrum_pool::ServerIdentity {
        let stream = self.io.stream();
        fulcrum_pool::ServerIdentity::of_socket(
            stream.addresses(),
            u64::from(self.connection_id),
            stream.tls_description(),
            String::new(),
        )
    }
}

impl ServerConn {
    /// Reads one whole message (all its packets); returns its span length
    /// in `read_buf`, headers included.
    pub async fn read_message(&mut self, max: usize) -> Result<usize, InternalError> {
        loop {
            match scan_message(&self.io.read_buf, max) {
                Ok(Some(span)) => return Ok(span.total),
                Ok(None) => {
                    if self.io.read_more().await? == 0 {
                        return Err(InternalError::Closed);
                    }
                }
                Err(e) => return Err(InternalError::Protocol(e.to_string())),
            }
        }
    }

    /// Sends a command answered by OKs or ERR (COM_INIT_DB, a SET or a
    /// list of SETs, COM_RESET_CONNECTION) and reads its whole answer: while
    /// an answer says more results follow (SERVER_MORE_RESULTS_EXISTS, one
    /// per statement of a multi-statement text), the next is read too, so
    /// nothing is left on the connection. The first ERR is returned (the
    /// server runs nothing after it); a result set is read and skipped.
    pub async fn run_simple(&mut self, cmd: Command, body: &[u8]) -> Result<(), InternalError> {
        let mut out = BytesMut::with_capacity(body.len() + 8);
        write_packet(&mut out, 0, &build_command(cmd, body));
        self.io.send(&out).await?;
        loop {
            let payload = self.next_payload().await?;
            let more =
                match classify(&payload).map_err(|e| InternalError::Protocol(e.to_string()))? {
                    ResponseKind::Ok => status_flags(&payload)
                        .is_some_and(|s| s.contains(StatusFlags::SERVER_MORE_RESULTS_EXISTS)),
                    ResponseKind::Err => {
                        let err = parse_err(&payload)
                            .map_err(|e| InternalError::Protocol(e.to_string()))?;
                        return Err(InternalError::Server {
                            code: err.code,
                            message: String::from_utf8_lossy(err.message).into_owned(),
                            payload,
                        });
                    }
                    _ => self.skip_result_set(&payload).await?,
                };
            if !more {
                return Ok(());
            }
        }
    }

    /// Reads the rest of a text result set whose column count is `first`;
    /// returns whether more results follow it.
    async fn skip_result_set(&mut self, first: &[u8]) -> Result<bool, InternalError> {
        let proto = |e: String| InternalError::Protocol(e);
        let columns = read_lenenc_int(first)
            .map_err(|e| proto(e.to_string()))?
            .0
            .unwrap_or(0);
        for _ in 0..columns {
            self.next_payload().await?;
        }
        if !self.caps.contains(C::CLIENT_DEPRECATE_EOF) {
            self.next_payload().await?;
        }
        loop {
            let payload = self.next_payload().await?;
            match payload.first() {
                Some(0xFE) if payload.len() < 0xFF_FFFF => {
                    return Ok(status_flags(&payload)
                        .is_some_and(|s| s.contains(StatusFlags::SERVER_MORE_RESULTS_EXISTS)))
                }
                Some(0xFF) => return Err(proto("error in the middle of a result set".into())),
                _ => {}
            }
        }
    }

    /// Switches the default schema with COM_INIT_DB.
    pub async fn use_schema(&mut self, schema: &str) -> Result<(), InternalError> {
        self.run_simple(Command::InitDb, schema.as_bytes()).await?;
        self.schema = Some(schema.to_owned());
        Ok(())
    }

    /// COM_RESET_CONNECTION, then what Fulcrum itself keeps set on the
    /// connection (`last_gtid` tracking).
    pub async fn reset(&mut self) -> Result<(), InternalError> {
        self.run_simple(Command::ResetConnection, &[]).await?;
        self.applied.clear();
        if self.track_gtid {
            self.run_simple(Command::Query, TRACK_GTID_SQL.as_bytes())
                .await?;
        }
        if let Some(sql) = self.connect_query.clone() {
            self.run_simple(Command::Query, sql.as_bytes()).await?;
        }
        Ok(())
    }

    /// `connect_query` on a connection just opened (kept, to run again
    /// after each reset); an error drops the connection, as a failed
    /// connect: logged with the server's words.
    pub async fn run_connect_query(
        &mut self,
        sql: &str,
        timeout: std::time::Duration,
    ) -> Result<(), super::ConnectError> {
        let reason =
            match tokio::time::timeout(timeout, self.run_simple(Command::Query, sql.as_bytes()))
                .await
            {
                Ok(Ok(())) => {
                    self.connect_query = Some(sql.into());
                    return Ok(());
                }
                Ok(Err(InternalError::Server { code, message, .. })) => {
                    format!("{message} ({code})")
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {timeout:?}"),
            };
        tracing::warn!(server = %self.address, error = %reason, "connect_query failed; the new server connection is closed");
        Err(super::ConnectError::ConnectQuery {
            address: self.address.clone(),
            reason,
        })
    }

    /// Runs `sql` and returns the first column of its first row (`None` for
    /// NULL or no row); the whole answer is read.
    pub async fn query_value(&mut self, sql: &str) -> Result<Option<String>, InternalError> {
        let proto = |e: String| InternalError::Protocol(e);
        let mut out = BytesMut::with_capacity(sql.len() + 8);
        write_packet(&mut out, 0, &build_command(Command::Query, sql.as_bytes()));
        self.io.send(&out).await?;
        let mut payload = self.next_payload().await?;
        let columns = match classify(&payload).map_err(|e| proto(e.to_string()))? {
            ResponseKind::Ok => return Ok(None),
            ResponseKind::Err => {
                let err = parse_err(&payload).map_err(|e| proto(e.to_string()))?;
                return Err(InternalError::Server {
                    code: err.code,
                    message: String::from_utf8_lossy(err.message).into_owned(),
                    payload: payload.clone(),
                });
            }
            _ => read_lenenc_int(&payload)
                .map_err(|e| proto(e.to_string()))?
                .0
                .unwrap_or(0),
        };
        for _ in 0..columns {
            self.next_payload().await?;
        }
        if !self.caps.contains(C::CLIENT_DEPRECATE_EOF) {
            self.next_payload().await?;
        }
        let mut value = None;
        let mut first = true;
        loop {
            payload = self.next_payload().await?;
            match payload.first() {
                Some(0xFE) if payload.len() < 0xFF_FFFF => break,
                Some(0xFF) => return Err(proto("error in the middle of a result set".into())),
                _ => {}
            }
            if std::mem::take(&mut first) {
                value = read_lenenc_str(&payload)
                    .map_err(|e| proto(e.to_string()))?
                    .0
                    .map(|v| String::from_utf8_lossy(v).into_owned());
            }
        }
        Ok(value)
    }

    /// The first packet's payload of the next server message.
    async fn next_payload(&mut self) -> Result<Vec<u8>, InternalError> {
        let total = self.read_message(INTERNAL_MAX).await?;
        let msg = self.io.read_buf.split_to(total);
        Ok(msg[HEADER_LEN..HEADER_LEN + (total - HEADER_LEN).min(MAX_PAYLOAD)].to_vec())
    }

    /// Brings the session statements to `desired`: COM_RESET_CONNECTION if
    /// anything was applied before, then each statement.
    pub async fn sync_session(&mut self, desired: &[String]) -> Result<(), InternalError> {
        if !self.applied.is_empty() {
            self.reset().await?;
        }
        for stmt in desired {
            self.run_simple(Command::Query, stmt.as_bytes()).await?;
            self.applied.push(stmt.clone());
        }
        Ok(())
    }
}
