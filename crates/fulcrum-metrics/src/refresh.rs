//! Scrape-time figures every protocol reports the same way: pool sizes per
//! backend, the health loop's view of each backend, failovers, and the
//! classifier's counters. Protocol crates gather them; this sets the gauges.

use std::time::Duration;

use crate::families::Metrics;

/// One backend as the health loop and the pools see it.
pub struct BackendFigures<'a> {
    pub address: &'a str,
    pub state: &'a str,
    pub primary: bool,
    pub lag_bytes: u64,
    pub lag_time: Duration,
    pub active: usize,
    pub idle: usize,
    /// The probe's login is refused (the backend stays in service).
    pub probe_login_refused: bool,
}

/// A cluster's scrape-time figures.
pub struct ClusterFigures<'a> {
    pub cluster: &'a str,
    pub backends: Vec<BackendFigures<'a>>,
    pub failovers: u64,
    pub classifier_hits: u64,
    pub classifier_misses: u64,
    pub unparsed: u64,
    /// Statements over `max_classify_bytes`, not parsed.
    pub oversized: u64,
    /// Prepared statements clients hold (PostgreSQL's shared registry).
    pub prepared_statements: Option<usize>,
    /// Automatic promotion is held back (`failover_max_lag`).
    pub failover_blocked: bool,
}

const STATES: [&str; 4] = ["up", "lagging", "down", "stale"];

impl Metrics {
    pub fn set_cluster(&self, f: &ClusterFigures<'_>) {
        let c = f.cluster;
        for b in &f.backends {
            let a = b.address;
            self.server_connections
                .with_label_values(&[c, a, "active"])
                .set(b.active as i64);
            self.server_connections
                .with_label_values(&[c, a, "idle"])
                .set(b.idle as i64);
            self.backend_up
                .with_label_values(&[c, a])
                .set(i64::from(b.state != "down"));
            for s in STATES {
                self.backend_state
                    .with_label_values(&[c, a, s])
                    .set(i64::from(b.state == s));
            }
            self.backend_primary
                .with_label_values(&[c, a])
                .set(i64::from(b.primary));
            self.probe_login_refused
                .with_label_values(&[c, a])
                .set(i64::from(b.probe_login_refused));
            self.lag_bytes
                .with_label_values(&[c, a])
                .set(b.lag_bytes.min(i64::MAX as u64) as i64);
            self.lag_seconds
                .with_label_values(&[c, a])
                .set(b.lag_time.as_secs_f64());
        }
        Metrics::catch_up(&self.failovers.with_label_values(&[c]), f.failovers);
        Metrics::catch_up(
            &self.classifier_hits.with_label_values(&[c]),
            f.classifier_hits,
        );
        Metrics::catch_up(
            &self.classifier_misses.with_label_values(&[c]),
            f.classifier_misses,
        );
        Metrics::catch_up(&self.unparsed.with_label_values(&[c]), f.unparsed);
        Metrics::catch_up(&self.oversized.with_label_values(&[c]), f.oversized);
        self.failover_blocked
            .with_label_values(&[c])
            .set(i64::from(f.failover_blocked));
        if let Some(n) = f.prepared_statements {
            self.prepared_statements
                .with_label_values(&[c])
                .set(n as i64);
        }
    }
}
