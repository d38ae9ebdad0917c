//! The health loop of one cluster: every `health_interval` (sooner while a
//! backend is failing, at once when a session reports one suspect) it probes
//! every backend in parallel, updates their trackers, measures lag, decides
//! the primary (`topology`), promotes a replica when `failover = "promote"`
//! and the primary has been down for `failover_timeout`, and publishes the
//! result to the router and the view. The only module here that does I/O.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fulcrum_config::{Failover, Health, MaxLag, Role};
use fulcrum_pool::{BackendId, Router};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::command::{self, FailoverEvent};
use crate::lag::{format_lsn, lag_of, over_limit, Lag};
use crate::ops::{Observation, OpsError, ServerOps};
use crate::state::{BackendState, Change, Tracker};
use crate::topology::{decide, promotion_candidate, NodeView};
use crate::view::{BackendStatus, ClusterView};

/// How long a promotion may take before it is given up (and retried).
const PROMOTE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long re-pointing one replica may take.
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(10);
/// How long failover_command may run before it is killed.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
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

    /// Why promoting `candidate` would lose too much (`failover_max_lag`):
    /// its replayed position is further behind the last primary position
    /// seen, or its last replayed change older, than allowed. `None`: close
    /// enough, or nothing to compare with.
    fn too_far_behind(&self, candidate: BackendId) -> Option<String> {
        let o = self.observed[candidate].as_ref()?;
        let reference = self
            .primary_position
            .or_else(|| self.observed.iter().flatten().map(|o| o.received).max())?;
        let lag = crate::lag::lag_of(reference, o.position, o.replay_age);
        let (over, limit) = match self.settings.health.failover_max_lag {
            MaxLag::Bytes(m) => (lag.bytes > m, format!("{m} bytes")),
            MaxLag::Time(t) => (lag.time > t, format!("{t:?}")),
        };
        over.then(|| {
            format!(
                "the most advanced replica, {}, is {} bytes and {:?} behind the last primary position (failover_max_lag = {limit}); run SWITCHOVER to promote it anyway",
                self.ops.address(candidate),
                lag.bytes,
                lag.time
            )
        })
    }

    /// `failover = "promote"`: once the last primary has been down for
    /// `failover_timeout`, promote the most advanced replica and re-point the
    /// others at it. Under etcd (only the leader gets here) the choice is
    /// published first, as `promoting` under the next epoch (`after`: the
    /// epoch of a promotion abandoned because its node died), and as
    /// `ready` once done; a lost compare-and-swap promotes nothing.
    pub(crate) async fn maybe_promote(&mut self, now: Instant, after: Option<u64>) {
        let Some(old) = self.last_primary else {
            return; // never had a primary: nothing to replace
        };
        // Under a coordinator, only the primary it names is replaced: one a
        // finished promotion has just named is not lost (this round's
        // decision predates it).
        if self.verdict.is_some() && self.named() != Some(old) {
            return;
        }
        let timeout = self.settings.health.failover_timeout;
        if self.trackers[old].down_for(now).is_none_or(|d| d < timeout) {
            return;
        }
        let nodes = self.nodes();
        // A node the probe cannot log in to is never promoted: its position is unknown.
        let positions: Vec<Option<u64>> = self
            .observed
            .iter()
            .zip(&self.login_refused)
            .map(|(o, refused)| o.filter(|_| !refused).map(|o| o.received.max(o.position)))
            .collect();
        let Some(new) = promotion_candidate(&nodes, &positions) else {
            if !self.told_no_candidate {
                tracing::error!(cluster = %self.settings.cluster, "primary down for {timeout:?} and no reachable replica to promote");
                self.told_no_candidate = true;
            }
            return;
        };
        if let Some(why) = self.too_far_behind(new) {
            if self.view.failover_blocked().as_deref() != Some(why.as_str()) {
                tracing::error!(cluster = %self.settings.cluster, backend = %self.ops.address(new), "not promoting: {why}");
                self.view.set_failover_blocked(Some(why));
            }
            return;
        }
        self.view.set_failover_blocked(None);
        let epoch = after.map(|e| e + 1).or(self.next_epoch());
        if let Some(epoch) = epoch {
            let mut intent =
                self.decision(epoch, new, fulcrum_coordination::Stage::Promoting, None);
            intent.replaces = Some(self.ops.address(old).to_owned());
            if let Err(crate::coordinated::NotDecided(why)) = self.publish_decision(&intent).await {
                tracing::warn!(cluster = %self.settings.cluster, backend = %self.ops.address(new), "not promoting: {why}");
                return;
            }
        }
        let position = positions[new].unwrap_or(0);
        tracing::warn!(
            cluster = %self.settings.cluster, old = %self.ops.address(old), new = %self.ops.address(new),
            position = %format_lsn(position),
            "primary down for {timeout:?}: promoting the most advanced replica"
        );
        let started = Instant::now();
        match tokio::time::timeout(PROMOTE_TIMEOUT, self.ops.promote(new)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(cluster = %self.settings.cluster, backend = %self.ops.address(new), error = %e, "promotion failed; will try again");
                return;
            }
            Err(_) => {
                tracing::error!(cluster = %self.settings.cluster, backend = %self.ops.address(new), "promotion did not finish in {PROMOTE_TIMEOUT:?}; will try again");
                return;
            }
        }
        self.view.count_failover();
        // Read before the router sends it any write: a transaction id below
        // it is one the old primary gave out (docs/failover.md).
        let floor = match tokio::time::timeout(PROMOTE_TIMEOUT, self.ops.commit_floor(new)).await {
            Ok(Ok(floor)) => floor,
            Ok(Err(e)) => {
                tracing::warn!(cluster = %self.settings.cluster, backend = %self.ops.address(new), error = %e, "could not read the new primary's first free transaction id: COMMITs in flight at the failover get 08007");
                None
            }
            Err(_) => None,
        };
        // The replicas to re-point: every other backend but the old primary.
        let followers: Vec<BackendId> =
            (0..nodes.len()).filter(|&r| r != new && r != old).collect();
        if let Some(epoch) = epoch {
            // Published ready with the failover's remaining duties, so a
            // next leader does them if this one dies before it has.
            let mut ready = self.decision(epoch, new, fulcrum_coordination::Stage::Ready, floor);
            ready.replaces = Some(self.ops.address(old).to_owned());
            ready.followers_pending = followers
                .iter()
                .map(|&r| self.ops.address(r).to_owned())
                .collect();
            ready.command_pending = self.settings.health.failover_command.is_some();
            if let Err(crate::coordinated::NotDecided(why)) = self.publish_decision(&ready).await {
                // Promoted, not yet published as ready: a next round (or a
                // next leader) finishes it under the same epoch.
                tracing::error!(cluster = %self.settings.cluster, backend = %self.ops.address(new), "promoted, but {why}");
                return;
            }
        }
        self.router.set_commit_floor(new, floor);
        if let Some(o) = self.observed[new].as_mut() {
            o.writable = true;
        }
        self.primary = Some(new);
        self.last_primary = Some(new);
        self.primary_position = None;
        self.router.set_primary(Some(new));
        self.publish();
        tracing::warn!(
            cluster = %self.settings.cluster, old = %self.ops.address(old), new = %self.ops.address(new),
            took_ms = started.elapsed().as_millis() as u64,
            "failover: promoted {}; writes go there now", self.ops.address(new)
        );
        let left = self.complete_failover(old, new, &followers, true).await;
        if epoch.is_some() {
            self.publish_duties_done(new, left, false).await;
        }
    }

    /// A failover's duties once `new` takes writes: re-point `followers`
    /// at it (those reachable and read-only; a writable one is fenced
    /// instead) and, with `command`, run `failover_command`. Returns the
    /// followers not re-pointed (unreachable, or the re-point failed).
    pub(crate) async fn complete_failover(
        &mut self,
        old: BackendId,
        new: BackendId,
        followers: &[BackendId],
        command: bool,
    ) -> Vec<BackendId> {
        let nodes = self.nodes();
        let mut left = Vec::new();
        for &r in followers {
            let node = &nodes[r];
            if !node.reachable {
                left.push(r);
                continue;
            }
            if node.writable != Some(false) {
                continue;
            }
            match tokio::time::timeout(FOLLOW_TIMEOUT, self.ops.follow(r, new)).await {
                Ok(Ok(())) => {
                    tracing::info!(cluster = %self.settings.cluster, replica = %self.ops.address(r), primary = %self.ops.address(new), "replica re-pointed at the new primary")
                }
                Ok(Err(e)) => {
                    left.push(r);
                    tracing::error!(cluster = %self.settings.cluster, replica = %self.ops.address(r), error = %e, "could not re-point replica at the new primary")
                }
                Err(_) => {
                    left.push(r);
                    tracing::error!(cluster = %self.settings.cluster, replica = %self.ops.address(r), "re-pointing replica timed out")
                }
            }
        }
        if !command {
            return left;
        }
        if let Some(template) = &self.settings.health.failover_command {
            let cmd = command::expand(
                template,
                &FailoverEvent {
                    cluster: &self.settings.cluster,
                    old_id: old,
                    old_address: self.ops.address(old),
                    new_id: new,
                    new_address: self.ops.address(new),
                },
            );
            let cluster = self.settings.cluster.clone();
            tokio::spawn(async move {
                match command::run(&cmd, COMMAND_TIMEOUT).await {
                    Ok(0) => {
                        tracing::info!(cluster = %cluster, command = %cmd, "failover_command succeeded")
                    }
                    Ok(code) => {
                        tracing::error!(cluster = %cluster, command = %cmd, code, "failover_command failed")
                    }
                    Err(e) => {
                        tracing::error!(cluster = %cluster, command = %cmd, error = %e, "failover_command failed")
                    }
                }
            });
        }
        left
    }
}

#[cfg(test)]
mod tests;
