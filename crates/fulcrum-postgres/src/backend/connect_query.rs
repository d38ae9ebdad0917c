//! `connect_query`: the SQL a new server connection runs once, after its
//! login and before it serves a client (PgBouncer's per-database
//! `connect_query`). A failure drops the connection: the caller's
//! checkout sees a failed connect.

use std::sync::Arc;
use std::time::Duration;

use super::conn::ServerConn;
use super::connect::ConnectError;
use super::internal::InternalError;

/// Runs `sql` on `conn` (a simple Query, so it may hold several
/// statements) within `timeout`; it must end outside a transaction.
pub async fn run_connect_query(
    conn: &mut ServerConn,
    sql: &str,
    address: &Arc<str>,
    timeout: Duration,
) -> Result<(), ConnectError> {
    let failed = |reason: String| {
        tracing::warn!(server = %address, error = %reason, "connect_query failed; the new server connection is closed");
        ConnectError::ConnectQuery {
            address: address.clone(),
            reason,
        }
    };
    let status = match tokio::time::timeout(timeout, conn.run_internal(sql)).await {
        Err(_) => return Err(failed(format!("no answer within {timeout:?}"))),
        Ok(Err(InternalError::Server { fields, .. })) => {
            return Err(failed(format!("{} ({})", fields.message, fields.code)))
        }
        Ok(Err(e)) => return Err(failed(e.to_string())),
        Ok(Ok(status)) => status,
    };
    if status != b'I' {
        return Err(failed(
            "it left a transaction open (end it with COMMIT in the connect_query)".into(),
        ));
    }
    Ok(())
}
