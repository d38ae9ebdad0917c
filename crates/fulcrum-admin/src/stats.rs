//! SHOW STATS and SHOW TOTALS in PgBouncer's terms, from the Prometheus
//! families: counts and bytes, and the time columns (microseconds) from the
//! histograms' sums and counts. A unit of work (a transaction, or one
//! autocommit statement) is both Fulcrum's transaction and its query here.

use fulcrum_cluster::ClusterAdmin;
use fulcrum_metrics::Metrics;

/// One row's figures.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct StatFigures {
    pub xacts: u64,
    pub queries: u64,
    pub received: u64,
    pub sent: u64,
    /// Units of work timed, and their time in seconds.
    pub units: u64,
    pub unit_seconds: f64,
    /// Checkouts timed, and their wait in seconds.
    pub waits: u64,
    pub wait_seconds: f64,
}

fn micros(seconds: f64) -> u64 {
    (seconds * 1e6).round() as u64
}

fn avg_micros(seconds: f64, n: u64) -> u64 {
    if n == 0 {
        0
    } else {
        micros(seconds / n as f64)
    }
}

impl StatFigures {
    pub const COLUMNS: [&'static str; 12] = [
        "database",
        "total_xact_count",
        "total_query_count",
        "total_received",
        "total_sent",
        "total_xact_time",
        "total_query_time",
        "total_wait_time",
        "avg_xact_time",
        "avg_query_time",
        "avg_wait_time",
        // PgBouncer before 1.8 (and exporters written for it): queries.
        "total_requests",
    ];

    /// A cluster's figures from the metrics families.
    pub fn of(m: &Metrics, c: &dyn ClusterAdmin) -> StatFigures {
        let name = c.config().name.as_str();
        let mut f = StatFigures::default();
        for b in &c.config().backends {
            for r in ["read", "write"] {
                f.queries += m.queries.with_label_values(&[name, &b.address, r]).get();
                f.xacts += m
                    .transactions
                    .with_label_values(&[name, &b.address, r])
                    .get();
            }
        }
        f.received = m.bytes.with_label_values(&[name, "in"]).get();
        f.sent = m.bytes.with_label_values(&[name, "out"]).get();
        for r in ["read", "write"] {
            let h = m.query_seconds.with_label_values(&[name, r]);
            f.units += h.get_sample_count();
            f.unit_seconds += h.get_sample_sum();
        }
        let w = m.pool_wait_seconds.with_label_values(&[name]);
        f.waits = w.get_sample_count();
        f.wait_seconds = w.get_sample_sum();
        f
    }

    pub fn add(&mut self, o: &StatFigures) {
        self.xacts += o.xacts;
        self.queries += o.queries;
        self.received += o.received;
        self.sent += o.sent;
        self.units += o.units;
        self.unit_seconds += o.unit_seconds;
        self.waits += o.waits;
        self.wait_seconds += o.wait_seconds;
    }

    /// The row under [`COLUMNS`](Self::COLUMNS), named `name`.
    pub fn row(&self, name: &str) -> Vec<String> {
        let unit_total = micros(self.unit_seconds);
        let unit_avg = avg_micros(self.unit_seconds, self.units);
        vec![
            name.to_owned(),
            self.xacts.to_string(),
            self.queries.to_string(),
            self.received.to_string(),
            self.sent.to_string(),
            unit_total.to_string(),
            unit_total.to_string(),
            micros(self.wait_seconds).to_string(),
            unit_avg.to_string(),
            unit_avg.to_string(),
            avg_micros(self.wait_seconds, self.waits).to_string(),
            self.queries.to_string(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_microseconds_and_averages_divide_by_the_count() {
        let mut a = StatFigures {
            xacts: 4,
            queries: 4,
            units: 4,
            unit_seconds: 0.002,
            waits: 2,
            wait_seconds: 0.000_5,
            ..Default::default()
        };
        let row = a.row("main");
        assert_eq!(row.len(), StatFigures::COLUMNS.len());
        assert_eq!(
            &row[5..],
            &["2000", "2000", "500", "500", "500", "250", "4"]
        );
        a.add(&a.clone());
        assert_eq!(a.row("total")[1], "8");
        // Nothing timed yet: zeros, not a division by zero.
        assert_eq!(StatFigures::default().row("x")[8], "0");
    }
}
