//! SHOW STATS and SHOW TOTALS in PgBouncer's terms: SHOW STATS' rows per
//! database from the clients' counts (`fulcrum_cluster::client_stats`),
//! SHOW TOTALS from the Prometheus families (counts and bytes, and the
//! time columns, in microseconds, from the histograms' sums and counts). A unit of work (a transaction, or one
//! autocommit statement) is both Fulcrum's transaction and its query here.
//! The `avg_*` columns are PgBouncer's (1.18+): per second, or per unit for
//! the times, over the span since the snapshot before last (`Period`: a
//! snapshot at most every [`STATS_PERIOD`], PgBouncer's `stats_period`).

use std::time::{Duration, Instant};

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
    pub const COLUMNS: [&'static str; 16] = [
        "database",
        "total_xact_count",
        "total_query_count",
        "total_received",
        "total_sent",
        "total_xact_time",
        "total_query_time",
        "total_wait_time",
        "avg_xact_count",
        "avg_query_count",
        "avg_recv",
        "avg_sent",
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

    /// A database's figures from its clients' counts.
    pub fn from_totals(t: &fulcrum_cluster::client_stats::Totals) -> StatFigures {
        StatFigures {
            xacts: t.xacts,
            queries: t.queries,
            received: t.received,
            sent: t.sent,
            units: t.xacts,
            unit_seconds: t.unit_us as f64 / 1e6,
            waits: t.waits,
            wait_seconds: t.wait_us as f64 / 1e6,
        }
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

    /// What happened between `older` and `self`, over `seconds`: PgBouncer's
    /// averages (`calc_average`): counts and bytes per second (whole
    /// numbers, as PgBouncer's), times per unit (or per checkout) in µs.
    pub fn averages(&self, older: &StatFigures, seconds: f64) -> [u64; 7] {
        if seconds <= 0.0 {
            return [0; 7];
        }
        let per_s = |now: u64, then: u64| (now.saturating_sub(then) as f64 / seconds) as u64;
        let units = self.units.saturating_sub(older.units);
        let unit_avg = avg_micros((self.unit_seconds - older.unit_seconds).max(0.0), units);
        [
            per_s(self.xacts, older.xacts),
            per_s(self.queries, older.queries),
            per_s(self.received, older.received),
            per_s(self.sent, older.sent),
            unit_avg,
            unit_avg,
            avg_micros(
                (self.wait_seconds - older.wait_seconds).max(0.0),
                self.waits.saturating_sub(older.waits),
            ),
        ]
    }

    /// The row under [`COLUMNS`](Self::COLUMNS), named `name`, with the
    /// averages since `older`, `seconds` ago.
    pub fn row(&self, name: &str, older: &StatFigures, seconds: f64) -> Vec<String> {
        let unit_total = micros(self.unit_seconds);
        let mut row = vec![
            name.to_owned(),
            self.xacts.to_string(),
            self.queries.to_string(),
            self.received.to_string(),
            self.sent.to_string(),
            unit_total.to_string(),
            unit_total.to_string(),
            micros(self.wait_seconds).to_string(),
        ];
        row.extend(self.averages(older, seconds).iter().map(u64::to_string));
        row.push(self.queries.to_string());
        row
    }
}

/// PgBouncer's default `stats_period`.
pub const STATS_PERIOD: Duration = Duration::from_secs(60);

/// One row's two last snapshots (PgBouncer's `older_stats` and
/// `newer_stats`). Pure: the caller gives the time.
#[derive(Debug, Clone, Copy)]
pub struct Period {
    older: StatFigures,
    older_at: Instant,
    newer: StatFigures,
    newer_at: Instant,
}

impl Period {
    /// Counting from zero at `start` (the daemon's start).
    pub fn new(start: Instant) -> Period {
        Period {
            older: StatFigures::default(),
            older_at: start,
            newer: StatFigures::default(),
            newer_at: start,
        }
    }

    /// The snapshot the averages run from and the seconds since, for the
    /// figures `now` is `current`; a period after the newer snapshot, the
    /// newer becomes the older and `current` the newer.
    pub fn advance(&mut self, current: &StatFigures, now: Instant) -> (StatFigures, f64) {
        if now.saturating_duration_since(self.newer_at) >= STATS_PERIOD {
            self.older = self.newer;
            self.older_at = self.newer_at;
            self.newer = *current;
            self.newer_at = now;
        }
        (
            self.older,
            now.saturating_duration_since(self.older_at).as_secs_f64(),
        )
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
            received: 1000,
            sent: 3000,
            units: 4,
            unit_seconds: 0.002,
            waits: 2,
            wait_seconds: 0.000_5,
        };
        let row = a.row("main", &StatFigures::default(), 2.0);
        assert_eq!(row.len(), StatFigures::COLUMNS.len());
        assert_eq!(
            &row[5..],
            &["2000", "2000", "500", "2", "2", "500", "1500", "500", "500", "250", "4"]
        );
        a.add(&a.clone());
        assert_eq!(a.row("total", &a, 1.0)[1], "8");
        // Nothing since the older snapshot: zeros, not a division by zero.
        assert!(a.row("x", &a, 1.0)[8..15].iter().all(|v| v == "0"));
        assert!(a.row("x", &StatFigures::default(), 0.0)[8..15]
            .iter()
            .all(|v| v == "0"));
    }

    #[test]
    fn averages_run_from_the_snapshot_before_last() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let n = |xacts: u64| StatFigures {
            xacts,
            ..Default::default()
        };
        let mut p = Period::new(t0);
        // Within the first period: since the start.
        assert_eq!(p.advance(&n(30), at(10)), (n(0), 10.0));
        // A period on: snapshot taken; still from the start.
        assert_eq!(p.advance(&n(600), at(60)), (n(0), 60.0));
        assert_eq!(n(600).averages(&n(0), 60.0)[0], 10);
        // Two periods on: from the first snapshot.
        assert_eq!(p.advance(&n(1200), at(120)), (n(600), 60.0));
        assert_eq!(p.advance(&n(1500), at(150)), (n(600), 90.0));
        assert_eq!(n(1500).averages(&n(600), 90.0)[0], 10);
    }
}
