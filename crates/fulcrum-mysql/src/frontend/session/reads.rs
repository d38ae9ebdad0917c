//! MariaDB's side of read consistency (`fulcrum_session::reads` does the
//! steps; docs/consistency.md): positions are GTID lists; a write's
//! position comes in its OK (`last_gtid` session tracking, which Fulcrum
//! turns on for its server connections) or, for a connector that takes no
//! session-state information, from `SELECT @@last_gtid` once the client
//! has its answer; a replica is asked `MASTER_GTID_WAIT(gtid, secs)`.
//! Fulcrum's answers to the causal-token and `fulcrum.consistency`
//! statements are in `token.rs`.

use std::sync::Arc;
use std::time::Duration;

use fulcrum_pool::{BackendId, Checkout, Need, Route};
use fulcrum_session::reads::{Check, Positions, ReplicaProbe};
use fulcrum_session::Target;

use super::Session;
use crate::backend::ServerConn;
use crate::frontend::context::MyClusterContext;
use crate::frontend::error::SessionError;

/// MariaDB GTID lists (`domain-server-seq[,...]`).
#[derive(Debug, Clone)]
pub(crate) struct Gtid;

impl Positions for Gtid {
    type P = String;

    /// A higher sequence number in the same domain; another domain (or a
    /// list) replaces it (the newest report wins).
    fn newer(a: &String, b: &String) -> bool {
        let split = |g: &str| -> Option<(u64, u64)> {
            let mut p = g.split('-');
            let domain = p.next()?.parse().ok()?;
            let _server = p.next()?;
            let seq = p.next()?.parse().ok()?;
            p.next().is_none().then_some((domain, seq))
        };
        match (split(a), split(b)) {
            (Some((da, sa)), Some((db, sb))) if da == db => sa > sb,
            _ => a != b,
        }
    }

    fn parse(text: &str) -> Option<String> {
        let list = !text.is_empty()
            && text.split(',').all(|g| {
                let parts: Vec<&str> = g.trim().split('-').collect();
                parts.len() == 3
                    && parts
                        .iter()
                        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            });
        list.then(|| text.to_owned())
    }

    /// `@@gtid_binlog_pos` is empty before the first commit.
    fn is_origin(position: &String) -> bool {
        position.is_empty()
    }
}

/// A replica's connection, asked with `MASTER_GTID_WAIT`.
struct Replica<'a>(&'a mut Checkout<ServerConn>);

impl ReplicaProbe<String> for Replica<'_> {
    async fn reached(&mut self, gtid: &String, wait: Duration) -> Option<bool> {
        let sql = format!(
            "SELECT MASTER_GTID_WAIT('{}', {})",
            gtid.replace(['\'', '\\'], ""),
            wait.as_secs_f64()
        );
        match self.0.query_value(&sql).await {
            Ok(v) => Some(v.as_deref() == Some("0")),
            Err(_) => None,
        }
    }
}

impl Session {
    /// The schema the user positions are kept under.
    pub(super) fn schema_key(&self) -> Arc<str> {
        self.schema.as_deref().unwrap_or("").into()
    }

    /// After an answer from the primary: the GTID of a write it committed.
    /// A connection that cannot report it in the OK is asked `@@last_gtid`
    /// once the client has its answer; if that fails, the client's reads go
    /// to the primary until its next write. Not after a unit whose next
    /// command needs the session's diagnostics as it left them
    /// (`SQL_CALC_FOUND_ROWS`, `keep_next`): a question would reset its
    /// `FOUND_ROWS()`, so the position counts as unknown instead.
    pub(super) async fn after_primary_answer(
        &mut self,
        last_gtid: Option<String>,
        target: Target,
        keep_next: bool,
    ) -> Result<(), SessionError> {
        if !self.ctx.router.is_primary(self.backend) {
            return Ok(());
        }
        if let Some(g) = last_gtid {
            let schema = self.schema_key();
            self.reads
                .learnt(&self.ctx.reads(&self.user, &schema), Some(g));
            return Ok(());
        }
        let Some(server) = self.server.as_ref() else {
            return Ok(());
        };
        // With one backend every read is on the primary already: no GTID
        // to fetch (a single-node cluster pays nothing).
        if server.track_gtid
            || self.ctx.router.backend_count() < 2
            || target == Target::Go(Route::Replica)
            || !self.engine.unit().may_write
            || self.in_transaction()
            || !self.reads.tracks_writes()
        {
            return Ok(());
        }
        let schema = self.schema_key();
        if keep_next {
            // Reads on the primary until the client's next write.
            self.reads
                .learnt(&self.ctx.reads(&self.user, &schema), None);
            return Ok(());
        }
        // The answer goes out before its GTID is known: another connection
        // of the user reads on the primary meanwhile.
        self.reads.learning(&self.ctx.reads(&self.user, &schema));
        self.flush().await?;
        let server = self.server.as_mut().expect("attached");
        let answer = server.query_value("SELECT @@last_gtid").await;
        let shared = self.ctx.reads(&self.user, &schema);
        match answer {
            Ok(Some(g)) if !g.is_empty() && self.reads.need() != &Need::At(g.clone()) => {
                self.reads.learnt(&shared, Some(g))
            }
            Ok(_) => self.reads.nothing_learnt(&shared),
            Err(_) => self.reads.learnt(&shared, None),
        }
        Ok(())
    }

    /// May the replica `backend`, on `server`, serve the read being routed?
    pub(super) async fn causal_ok(
        &mut self,
        backend: BackendId,
        server: &mut Checkout<ServerConn>,
    ) -> bool {
        let schema = self.schema_key();
        let shared = self.ctx.reads(&self.user, &schema);
        let (ctx, user, wire, charset) = (
            &self.ctx,
            &self.user,
            self.hello.wire_format,
            self.hello.charset,
        );
        let strong = || {
            ctx.primary_position
                .get(|| primary_position(ctx, user, wire, charset))
        };
        self.reads
            .check(&shared, backend, &mut Replica(server), strong)
            .await
            == Check::Serve
    }
}

/// `@@gtid_binlog_pos` on a connection to the primary, as of now.
pub(super) async fn primary_position(
    ctx: &MyClusterContext,
    user: &Arc<str>,
    wire: mysql_common::constants::CapabilityFlags,
    charset: u8,
) -> Option<String> {
    let primary = ctx.router.primary()?;
    ctx.metrics.position_queries.inc();
    let pool = ctx.pool(primary, user, wire, charset);
    let mut conn = pool
        .get(|| ctx.open(primary, user, wire, charset))
        .await
        .ok()?;
    match conn.query_value("SELECT @@gtid_binlog_pos").await {
        Ok(v) => {
            conn.release();
            Some(v.unwrap_or_default())
        }
        Err(_) => {
            conn.discard();
            None
        }
    }
}
