//! The status page's recent history: every [`SAMPLE_EVERY`] a task reads
//! each cluster's running totals (units of work, errors sent to clients,
//! pool checkouts and their wait, clients waiting) from the metric families
//! and keeps the last [`WINDOW`] of them in a fixed ring per cluster. The
//! page (`/api/v1/history`) draws its charts from the differences between
//! consecutive samples. Memory is bounded and independent of traffic:
//! [`SAMPLES`] samples of a few integers per cluster, for at most
//! [`MAX_CLUSTERS`] clusters.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus::core::Collector;
use tokio::sync::watch;

use crate::Metrics;

/// How often the totals are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// How far back the history reaches.
pub const WINDOW: Duration = Duration::from_secs(600);
/// Samples kept per cluster: one interval more than the window holds, so
/// the window has `WINDOW / SAMPLE_EVERY` differences.
pub const SAMPLES: usize = (WINDOW.as_secs() / SAMPLE_EVERY.as_secs()) as usize + 1;
/// Clusters with a history (a config holds far fewer).
pub const MAX_CLUSTERS: usize = 256;

/// A cluster's running totals at one moment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    /// Units of work (`fulcrum_transactions_total`).
    pub transactions: u64,
    /// Errors sent to clients (`fulcrum_errors_total`).
    pub errors: u64,
    /// Pool checkouts timed, and their summed wait in µs
    /// (`fulcrum_pool_wait_seconds`).
    pub pool_waits: u64,
    pub pool_wait_us: u64,
    /// Clients waiting for a server connection now.
    pub clients_waiting: i64,
}

/// One sample: the totals and when they were read (Unix ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    at_unix_ms: u64,
    totals: Totals,
}

/// What happened between two consecutive samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// The end of the interval (Unix ms).
    pub at_unix_ms: u64,
    /// Its length in seconds.
    pub seconds: f64,
    pub transactions: u64,
    pub errors: u64,
    pub pool_waits: u64,
    pub pool_wait_us: u64,
    /// At the end of the interval.
    pub clients_waiting: i64,
}

/// The rings of every cluster, by name.
#[derive(Debug, Default)]
pub struct History {
    rings: Mutex<Vec<(String, VecDeque<Sample>)>>,
}

impl History {
    /// Records `totals` (by cluster) read at `at_unix_ms`. A cluster no
    /// longer listed loses its history; past [`MAX_CLUSTERS`] the rest are
    /// not kept.
    pub fn record(&self, at_unix_ms: u64, totals: &[(String, Totals)]) {
        let mut rings = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        rings.retain(|(name, _)| totals.iter().any(|(n, _)| n == name));
        for (name, t) in totals {
            let sample = Sample {
                at_unix_ms,
                totals: *t,
            };
            if let Some((_, ring)) = rings.iter_mut().find(|(n, _)| n == name) {
                if ring.len() == SAMPLES {
                    ring.pop_front();
                }
                ring.push_back(sample);
            } else if rings.len() < MAX_CLUSTERS {
                let mut ring = VecDeque::with_capacity(SAMPLES);
                ring.push_back(sample);
                rings.push((name.clone(), ring));
            }
        }
    }

    /// Each cluster's points, oldest first (one fewer than its samples).
    pub fn points(&self) -> Vec<(String, Vec<Point>)> {
        let rings = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        rings
            .iter()
            .map(|(name, ring)| {
                let points = ring
                    .iter()
                    .zip(ring.iter().skip(1))
                    .map(|(a, b)| {
                        let (x, y) = (&a.totals, &b.totals);
                        Point {
                            at_unix_ms: b.at_unix_ms,
                            seconds: b.at_unix_ms.saturating_sub(a.at_unix_ms) as f64 / 1000.0,
                            transactions: y.transactions.saturating_sub(x.transactions),
                            errors: y.errors.saturating_sub(x.errors),
                            pool_waits: y.pool_waits.saturating_sub(x.pool_waits),
                            pool_wait_us: y.pool_wait_us.saturating_sub(x.pool_wait_us),
                            clients_waiting: y.clients_waiting,
                        }
                    })
                    .collect();
                (name.clone(), points)
            })
            .collect()
    }
}

/// The value of `metric`'s `cluster` label.
fn cluster_of(metric: &prometheus::proto::Metric) -> Option<&str> {
    metric
        .get_label()
        .iter()
        .find(|l| l.name() == "cluster")
        .map(|l| l.value())
}

impl Metrics {
    /// Every cluster's running totals, from the families (a cluster appears
    /// once any of its series exists), by name.
    pub fn cluster_totals(&self) -> Vec<(String, Totals)> {
        let mut out: Vec<(String, Totals)> = Vec::new();
        let mut add = |c: &str, f: &dyn Fn(&mut Totals)| match out.iter_mut().find(|(n, _)| n == c)
        {
            Some((_, t)) => f(t),
            None => {
                let mut t = Totals::default();
                f(&mut t);
                out.push((c.to_owned(), t));
            }
        };
        let families = [
            self.transactions.collect(),
            self.errors.collect(),
            self.pool_wait_seconds.collect(),
            self.clients_waiting.collect(),
        ];
        for (which, family) in families.iter().enumerate() {
            for m in family.iter().flat_map(|f| f.get_metric()) {
                let Some(c) = cluster_of(m) else { continue };
                match which {
                    0 => {
                        let v = m.get_counter().get_value() as u64;
                        add(c, &|t| t.transactions += v);
                    }
                    1 => {
                        let v = m.get_counter().get_value() as u64;
                        add(c, &|t| t.errors += v);
                    }
                    2 => {
                        let h = m.get_histogram();
                        let (n, us) = (
                            h.get_sample_count(),
                            (h.get_sample_sum() * 1e6).round() as u64,
                        );
                        add(c, &|t| {
                            t.pool_waits += n;
                            t.pool_wait_us += us;
                        });
                    }
                    _ => {
                        let v = m.get_gauge().get_value() as i64;
                        add(c, &|t| t.clients_waiting += v);
                    }
                }
            }
        }
        out
    }

    /// Takes one sample now.
    pub fn sample_history(&self) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.history.record(now, &self.cluster_totals());
    }
}

/// Samples `metrics`' history every [`SAMPLE_EVERY`] (the first at once)
/// until `shutdown` turns true.
pub async fn sample_every(metrics: std::sync::Arc<Metrics>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => metrics.sample_history(),
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_is_bounded_and_points_are_differences() {
        let h = History::default();
        let t = |x: u64| Totals {
            transactions: x * 10,
            errors: x,
            pool_waits: x * 10,
            pool_wait_us: x * 100,
            clients_waiting: 1,
        };
        for i in 0..(SAMPLES as u64 + 50) {
            h.record(i * 5000, &[("main".into(), t(i))]);
        }
        let points = h.points();
        assert_eq!(points.len(), 1);
        let (name, p) = &points[0];
        assert_eq!(name, "main");
        assert_eq!(p.len(), SAMPLES - 1, "the window, no more");
        assert_eq!(
            (
                p[0].seconds,
                p[0].transactions,
                p[0].errors,
                p[0].pool_wait_us
            ),
            (5.0, 10, 1, 100)
        );
        assert_eq!(p.last().unwrap().at_unix_ms, (SAMPLES as u64 + 49) * 5000);
        // A counter that went back (a new series) is no negative rate.
        h.record(u64::MAX / 2, &[("main".into(), Totals::default())]);
        assert_eq!(h.points()[0].1.last().unwrap().transactions, 0);
        // A cluster gone from the totals loses its history.
        h.record(u64::MAX / 2, &[("other".into(), t(1))]);
        let points = h.points();
        assert_eq!((points.len(), points[0].0.as_str()), (1, "other"));
        assert!(points[0].1.is_empty());
    }

    #[test]
    fn totals_are_read_per_cluster_from_the_families() {
        let m = Metrics::new();
        m.transactions
            .with_label_values(&["main", "a:1", "read"])
            .inc_by(3);
        m.transactions
            .with_label_values(&["main", "b:1", "write"])
            .inc_by(2);
        m.errors.with_label_values(&["main", "42"]).inc();
        m.pool_wait_seconds
            .with_label_values(&["main"])
            .observe(0.002);
        m.clients_waiting.with_label_values(&["main"]).set(4);
        m.transactions
            .with_label_values(&["other", "c:1", "read"])
            .inc();
        let totals = m.cluster_totals();
        let main = totals.iter().find(|(n, _)| n == "main").unwrap().1;
        assert_eq!(
            main,
            Totals {
                transactions: 5,
                errors: 1,
                pool_waits: 1,
                pool_wait_us: 2000,
                clients_waiting: 4
            }
        );
        assert_eq!(
            totals
                .iter()
                .find(|(n, _)| n == "other")
                .unwrap()
                .1
                .transactions,
            1
        );
        m.sample_history();
        m.sample_history();
        assert_eq!(m.history.points().len(), 2);
    }
}
