//! `query_timeout`: when the server, owing an answer, has been silent too
//! long, the statement is cancelled on the server (a CancelRequest) and its
//! own error reaches the client.

use super::*;

impl Session {
    /// When the server, owing an answer, will have been silent for
    /// `query_timeout` (`None`: no timeout, the server owes nothing, or the
    /// cancel went out). Silence, not total time, so a pipeline of quick
    /// statements or a long result streaming rows is never cut.
    pub(super) fn query_deadline(&mut self) -> Option<tokio::time::Instant> {
        let limit = self.ctx.config.query_timeout?;
        let owing = self.server.is_some() && !self.owed.expect.is_empty();
        if !owing {
            self.timer.busy_since = None;
            self.timer.cancelled = false;
            return None;
        }
        let since = *self
            .timer
            .busy_since
            .get_or_insert_with(tokio::time::Instant::now);
        (!self.timer.cancelled).then_some(since + limit)
    }

    /// `query_timeout`: asks the server to cancel what it is running (a
    /// CancelRequest, as psql's Ctrl-C); its error (57014) then reaches the
    /// client as PostgreSQL sends it, and the session goes on.
    pub(super) fn cancel_slow_query(&mut self) {
        self.timer.cancelled = true;
        let Some(server) = self.server.as_ref() else {
            return;
        };
        let key = server.cancel.clone();
        let timeout = self.ctx.config.connect_timeout;
        self.ctx.metrics.timeout("query");
        tracing::info!(user = ?self.id.user, cluster = %self.ctx.name(), limit = ?self.ctx.config.query_timeout, "query_timeout: cancelling the statement on the server");
        tokio::spawn(async move {
            if let Err(e) = crate::backend::connect::send_cancel(&key, timeout).await {
                tracing::warn!(error = %e, "query_timeout: the cancel request failed");
            }
        });
    }
}
