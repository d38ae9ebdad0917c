//! What the admin console asks of a cluster, whatever its protocol: its
//! config, router and health view, and its pools. Implemented for every
//! protocol's cluster context (`context::ProtocolContext`); read by
//! `fulcrum-admin`.

use std::sync::Arc;

use fulcrum_config::Cluster;
use fulcrum_pool::Router;

use crate::view::ClusterView;

/// One listening connection (PostgreSQL LISTEN/NOTIFY in transaction
/// pooling): its database and user, what it listens to, for whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerRow {
    pub database: String,
    pub user: String,
    /// Channels listened to on the server.
    pub channels: usize,
    /// Clients listening to at least one of them.
    pub clients: usize,
    /// (client, channel) pairs.
    pub subscriptions: usize,
    /// The backend it listens on now (`None`: connecting, or nobody listens).
    pub backend: Option<String>,
    /// Times it was opened again (failover, switchover, a lost connection).
    pub reconnects: u64,
}

/// One pool: server connections of one backend for one (user, database).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRow {
    pub backend: String,
    pub user: String,
    pub database: String,
    pub active: usize,
    pub idle: usize,
    /// Of `idle`, those past `server_check_delay` (PgBouncer's `used`).
    pub used: usize,
    /// Of `active`, connections from the reserve (`reserve_pool_size`).
    pub reserve: usize,
    pub opened: u64,
    pub closed: u64,
    pub waits: u64,
}

pub trait ClusterAdmin: Send + Sync {
    fn config(&self) -> &Cluster;
    fn router(&self) -> &Arc<Router>;
    fn view(&self) -> &Arc<ClusterView>;
    fn pools(&self) -> Vec<PoolRow>;
    /// Clients logged in now.
    fn clients(&self) -> i64;
    /// The health loop, for a planned switchover (None before it started).
    fn monitor(&self) -> Option<crate::MonitorHandle>;
    /// Admin `RECONNECT`: the server connections of `database` (all when
    /// `None`; MySQL connections serve every schema, so all of them) are
    /// closed once idle. Returns the pools touched.
    fn reconnect(&self, database: Option<&str>) -> usize;
    /// Connections a RECONNECT of `database` still waits to close.
    fn retiring(&self, database: Option<&str>) -> usize;
    /// The cluster's statement digests (SHOW QUERIES).
    fn digests(&self) -> Arc<fulcrum_metrics::DigestTable>;
    /// Its listening connections (SHOW LISTENERS; none for MySQL).
    fn listeners(&self) -> Vec<ListenerRow>;
    /// Its mirror targets' diffs (SHOW MIRROR).
    fn mirrors(&self) -> Vec<Arc<fulcrum_metrics::MirrorStats>>;
    /// `[cluster.cache]`: the result cache, when configured.
    fn cache(&self) -> Option<fulcrum_cache::Cache>;
}
