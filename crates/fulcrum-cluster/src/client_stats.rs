//! Traffic counts per client, for SHOW STATS' row per database: what a
//! client's units did (statements, units and their time, bytes each way,
//! checkouts and their wait), counted on its registry entry with relaxed
//! atomic adds as the cluster's Prometheus figures are, and folded into
//! its (cluster, database) totals when it leaves (`clients.rs`). A row is
//! then the departed clients' totals plus the connected clients' counts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// One client's counts (see the module doc).
#[derive(Debug, Default)]
pub struct ClientCounts {
    xacts: AtomicU64,
    queries: AtomicU64,
    received: AtomicU64,
    sent: AtomicU64,
    unit_us: AtomicU64,
    waits: AtomicU64,
    wait_us: AtomicU64,
}

/// Summed counts (a database's row, or one client's at a time).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    pub xacts: u64,
    pub queries: u64,
    pub received: u64,
    pub sent: u64,
    /// Units' time, in µs (as many units as `xacts`).
    pub unit_us: u64,
    pub waits: u64,
    pub wait_us: u64,
}

impl Totals {
    pub fn add(&mut self, o: &Totals) {
        self.xacts += o.xacts;
        self.queries += o.queries;
        self.received += o.received;
        self.sent += o.sent;
        self.unit_us += o.unit_us;
        self.waits += o.waits;
        self.wait_us += o.wait_us;
    }
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl ClientCounts {
    /// `n` statements forwarded.
    pub fn queries(&self, n: u64) {
        add(&self.queries, n);
    }

    /// `n` bytes read from the client.
    pub fn received(&self, n: u64) {
        add(&self.received, n);
    }

    /// `n` bytes written to the client.
    pub fn sent(&self, n: u64) {
        add(&self.sent, n);
    }

    /// A unit of work ended after holding its connection for `took`.
    pub fn unit(&self, took: Duration) {
        add(&self.xacts, 1);
        add(&self.unit_us, took.as_micros() as u64);
    }

    /// A checkout waited `waited` (zero when a connection was at hand).
    pub fn waited(&self, waited: Duration) {
        add(&self.waits, 1);
        add(&self.wait_us, waited.as_micros() as u64);
    }

    /// The counts now.
    pub fn totals(&self) -> Totals {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Totals {
            xacts: get(&self.xacts),
            queries: get(&self.queries),
            received: get(&self.received),
            sent: get(&self.sent),
            unit_us: get(&self.unit_us),
            waits: get(&self.waits),
            wait_us: get(&self.wait_us),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_into_totals() {
        let c = ClientCounts::default();
        c.queries(2);
        c.received(100);
        c.sent(40);
        c.unit(Duration::from_micros(1500));
        c.waited(Duration::ZERO);
        c.waited(Duration::from_millis(2));
        let t = c.totals();
        assert_eq!(
            t,
            Totals {
                xacts: 1,
                queries: 2,
                received: 100,
                sent: 40,
                unit_us: 1500,
                waits: 2,
                wait_us: 2000,
            }
        );
        let mut sum = t;
        sum.add(&t);
        assert_eq!(sum.queries, 4);
        assert_eq!(sum.wait_us, 4000);
    }
}
