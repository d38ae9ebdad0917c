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
    /// The top digests to export (`digest_metrics_top`; empty when off).
    pub digests: Vec<crate::DigestRow>,
    /// Who decides the primary (`topology`); `None` with `probe`.
    pub coordination: Option<CoordinationFigures<'a>>,
}

/// A coordinated cluster's figures (`topology = "etcd"` / `"patroni"`).
pub struct CoordinationFigures<'a> {
    pub source: &'a str,
    pub epoch: u64,
    pub leading: bool,
    /// Seconds since the coordinator last answered (`None`: never).
    pub heard_ago: Option<f64>,
    pub cut_off: bool,
}

/// Longest statement text in a digest's `query` label.
const QUERY_LABEL_MAX: usize = 200;

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
        if let Some(k) = &f.coordination {
            self.topology_source
                .with_label_values(&[c, k.source])
                .set(1);
            self.topology_epoch
                .with_label_values(&[c])
                .set(k.epoch.min(i64::MAX as u64) as i64);
            self.topology_leader
                .with_label_values(&[c])
                .set(i64::from(k.leading));
            self.topology_cut_off
                .with_label_values(&[c])
                .set(i64::from(k.cut_off));
            self.topology_contact_age
                .with_label_values(&[c])
                .set(k.heard_ago.unwrap_or(-1.0));
        }
        for d in &f.digests {
            let key = format!("{:016x}", d.id);
            let text = match d.text.char_indices().nth(QUERY_LABEL_MAX) {
                Some((i, _)) => &d.text[..i],
                None => &d.text,
            };
            let l = [c, key.as_str(), text];
            self.digest_calls.with_label_values(&l).set(d.calls as i64);
            self.digest_errors
                .with_label_values(&l)
                .set(d.errors as i64);
            self.digest_rows
                .with_label_values(&l)
                .set(d.rows.min(i64::MAX as u64) as i64);
            self.digest_seconds
                .with_label_values(&l)
                .set(d.total_us as f64 / 1e6);
            self.digest_p99_seconds
                .with_label_values(&l)
                .set(d.p99_us as f64 / 1e6);
        }
        if let Some(n) = f.prepared_statements {
            self.prepared_statements
                .with_label_values(&[c])
                .set(n as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    struct Top(crate::DigestTable, usize);

    impl crate::Source for Top {
        fn refresh(&self, m: &Metrics) {
            m.set_cluster(&ClusterFigures {
                cluster: "main",
                backends: vec![],
                failovers: 0,
                classifier_hits: 0,
                classifier_misses: 0,
                unparsed: 0,
                oversized: 0,
                prepared_statements: None,
                failover_blocked: false,
                digests: self.0.top(self.1),
                coordination: None,
            });
        }
    }

    #[test]
    fn only_the_top_digests_are_exported_and_a_reset_one_leaves() {
        let t = crate::DigestTable::new(100);
        for (k, us) in [(1u64, 900u64), (2, 500), (3, 10)] {
            let d = t.get(k, || (k, format!("select {k}"))).unwrap();
            d.record(Duration::from_micros(us), 2, k == 2, true);
        }
        let m = Metrics::new();
        let top = Arc::new(Top(t, 2));
        m.set_source("main", top.clone());
        let text = m.encode();
        let calls: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("fulcrum_query_digest_calls{"))
            .collect();
        assert_eq!(calls.len(), 2, "{text}");
        assert!(text.contains("query=\"select 1\"} 1"), "{text}");
        assert!(text.contains("fulcrum_query_digest_errors{cluster=\"main\",digest=\"0000000000000002\",query=\"select 2\"} 1"), "{text}");
        assert!(!text.contains("select 3"), "not in the top 2");
        top.0.reset();
        assert!(!m.encode().contains("fulcrum_query_digest_calls{"));
    }
}
