//! One cluster's handles on the data path: label values bound at start, so
//! counting a query, its bytes and its duration is a few atomic adds.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{Histogram, IntCounter, IntGauge};

use crate::families::Metrics;

/// Where a unit of work was routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteLabel {
    Read = 0,
    Write = 1,
}

impl RouteLabel {
    fn as_str(self) -> &'static str {
        match self {
            RouteLabel::Read => "read",
            RouteLabel::Write => "write",
        }
    }
}

pub struct ClusterMetrics {
    pub name: String,
    metrics: Arc<Metrics>,
    /// Per backend: [read, write].
    queries: Vec<[IntCounter; 2]>,
    transactions: Vec<[IntCounter; 2]>,
    pub clients: IntGauge,
    pub waiting: IntGauge,
    pub bytes_in: IntCounter,
    pub bytes_out: IntCounter,
    unit_seconds: [Histogram; 2],
    pub pool_wait: Histogram,
    /// Time Fulcrum adds before the server sees a unit of work.
    pub proxy: Histogram,
    /// Causal reads by outcome: [replica, waited, primary].
    causal: [IntCounter; 3],
    /// `strong`: queries asking the primary for its position.
    pub position_queries: IntCounter,
    error_labels: ErrorLabels,
}

/// Distinct error labels one cluster may create.
pub const ERROR_LABELS_MAX: usize = 200;

/// The bounded set of `fulcrum_errors_total` code labels of a cluster.
#[derive(Debug, Default)]
struct ErrorLabels {
    seen: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// PostgreSQL's SQLSTATE classes (Appendix A of its manual).
const PG_CLASSES: &[&str] = &[
    "00", "01", "02", "03", "08", "09", "0A", "0B", "0F", "0L", "0P", "0Z", "20", "21", "22", "23",
    "24", "25", "26", "27", "28", "2B", "2D", "2F", "34", "38", "39", "3B", "3D", "3F", "40", "42",
    "44", "53", "54", "55", "57", "58", "72", "F0", "HV", "P0", "XX",
];

/// A code the servers themselves use: a PostgreSQL SQLSTATE class, or a
/// MySQL/MariaDB server error number (1000-1999, 3000-4999).
fn server_code(code: &str) -> bool {
    if PG_CLASSES.contains(&code) {
        return true;
    }
    code.parse::<u16>()
        .is_ok_and(|n| (1000..2000).contains(&n) || (3000..5000).contains(&n))
}

impl ErrorLabels {
    fn label<'a>(&self, code: &'a str) -> &'a str {
        if !server_code(code) {
            return "other";
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(code) {
            return code;
        }
        if seen.len() >= ERROR_LABELS_MAX {
            return "other";
        }
        seen.insert(code.to_owned());
        code
    }
}

/// Where a read with a position to respect ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CausalOutcome {
    /// A replica already past the position.
    Replica = 0,
    /// A replica, after waiting for it.
    Waited = 1,
    /// The primary.
    Primary = 2,
}

/// One connected client, counted in `fulcrum_client_connections` from
/// `ClusterMetrics::client_connected` until dropped: on every way a session
/// ends, a panic of its task included.
#[must_use = "the client is counted while this is held"]
pub struct ClientCount(IntGauge);

impl Drop for ClientCount {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl ClusterMetrics {
    /// Counts a client in until the returned guard is dropped.
    pub fn client_connected(&self) -> ClientCount {
        self.clients.inc();
        ClientCount(self.clients.clone())
    }

    pub fn new(metrics: Arc<Metrics>, cluster: &str, backends: &[String]) -> ClusterMetrics {
        let per_backend = |vec: &prometheus::IntCounterVec| {
            backends
                .iter()
                .map(|b| {
                    [RouteLabel::Read, RouteLabel::Write]
                        .map(|r| vec.with_label_values(&[cluster, b, r.as_str()]))
                })
                .collect()
        };
        ClusterMetrics {
            name: cluster.to_owned(),
            queries: per_backend(&metrics.queries),
            transactions: per_backend(&metrics.transactions),
            clients: metrics.client_connections.with_label_values(&[cluster]),
            waiting: metrics.clients_waiting.with_label_values(&[cluster]),
            bytes_in: metrics.bytes.with_label_values(&[cluster, "in"]),
            bytes_out: metrics.bytes.with_label_values(&[cluster, "out"]),
            unit_seconds: [RouteLabel::Read, RouteLabel::Write].map(|r| {
                metrics
                    .query_seconds
                    .with_label_values(&[cluster, r.as_str()])
            }),
            pool_wait: metrics.pool_wait_seconds.with_label_values(&[cluster]),
            proxy: metrics.proxy_seconds.with_label_values(&[cluster]),
            causal: ["replica", "waited", "primary"]
                .map(|o| metrics.causal_reads.with_label_values(&[cluster, o])),
            position_queries: metrics.position_queries.with_label_values(&[cluster]),
            error_labels: ErrorLabels::default(),
            metrics,
        }
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// `n` statements forwarded to `backend` on `route`.
    pub fn queries(&self, backend: usize, route: RouteLabel, n: u64) {
        if let Some(c) = self.queries.get(backend) {
            c[route as usize].inc_by(n);
        }
    }

    /// A unit of work ended: it held `backend` for `took`.
    pub fn unit(&self, backend: usize, route: RouteLabel, took: Duration) {
        if let Some(c) = self.transactions.get(backend) {
            c[route as usize].inc();
        }
        self.unit_seconds[route as usize].observe(took.as_secs_f64());
    }

    /// A read with a position to respect ran as `outcome` says.
    pub fn causal(&self, outcome: CausalOutcome) {
        self.causal[outcome as usize].inc();
    }

    /// A transaction replay ended: `replayed` or `failed`.
    pub fn transaction_replay(&self, outcome: &'static str) {
        self.metrics
            .transaction_replays
            .with_label_values(&[self.name.as_str(), outcome])
            .inc();
    }

    /// A hook for the cluster's pools: counts each `server_check_delay`
    /// check as `passed` or `failed`.
    pub fn server_check_hook(&self) -> Arc<dyn Fn(bool) + Send + Sync> {
        let counters = [false, true].map(|passed| {
            self.metrics
                .server_checks
                .with_label_values(&[self.name.as_str(), if passed { "passed" } else { "failed" }])
        });
        Arc::new(move |passed| counters[passed as usize].inc())
    }

    /// A read of a database's user functions ended: loaded or failed.
    pub fn function_lookup(&self, loaded: bool) {
        self.metrics
            .function_lookups
            .with_label_values(&[self.name.as_str(), if loaded { "loaded" } else { "failed" }])
            .inc();
    }

    /// A read of a database's relations (the result cache's relation
    /// catalog) ended: loaded or failed.
    pub fn relation_lookup(&self, loaded: bool) {
        self.metrics
            .relation_lookups
            .with_label_values(&[self.name.as_str(), if loaded { "loaded" } else { "failed" }])
            .inc();
    }

    /// An `auth_query` lookup ended: `cached`, `found`, `missing`,
    /// `limited` or `failed`.
    pub fn auth_lookup(&self, outcome: &'static str) {
        self.metrics
            .auth_lookups
            .with_label_values(&[self.name.as_str(), outcome])
            .inc();
    }

    /// A client closed by a timeout: `login` (`client_login_timeout`),
    /// `client_idle`, `idle_transaction` or `query`.
    pub fn timeout(&self, kind: &'static str) {
        self.metrics
            .client_timeouts
            .with_label_values(&[self.name.as_str(), kind])
            .inc();
    }

    /// A listening server connection was opened again (LISTEN/NOTIFY).
    pub fn listen_reconnect(&self) {
        self.metrics
            .listen_reconnects
            .with_label_values(&[self.name.as_str()])
            .inc();
    }

    /// `n` notifications queued for clients (`delivered`) or dropped.
    pub fn notifications(&self, outcome: &'static str, n: u64) {
        if n > 0 {
            self.metrics
                .notifications
                .with_label_values(&[self.name.as_str(), outcome])
                .inc_by(n);
        }
    }

    /// Moves the count of channels listened to by `delta`.
    pub fn listen_channels(&self, delta: i64) {
        self.metrics
            .listen_channels
            .with_label_values(&[self.name.as_str()])
            .add(delta);
    }

    /// An error sent to a client, by SQLSTATE class or MySQL code. The
    /// label set is bounded (clients choose codes: `RAISE ... ERRCODE`,
    /// `SIGNAL ... MYSQL_ERRNO`): a code outside the servers' own ones, or
    /// past the first `ERROR_LABELS_MAX` distinct ones, counts as `other`.
    pub fn error(&self, code: &str) {
        let label = self.error_labels.label(code);
        self.metrics
            .errors
            .with_label_values(&[self.name.as_str(), label])
            .inc();
    }
}

#[cfg(test)]
mod client_count_tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_session_still_leaves_the_count() {
        let m = ClusterMetrics::new(Arc::new(Metrics::new()), "c", &["a:1".into()]);
        let held = m.client_connected();
        let gauge = m.clients.clone();
        let task = tokio::spawn(async move {
            let _count = held;
            panic!("a session bug");
        });
        assert!(task.await.is_err(), "the task panicked");
        assert_eq!(gauge.get(), 0);
        let other = m.client_connected();
        assert_eq!(m.clients.get(), 1);
        drop(other);
        assert_eq!(m.clients.get(), 0);
    }
}

#[cfg(test)]
mod error_label_tests {
    use super::*;

    #[test]
    fn client_chosen_codes_do_not_grow_the_label_set() {
        let labels = ErrorLabels::default();
        assert_eq!(labels.label("42"), "42");
        assert_eq!(labels.label("1146"), "1146");
        assert_eq!(labels.label("ZZ"), "other", "a made-up SQLSTATE class");
        assert_eq!(labels.label("45000"), "other", "not a server error number");
        assert_eq!(labels.label("12"), "other");
        for n in 1000..1999u16 {
            labels.label(&n.to_string());
        }
        assert_eq!(labels.seen.lock().unwrap().len(), ERROR_LABELS_MAX);
        assert_eq!(labels.label("1998"), "other", "past the bound");
        assert_eq!(labels.label("42"), "42", "a label seen before stays");
    }
}
