//! Statements Fulcrum runs on a server connection for itself (replaying session
//! parameters, ROLLBACK or DISCARD ALL before reuse): send one simple query,
//! read to ReadyForQuery, keep ParameterStatus values, show nothing to clients.

use bytes::BytesMut;
use thiserror::Error;

use super::conn::ServerConn;
use crate::codec::backend_msg::{
    parse_data_row, parse_error_fields, parse_parameter_status, ErrorFields,
};
use crate::codec::frame::check_frame;
use crate::codec::frontend_msg::put_query;

#[derive(Debug, Error)]
pub enum InternalError {
    #[error("server connection failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("server closed the connection")]
    Closed,
    #[error("server sent a malformed message: {0}")]
    Protocol(String),
    /// The server answered with an error; `frame` is the ErrorResponse.
    #[error("{}: {}", fields.code, fields.message)]
    Server {
        fields: ErrorFields,
        frame: BytesMut,
    },
}

/// Rows of text values (`None` for NULL).
pub type Rows = Vec<Vec<Option<String>>>;

impl ServerConn {
    /// Runs `sql` and waits for ReadyForQuery; returns its status byte.
    pub async fn run_internal(&mut self, sql: &str) -> Result<u8, InternalError> {
        self.query_internal(sql, None).await
    }

    /// Runs `sql` (one statement, text results) and returns its rows.
    pub async fn query_rows(&mut self, sql: &str) -> Result<Rows, InternalError> {
        let mut rows = Vec::new();
        self.query_internal(sql, Some(&mut rows)).await?;
        Ok(rows)
    }

    async fn query_internal(
        &mut self,
        sql: &str,
        mut rows: Option<&mut Rows>,
    ) -> Result<u8, InternalError> {
        let mut out = BytesMut::with_capacity(sql.len() + 6);
        put_query(&mut out, sql);
        self.io.send(&out).await?;
        let mut error = None;
        loop {
            let h = loop {
                match check_frame(&self.io.read_buf, u32::MAX as u64)
                    .map_err(|e| InternalError::Protocol(e.to_string()))?
                {
                    Some(h) if self.io.read_buf.len() >= h.total => break h,
                    _ => {
                        if self.io.read_more().await? == 0 {
                            return Err(InternalError::Closed);
                        }
                    }
                }
            };
            let frame = self.io.read_buf.split_to(h.total);
            match h.tag {
                b'S' => {
                    if let Some((n, v)) = parse_parameter_status(&frame[5..]) {
                        self.report(n, v);
                    }
                }
                b'D' => {
                    if let Some(rows) = rows.as_deref_mut() {
                        let cols = parse_data_row(&frame[5..])
                            .ok_or_else(|| InternalError::Protocol("malformed DataRow".into()))?;
                        rows.push(
                            cols.into_iter()
                                .map(|c| c.map(|v| String::from_utf8_lossy(v).into_owned()))
                                .collect(),
                        );
                    }
                }
                b'E' if error.is_none() => {
                    error = Some(InternalError::Server {
                        fields: parse_error_fields(&frame[5..]),
                        frame,
                    });
                }
                b'Z' => {
                    let status = frame.get(5).copied().unwrap_or(b'I');
                    return match error {
                        Some(e) => Err(e),
                        None => Ok(status),
                    };
                }
                _ => {}
            }
        }
    }
}
