//! Fulcrum's Prometheus metrics. Owns the metric families (`families.rs`),
//! the per-cluster handles the data path increments (`cluster.rs`: label
//! values bound once, so a query costs a few atomic adds), figures taken at
//! scrape time from pools, health and classifier (`Source`), the status
//! page's recent history (`history.rs`), and the `/metrics` endpoint and
//! status page (`http.rs`). Knows no wire protocol.

#![forbid(unsafe_code)]

mod cluster;
pub mod digest;
mod families;
pub mod history;
pub mod http;
pub mod mirror;
mod refresh;

pub use cluster::{CausalOutcome, ClientCount, ClusterMetrics, RouteLabel};
pub use digest::{Digest, DigestMemo, DigestRow, DigestTable, Stamp};
pub use families::Metrics;
pub use mirror::{MirrorRow, MirrorStats};
pub use refresh::{BackendFigures, ClusterFigures, CoordinationFigures};

/// Something that refreshes its scrape-time figures (pool sizes, backend
/// states, lag, ...) into the families just before they are encoded.
pub trait Source: Send + Sync {
    fn refresh(&self, metrics: &Metrics);
}
