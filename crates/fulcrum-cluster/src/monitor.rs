//! The health loop of one cluster: every `health_interval` (sooner while a
//! backend is failing, at once when a session reports one suspect) it probes
//! every backend in parallel, updates their trackers, measures lag, decides
//! the primary (`topology`), promotes a replica when `failover = "promote"`
//! and the primary has been down for `failover_timeout`, and publishes the
//! result to the router and the view. The only module here that does I/O.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fulcrum_config::{Failover, Health, Role};
use fulcrum_pool::{BackendId, Router};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::lag::{lag_of, over_limit, Lag};
use crate::ops::{Observation, OpsError, ServerOps};
use crate::state::{BackendState, Change, Tracker};
use crate::topology::{decide, NodeView};
use crate::view::{BackendStatus, ClusterView};

/// Probing interval while something is failing: a fifth of the interval,
/// within these bounds (never slower than the interval itself).
const FAST_FLOOR: Duration = Duration::from_millis(50);
const FAST_CEILING: Duration = Duration::from_millis(200);

/// What the loop needs from the cluster's configuration.
#[derive(Debug, Clone)]
pub struct MonitorSettings {
    pub cluster: String,
    pub health: Health,
    /// Each backend's configured role.
    pub roles: Vec<Role>,
    /// `transaction_replay` is on: a switchover may end sessions idle in a
    /// transaction on the old primary (they are replayed).
    pub replay: bool,
    /// Who decides the primary (`topology`); the coordinator itself is
    /// given with [`Monitor::with_authority`].
    pub topology: fulcrum_config::Topology,
}

pub struct Monitor<S: ServerOps> {
    pub(crate) settings: MonitorSettings,
    pub(crate) ops: Arc<S>,
    pub(crate) router: Arc<Router>,
    pub(crate) view: Arc<ClusterView>,
    pub(crate) trackers: Vec<Tracker>,
    pub(crate) observed: Vec<Option<Observation>>,
    errors: Vec<Option<String>>,
    /// The probe's login is refused (`OpsError::LoginRefused`).
    login_refused: Vec<bool>,
    pub(crate) fenced: Vec<bool>,
    lagging: Vec<bool>,
    lags: Vec<Lag>,
    states: Vec<BackendState>,
    pub(crate) primary: Option<BackendId>,
    /// The last primary there was: the one `none` waits for, the one a
    /// promotion replaces.
    pub(crate) last_primary: Option<BackendId>,
    pub(crate) primary_position: Option<u64>,
    requests: tokio::sync::mpsc::Receiver<crate::switchover::Request>,
    handle: crate::switchover::MonitorHandle,
    /// Whether "no replica to promote" was logged for this outage.
    told_no_candidate: bool,
    /// The coordinator (`topology`), and what it said this round.
    pub(crate) authority: fulcrum_coordination::Authority,
    pub(crate) verdict: Option<fulcrum_coordination::Verdict>,
    /// When the loop last took a verdict, and when it resumed after a pause.
    pub(crate) pause: crate::coordinated::Pause,
}

impl<S: ServerOps> Monitor<S> {
    /// The router's current primary is the starting guess; a configured
    /// `role = "primary"` is also the one `failover = "none"` waits for.
    pub fn new(
        settings: MonitorSettings,
        ops: Arc<S>,
        router: Arc<Router>,
        view: Arc<ClusterView>,
    ) -> Monitor<S> {
        let n = settings.roles.len();
        let (tx, requests) = tokio::sync::mpsc::channel(4);
        let primary = router.primary();
        let last_primary = settings.roles.iter().position(|r| *r == Role::Primary);
        Monitor {
            settings,
            ops,
            router,
            view,
            trackers: vec![Tracker::new(); n],
            observed: vec![None; n],
            errors: vec![None; n],
            login_refused: vec![false; n],
            fenced: vec![false; n],
            lagging: vec![false; n],
            lags: vec![Lag::default(); n],
            states: vec![BackendState::Up; n],
            primary,
            last_primary,
            primary_position: None,
            told_no_candidate: false,
            authority: fulcrum_coordination::Authority::Probe,
            verdict: None,
            pause: Default::default(),
            requests,
            handle: crate::switchover::MonitorHandle { tx },
        }
    }

    /// Routes by `authority` (etcd, Patroni) instead of this loop's probes alone.
    pub fn with_authority(mut self, authority: fulcrum_coordination::Authority) -> Monitor<S> {
        self.authority = authority;
        self
    }

    /// A handle for requests to this loop (planned switchover).
    pub fn handle(&self) -> crate::switchover::MonitorHandle {
        self.handle.clone()
    }

    /// Runs the loop until `shutdown` turns true.
    pub fn spawn(self, shutdown: watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.run(shutdown))
    }

    async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let interval = self.settings.health.interval;
        let mut changes = self.authority.changes();
        loop {
            self.round().await;
            let failing = self.primary.is_none()
                || self
                    .trackers
                    .iter()
                    .any(|t| t.failures() > 0 && t.reachable());
            let wait = if failing {
                (interval / 5).clamp(FAST_FLOOR, FAST_CEILING).min(interval)
            } else {
                interval
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.router.suspects_reported() => {
                    // Let a burst of reports from many sessions settle into one round.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    let suspects = self.router.take_suspects();
                    tracing::debug!(cluster = %self.settings.cluster, ?suspects, "suspect backends reported; probing now");
                }
                Some(req) = self.requests.recv() => {
                    let r = self.switchover(req.target).await;
                    let _ = req.reply.send(r);
                }
                Some(()) = async {
                    match changes.as_mut() {
                        Some(c) => c.changed().await.ok(),
                        None => std::future::pending().await,
                    }
                } => {
                    // A new epoch or a lead won or lost: act on it now.
                }
                _ = shutdown.changed() => {}
            }
            if *shutdown.borrow() {
                return;
            }
        }
    }

    /// One probe of every backend, and what follows from it.
    pub async fn round(&mut self) {
        // Patroni is read beside the probes, so a round takes no longer.
        let (results, ()) = tokio::join!(self.probe_all(), self.authority.refresh());
        self.take_verdict();
        let now = Instant::now();
        let (interval, failures) = (self.settings.health.interval, self.settings.health.failures);
        for (b, result) in results.into_iter().enumerate() {
            let address = self.ops.address(b).to_owned();
            let change = match result {
                Ok(obs) => {
                    if self.login_refused[b] {
                        tracing::info!(cluster = %self.settings.cluster, backend = %address, "probe login works again");
                    }
                    self.login_refused[b] = false;
                    self.observed[b] = Some(obs);
                    self.errors[b] = None;
                    self.trackers[b].on_success(now, interval)
                }
                Err(OpsError::LoginRefused(reason)) => {
                    // The server answered: it is up. What it is, the probe
                    // cannot see; the configured role stands in.
                    if !self.login_refused[b] {
                        tracing::warn!(cluster = %self.settings.cluster, backend = %address, error = %reason, "probe login refused: the backend stays in service on its configured role, unobserved (no lag, no failover) until health_user can log in; fix health_user / health_password");
                    }
                    self.login_refused[b] = true;
                    self.observed[b] = match self.settings.roles[b] {
                        Role::Primary => Some(Observation {
                            writable: true,
                            ..Default::default()
                        }),
                        Role::Replica => Some(Observation {
                            writable: false,
                            ..Default::default()
                        }),
                        _ => self.observed[b],
                    };
                    self.errors[b] = Some(format!("probe login refused: {reason}"));
                    self.trackers[b].on_success(now, interval)
                }
                Err(e) => {
                    let change = self.trackers[b].on_failure(now, failures);
                    if change.is_none() && self.trackers[b].reachable() {
                        tracing::info!(cluster = %self.settings.cluster, backend = %address, error = %e, failures = self.trackers[b].failures(), "health probe failed");
                    }
                    self.errors[b] = Some(e.to_string());
                    change
                }
            };
            match change {
                Some(Change::WentDown) => tracing::warn!(
                    cluster = %self.settings.cluster, backend = %address,
                    error = self.errors[b].as_deref().unwrap_or(""),
                    "backend down: no traffic until it answers again"
                ),
                Some(Change::CameBack) => tracing::info!(
                    cluster = %self.settings.cluster, backend = %address,
                    "backend up again"
                ),
                None => {}
            }
        }
        let raw = self.apply_topology();
        self.measure_lag();
        self.publish();
        self.lead(&raw, now).await;
        if self.settings.health.failover == Failover::Promote
            && self.primary.is_none()
            && self.may_promote()
            && self.verdict.as_ref().is_none_or(|v| {
                v.published
                    .as_ref()
                    .is_some_and(|p| p.stage == fulcrum_coordination::Stage::Ready)
            })
        {
            self.maybe_promote(now, None).await;
        }
    }

    async fn probe_all(&self) -> Vec<Result<Observation, OpsError>> {
        let n = self.settings.roles.len();
        let timeout = self.settings.health.timeout;
        let mut set = JoinSet::new();
        for b in 0..n {
            let ops = self.ops.clone();
            set.spawn(async move {
                let r = match tokio::time::timeout(timeout, ops.probe(b)).await {
                    Ok(r) => r,
                    Err(_) => Err(OpsError::Timeout(timeout)),
                };
                (b, r)
            });
        }
        let mut out: Vec<Result<Observation, OpsError>> =
            vec![Err(OpsError::Query("probe task failed".into())); n];
        while let Some(joined) = set.join_next().await {
            if let Ok((b, r)) = joined {
                out[b] = r;
            }
        }
        out
    }

    fn nodes(&self) -> Vec<NodeView> {
        (0..self.settings.roles.len())
            .map(|b| NodeView {
                reachable: self.trackers[b].reachable(),
                writable: self.observed[b].map(|o| o.writable || o.detached),
                timeline: self.observed[b].map_or(0, |o| o.timeline),
                configured_primary: self.settings.roles[b] == Role::Primary,
                fenced: self.fenced[b],
                fresh: self.trackers[b].reachable() && self.trackers[b].failures() == 0,
            })
            .collect()
    }

    /// Decides the primary and the fenced nodes from this round's probes,
    /// bounded by the coordinator's verdict; returns what the probes alone
    /// decided (what an etcd leader may publish).
    fn apply_topology(&mut self) -> crate::topology::Topology {
        let last_timeline = self
            .last_primary
            .and_then(|p| self.observed[p])
            .map_or(0, |o| o.timeline);
        let nodes = self.nodes();
        let raw = decide(
            self.primary,
            self.last_primary,
            last_timeline,
            &nodes,
            self.settings.health.failover,
        );
        let t = self.constrain(raw.clone(), &nodes);
        for (b, &f) in t.fenced.iter().enumerate() {
            if f && !self.fenced[b] {
                tracing::error!(
                    cluster = %self.settings.cluster, backend = %self.ops.address(b),
                    "backend fenced (stale): it takes writes but is not the primary; it gets no traffic until it is re-joined as a replica (see docs/failover.md)"
                );
            } else if !f && self.fenced[b] {
                tracing::info!(cluster = %self.settings.cluster, backend = %self.ops.address(b), "fenced backend is read-only again: serving as a replica");
            }
        }
        self.fenced = t.fenced;
        if t.primary != self.primary {
            match t.primary {
                Some(p) => {
                    tracing::warn!(cluster = %self.settings.cluster, backend = %self.ops.address(p), "primary is now {}", self.ops.address(p))
                }
                None => {
                    tracing::warn!(cluster = %self.settings.cluster, "no primary: writes wait for one (failover = {:?})", self.settings.health.failover)
                }
            }
            self.primary = t.primary;
        }
        if let Some(p) = self.primary {
            if self.last_primary != Some(p) {
                self.told_no_candidate = false;
                // A primary another instance promoted: its floor comes
                // with the published topology.
                if let Some((b, floor)) = self.published_floor().filter(|(b, _)| *b == p) {
                    self.router.set_commit_floor(b, Some(floor));
                }
            }
            self.last_primary = Some(p);
        }
        raw
    }

    fn measure_lag(&mut self) {
        if let Some(p) = self.primary {
            if let (true, Some(o)) = (
                self.trackers[p].failures() == 0 && !self.login_refused[p],
                self.observed[p],
            ) {
                self.primary_position = Some(o.position);
            }
        }
        for b in 0..self.lags.len() {
            // A replica whose probe cannot log in has no known position.
            let replica = self.observed[b]
                .filter(|o| !o.writable && Some(b) != self.primary && !self.login_refused[b]);
            self.lags[b] = match (replica, self.primary_position) {
                (Some(o), Some(pp)) if self.trackers[b].reachable() => {
                    lag_of(pp, o.position, o.replay_age)
                }
                _ => Lag::default(),
            };
            if replica.is_some() {
                // Patroni's own figure, when it reports more (its leader's
                // position may be newer than this round's probe).
                if let Some(bytes) = self.coordinator_lag(b) {
                    self.lags[b].bytes = self.lags[b].bytes.max(bytes);
                }
            }
            let was = self.lagging[b];
            let now = match self.settings.health.max_lag {
                Some(max) if replica.is_some() => over_limit(self.lags[b], max, was),
                _ => false,
            };
            if now != was {
                let lag = self.lags[b];
                if now {
                    tracing::warn!(cluster = %self.settings.cluster, backend = %self.ops.address(b), lag_bytes = lag.bytes, lag_ms = lag.time.as_millis() as u64, "replica over max_lag: no reads until it catches up");
                } else {
                    tracing::info!(cluster = %self.settings.cluster, backend = %self.ops.address(b), lag_bytes = lag.bytes, lag_ms = lag.time.as_millis() as u64, "replica caught up: serving reads again");
                }
            }
            self.lagging[b] = now;
        }
    }

    pub(crate) fn publish(&mut self) {
        let n = self.settings.roles.len();
        let mut statuses = Vec::with_capacity(n);
        for b in 0..n {
            let state = if !self.trackers[b].reachable() {
                BackendState::Down
            } else if self.fenced[b] {
                BackendState::Stale
            } else if self.lagging[b] && Some(b) != self.primary {
                BackendState::Lagging
            } else {
                BackendState::Up
            };
            // A replica Patroni reports stopped, starting, ... is out.
            let excluded = (state == BackendState::Up && Some(b) != self.primary)
                .then(|| self.coordinator_excludes(b))
                .flatten();
            let state = if excluded.is_some() {
                BackendState::Down
            } else {
                state
            };
            if state != self.states[b] {
                tracing::info!(cluster = %self.settings.cluster, backend = %self.ops.address(b), from = %self.states[b], to = %state, "backend state changed");
                self.states[b] = state;
            }
            let is_replica = match self.observed[b] {
                Some(o) => !o.writable,
                None => self.settings.roles[b] != Role::Primary,
            };
            let readable = state == BackendState::Up && (is_replica || Some(b) == self.primary);
            self.router.set_readable(b, readable);
            statuses.push(BackendStatus {
                address: self.ops.address(b).to_owned(),
                state,
                primary: Some(b) == self.primary,
                writable: self.observed[b].map(|o| o.writable || o.detached),
                lag_bytes: self.lags[b].bytes,
                lag_time: self.lags[b].time,
                last_error: excluded.or_else(|| self.errors[b].clone()),
                probe_login_refused: self.login_refused[b],
            });
        }
        self.router.set_primary(self.primary);
        self.router.set_primary_valid_until(
            self.primary_valid_until()
                .map(tokio::time::Instant::from_std),
        );
        self.view.publish(statuses);
    }
}

mod failover;
#[cfg(test)]
mod tests;
