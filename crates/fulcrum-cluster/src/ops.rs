//! What the health loop needs from a database server, implemented once per
//! protocol (PostgreSQL in `fulcrum-postgres`, MariaDB in `fulcrum-mysql`):
//! probe a backend's role and position, promote a replica, re-point a
//! replica at a new primary. Implementations keep their own connections.

use std::future::Future;
use std::time::Duration;

use fulcrum_pool::BackendId;
use thiserror::Error;

/// One probe's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Observation {
    /// Takes writes (PostgreSQL: not in recovery; MariaDB: not read_only).
    pub writable: bool,
    /// Timeline (PostgreSQL) of a writable node; 0 when unknown.
    pub timeline: u64,
    /// A primary's current write position; a replica's replayed position.
    pub position: u64,
    /// A replica's received position (at least `position`); a primary's own.
    pub received: u64,
    /// A replica: how old the last change it replayed is.
    pub replay_age: Option<Duration>,
    /// Read-only but replicating from nobody (MariaDB: no replication
    /// configured), e.g. a primary fenced by a switchover: it will never
    /// catch up, so it is treated like a writable node that is not the
    /// primary (fenced, no traffic) until it is re-joined as a replica.
    pub detached: bool,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum OpsError {
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("query failed: {0}")]
    Query(String),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The server is up and refused the probe's login (wrong password, no
    /// right to the database): not a reason to take the backend out.
    #[error("probe login refused: {0}")]
    LoginRefused(String),
}

/// Server-specific operations of the health loop.
pub trait ServerOps: Send + Sync + 'static {
    /// The backend's address as configured (for logs and failover_command).
    fn address(&self, backend: BackendId) -> &str;

    /// Asks `backend` its role and position.
    fn probe(
        &self,
        backend: BackendId,
    ) -> impl Future<Output = Result<Observation, OpsError>> + Send;

    /// Makes the replica `backend` a primary; returns once it takes writes.
    fn promote(&self, backend: BackendId) -> impl Future<Output = Result<(), OpsError>> + Send;

    /// Makes the primary `backend` refuse writes (planned switchover) and
    /// returns the position a replica must replay to hold every write it
    /// acknowledged, asynchronously committed ones included (PostgreSQL: the
    /// WAL *insert* position, not the write position, which lags it under
    /// `synchronous_commit = off`).
    fn fence(&self, backend: BackendId) -> impl Future<Output = Result<u64, OpsError>> + Send;

    /// Planned switchover with `transaction_replay`: ends the client
    /// sessions idle in a transaction on `backend` (the old primary), so
    /// that their transactions are replayed on the new primary instead of
    /// holding the switchover up; returns how many were ended.
    fn end_idle_transactions(
        &self,
        _backend: BackendId,
    ) -> impl Future<Output = Result<u64, OpsError>> + Send {
        async { Ok(0) }
    }

    /// The first transaction id `backend`, just promoted and given no
    /// write yet, has not handed out (PostgreSQL: the xmax of a snapshot):
    /// what a COMMIT in flight at the failover is resolved against
    /// (`Router::commit_floor`). `None` where the protocol has no such id.
    fn commit_floor(
        &self,
        _backend: BackendId,
    ) -> impl Future<Output = Result<Option<u64>, OpsError>> + Send {
        async { Ok(None) }
    }

    /// Re-points the replica `replica` at `primary`.
    fn follow(
        &self,
        replica: BackendId,
        primary: BackendId,
    ) -> impl Future<Output = Result<(), OpsError>> + Send;
}
