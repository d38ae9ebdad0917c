//! The health loop's latest picture of a cluster, for logs, tests, the admin
//! console and metrics: per backend its state, whether it is the primary, its
//! lag and its last error, plus the failovers done. Written by the loop,
//! read by anyone; a short lock, never taken on the data path.

use std::sync::Mutex;
use std::time::Duration;

use crate::state::BackendState;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendStatus {
    pub address: String,
    pub state: BackendState,
    pub primary: bool,
    /// Whether its last probe said it takes writes (None: never answered).
    pub writable: Option<bool>,
    pub lag_bytes: u64,
    pub lag_time: Duration,
    pub last_error: Option<String>,
    /// The probe's own login is refused: the backend is served on its
    /// configured role, unobserved, until the probe's login is fixed.
    pub probe_login_refused: bool,
}

/// Who decides the primary, as of the health loop's last round
/// (`topology`; SHOW CLUSTERS and the `fulcrum_topology_*` metrics).
#[derive(Debug, Clone, Default)]
pub struct CoordinationStatus {
    /// `probe`, `etcd` or `patroni`.
    pub source: &'static str,
    /// The newest published epoch seen (Patroni: its leader's timeline).
    pub epoch: u64,
    /// Who leads (etcd: the instance holding the leader key; Patroni: the
    /// leader member's name).
    pub leader: Option<String>,
    /// This instance leads (etcd).
    pub leading: bool,
    /// When the coordinator last answered.
    pub last_heard: Option<std::time::Instant>,
    /// Not heard from for longer than the lease.
    pub cut_off: bool,
}

/// One change of primary this instance saw (promoted by it or by anyone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailoverRecord {
    /// When, in ms since the Unix epoch.
    pub at_ms: u64,
    pub old: String,
    pub new: String,
}

/// How many changes of primary the view keeps.
const FAILOVER_LOG: usize = 20;

#[derive(Debug, Default)]
pub struct ClusterView {
    coordination: Mutex<Option<CoordinationStatus>>,
    failover_log: Mutex<std::collections::VecDeque<FailoverRecord>>,
    /// The last primary published (for the failover log).
    last_primary: Mutex<Option<String>>,
    backends: Mutex<Vec<BackendStatus>>,
    failovers: Mutex<u64>,
    /// Why the health loop does not promote now (`failover_max_lag`).
    failover_blocked: Mutex<Option<String>>,
}

impl ClusterView {
    pub fn new(addresses: &[String]) -> ClusterView {
        ClusterView {
            backends: Mutex::new(
                addresses
                    .iter()
                    .map(|a| BackendStatus {
                        address: a.clone(),
                        state: BackendState::Up,
                        primary: false,
                        writable: None,
                        lag_bytes: 0,
                        lag_time: Duration::ZERO,
                        last_error: None,
                        probe_login_refused: false,
                    })
                    .collect(),
            ),
            failovers: Mutex::new(0),
            failover_blocked: Mutex::new(None),
            coordination: Mutex::new(None),
            failover_log: Mutex::default(),
            last_primary: Mutex::default(),
        }
    }

    pub fn backends(&self) -> Vec<BackendStatus> {
        self.backends
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn publish(&self, backends: Vec<BackendStatus>) {
        let mut held = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        // A change from the last primary seen to another one (an outage in
        // between, and the same node back, is no failover).
        if let Some(new) = backends
            .iter()
            .find(|b| b.primary)
            .map(|b| b.address.clone())
        {
            let mut log = self.failover_log.lock().unwrap_or_else(|e| e.into_inner());
            let mut last = self.last_primary.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(old) = last.take().filter(|o| *o != new) {
                if log.len() == FAILOVER_LOG {
                    log.pop_front();
                }
                log.push_back(FailoverRecord {
                    at_ms: std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64),
                    old,
                    new: new.clone(),
                });
            }
            *last = Some(new);
        }
        *held = backends;
    }

    /// The last changes of primary this instance saw, oldest first.
    pub fn failover_log(&self) -> Vec<FailoverRecord> {
        self.failover_log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// Promotions done by this process.
    /// Why automatic promotion is held back now, if it is.
    pub fn failover_blocked(&self) -> Option<String> {
        self.failover_blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set_failover_blocked(&self, why: Option<String>) {
        *self
            .failover_blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = why;
    }

    pub fn failovers(&self) -> u64 {
        *self.failovers.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn count_failover(&self) {
        *self.failovers.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    }

    /// The coordinator's status; `None` with `topology = "probe"`.
    pub fn coordination(&self) -> Option<CoordinationStatus> {
        self.coordination
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set_coordination(&self, status: CoordinationStatus) {
        *self.coordination.lock().unwrap_or_else(|e| e.into_inner()) = Some(status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_primary(v: &ClusterView, primary: Option<usize>) {
        let statuses = (0..2)
            .map(|b| BackendStatus {
                address: format!("n{b}:5432"),
                state: BackendState::Up,
                primary: Some(b) == primary,
                writable: None,
                lag_bytes: 0,
                lag_time: Duration::ZERO,
                last_error: None,
                probe_login_refused: false,
            })
            .collect();
        v.publish(statuses);
    }

    #[test]
    fn the_failover_log_keeps_changes_of_primary_not_outages() {
        let v = ClusterView::new(&["n0:5432".into(), "n1:5432".into()]);
        with_primary(&v, Some(0));
        with_primary(&v, None);
        with_primary(&v, Some(0));
        assert!(
            v.failover_log().is_empty(),
            "the same node back is no failover"
        );
        with_primary(&v, None);
        with_primary(&v, Some(1));
        let log = v.failover_log();
        assert_eq!(log.len(), 1);
        assert_eq!(
            (log[0].old.as_str(), log[0].new.as_str()),
            ("n0:5432", "n1:5432")
        );
        assert!(log[0].at_ms > 0);
    }
}
