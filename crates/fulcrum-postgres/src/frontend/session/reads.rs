//! PostgreSQL's side of read consistency (`fulcrum_session::reads` does
//! the steps; docs/consistency.md): positions are WAL LSNs; a unit that may
//! have written asks the primary `pg_current_wal_*_lsn()` on its own
//! connection once its answer is on the way to the client; a replica is
//! asked `pg_last_wal_replay_lsn()`, polled while a read waits. Fulcrum's
//! answers to the causal-token and `fulcrum.consistency` statements are in
//! `token.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fulcrum_pool::Checkout;
use fulcrum_session::reads::{Check, Positions, ReplicaProbe};

use super::Session;
use crate::backend::ServerConn;
use crate::codec::frontend_msg::put_query;
use crate::frontend::context::ClusterContext;
use crate::frontend::expect::Expect;

/// The position a read must reach to see what was committed: the WAL
/// flush position, which every commit acknowledged under
/// `synchronous_commit` other than `off` is below; with `off` a commit is
/// acknowledged before its WAL is flushed, so the insert position is taken
/// (the replica then also waits for the walwriter's next flush).
const POSITION_SQL: &str = "SELECT (CASE WHEN current_setting('synchronous_commit') = 'off' \
     THEN pg_current_wal_insert_lsn() ELSE pg_current_wal_flush_lsn() END)::text";

/// Polling interval while a read waits for a replica to replay.
const POLL: Duration = Duration::from_millis(1);

/// WAL positions, ordered as numbers.
#[derive(Debug, Clone)]
pub(crate) struct Lsn;

impl Positions for Lsn {
    type P = u64;
    fn newer(a: &u64, b: &u64) -> bool {
        a > b
    }
    fn parse(text: &str) -> Option<u64> {
        fulcrum_cluster::lag::parse_lsn(text)
    }
}

/// A replica's connection, asked for its replay position.
struct Replica<'a>(&'a mut Checkout<ServerConn>);

impl ReplicaProbe<u64> for Replica<'_> {
    async fn reached(&mut self, position: &u64, wait: Duration) -> Option<bool> {
        let started = Instant::now();
        loop {
            let replayed = single_lsn(self.0, "SELECT pg_last_wal_replay_lsn()::text").await?;
            if replayed >= *position {
                return Some(true);
            }
            if started.elapsed() + POLL > wait {
                return Some(false);
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Session {
    /// A unit on the primary that may have written is over (ReadyForQuery
    /// 'I', nothing else owed): ask the primary's position on the same
    /// connection, behind the answer the client already has.
    pub(super) fn after_unit(&mut self) {
        if !self.engine.unit().wrote_on_primary || self.owed.ready > 0 || self.owed.unsynced {
            return;
        }
        self.engine.write_over();
        // With one backend every read is on the primary already: no
        // position to keep (a single-node cluster pays nothing).
        if !self.reads.tracks_writes()
            || self.engine.pinned().is_some()
            || self.server.is_none()
            || self.ctx.router.backend_count() < 2
        {
            return;
        }
        // The client's unit is over now: count it before the connection is
        // held for Fulcrum's own query.
        self.record_unit();
        self.reads
            .learning(&self.ctx.reads(&self.id.user, &self.id.database));
        put_query(&mut self.to_server, POSITION_SQL);
        self.owed.expect.push(Expect::Position);
    }

    /// The answer to the position query arrived (`None`: it failed).
    pub(super) fn on_position(&mut self, lsn: Option<u64>) {
        let shared = self.ctx.reads(&self.id.user, &self.id.database);
        self.reads.learnt(&shared, lsn);
    }

    /// May the replica `backend`, on connection `server`, serve the read
    /// being routed?
    pub(super) async fn causal_check(
        &mut self,
        backend: fulcrum_pool::BackendId,
        server: &mut Checkout<ServerConn>,
    ) -> Check {
        let shared = self.ctx.reads(&self.id.user, &self.id.database);
        let ctx = &self.ctx;
        let (user, database) = (&self.id.pool_user, &self.id.database);
        let strong = || {
            ctx.primary_position
                .get(|| primary_position(ctx, user, database))
        };
        self.reads
            .check(&shared, backend, &mut Replica(server), strong)
            .await
    }
}

/// The primary's position as of now, on a connection from the client's own
/// pool to the primary, returned at once.
pub(super) async fn primary_position(
    ctx: &ClusterContext,
    user: &Arc<str>,
    database: &Arc<str>,
) -> Option<u64> {
    let primary = ctx.router.primary()?;
    ctx.metrics.position_queries.inc();
    let pool = ctx.pool(primary, user, database);
    let mut conn = pool.get(|| ctx.open(primary, user, database)).await.ok()?;
    let lsn = single_lsn(&mut conn, POSITION_SQL).await;
    match lsn {
        Some(_) => conn.release(),
        None => conn.discard(),
    }
    lsn
}

/// Runs a query answering one LSN on `conn`.
async fn single_lsn(conn: &mut Checkout<ServerConn>, sql: &str) -> Option<u64> {
    let rows = conn.query_rows(sql).await.ok()?;
    let text = rows.first()?.first()?.as_deref()?;
    fulcrum_cluster::lag::parse_lsn(text)
}
