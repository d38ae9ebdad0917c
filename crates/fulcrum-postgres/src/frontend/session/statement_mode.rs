//! Statement pooling (`pool_mode = "statement"`, PgBouncer's): transaction
//! pooling whose every unit must end with the server idle. A ReadyForQuery
//! saying a transaction is open (an explicit `BEGIN`, or a statement that
//! opened one) ends the client as PgBouncer does: the server connection is
//! closed, which rolls the transaction back, and the client gets
//! `FATAL 08P01 transaction blocks not allowed in statement pooling mode`.

use super::*;

/// PgBouncer's words (src/server.c, ReadyForQuery in `POOL_STMT`), which
/// drivers match on (PostgREST does).
pub(super) const TRANSACTION_BLOCKS_REFUSED: &str =
    "transaction blocks not allowed in statement pooling mode";

impl Session {
    /// The server opened a transaction for this statement-pooled client:
    /// its connection is closed (never returned with the transaction) and
    /// the client ended with FATAL, after what it was already sent.
    pub(super) async fn refuse_transaction_block(&mut self) -> SessionError {
        if let Some(server) = self.server.take() {
            tracing::info!(server = %server.cancel.address, user = %self.id.user, database = %self.id.database, "closing the client: {TRANSACTION_BLOCKS_REFUSED}");
            server.discard();
        }
        self.owed = Owing::default();
        self.id.cancel.set_target(None);
        self.fatal_client(sqlstate::PROTOCOL_VIOLATION, TRANSACTION_BLOCKS_REFUSED)
            .await
    }
}
