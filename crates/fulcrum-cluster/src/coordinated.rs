//! The health loop under a coordinator (`topology = "etcd"` or
//! `"patroni"`): what the coordinator says bounds what this instance's
//! probes may decide. Only the primary the coordinator names, once ready
//! and seen writable by this instance's own probe, takes writes; any other
//! writable node is fenced here (no traffic). Cut off from the
//! coordinator for longer than its lease, an instance holds writes (or,
//! with `on_coordinator_loss = "last_known"`, keeps the last named primary
//! while it still answers as one) and never promotes. The etcd leader's
//! duties (publish the first topology, follow a primary promoted by
//! someone else, promote under a new epoch, finish a promotion a dead
//! leader began) are here too; the promotion itself is the monitor's.

use std::time::Instant;

use fulcrum_config::{CoordinatorLoss, Failover, Topology as Source};
use fulcrum_coordination::{Authority, Published, Stage};
use fulcrum_pool::BackendId;

use crate::monitor::Monitor;
use crate::ops::ServerOps;
use crate::topology::{NodeView, Topology};
use crate::view::CoordinationStatus;

/// Whether this process was paused (SIGSTOP, a VM freeze, a long stall):
/// two verdicts further apart than the coordinator's lease. Until the
/// coordinator has spoken again after such a gap, this instance's own probe
/// does not vouch for the primary it last knew (`last_known`): the world
/// may have moved on while it slept, and a probe only sees that a node
/// answers as a primary, not that it still is the primary.
#[derive(Debug, Default)]
pub(crate) struct Pause {
    last_take: Option<Instant>,
    resumed_at: Option<Instant>,
}

impl Pause {
    /// A verdict is taken at `now`; a gap past `lease` is a pause.
    fn took(&mut self, now: Instant, lease: std::time::Duration, cluster: &str) {
        if self
            .last_take
            .is_some_and(|t| now.saturating_duration_since(t) > lease)
        {
            tracing::warn!(%cluster, "this instance was paused longer than the coordinator's lease: its probes vouch for no primary until the coordinator answers again");
            self.resumed_at = Some(now);
        }
        self.last_take = Some(now);
    }

    /// Whether the coordinator has not been heard from since the last pause.
    fn unheard_since_pause(&self, last_heard: Option<Instant>) -> bool {
        self.resumed_at
            .is_some_and(|r| last_heard.is_none_or(|h| h < r))
    }
}

/// A promotion's publication failed: someone else decided, or this
/// instance no longer leads.
pub(crate) struct NotDecided(pub String);

impl<S: ServerOps> Monitor<S> {
    /// The backend configured at `address`.
    pub(crate) fn backend_at(&self, address: &str) -> Option<BackendId> {
        (0..self.settings.roles.len()).find(|&b| self.ops.address(b) == address)
    }

    fn on_loss(&self) -> CoordinatorLoss {
        match &self.settings.topology {
            Source::Etcd(e) => e.on_loss,
            Source::Patroni(p) => p.on_loss,
            Source::Probe => CoordinatorLoss::Hold,
        }
    }

    /// The primary the coordinator names, whatever its stage.
    pub(crate) fn named(&self) -> Option<BackendId> {
        let p = self.verdict.as_ref()?.published.as_ref()?;
        self.backend_at(p.primary.as_deref()?)
    }

    /// Bounds the probes' decision `t` by the coordinator's verdict.
    pub(crate) fn constrain(&self, t: Topology, nodes: &[NodeView]) -> Topology {
        let Some(v) = &self.verdict else {
            return t;
        };
        let writable = |b: BackendId| nodes[b].reachable && nodes[b].writable == Some(true);
        let named = self.named();
        let ready = v
            .published
            .as_ref()
            .is_some_and(|p| p.stage == Stage::Ready);
        let primary = match (v.cut_off, self.on_loss()) {
            (true, CoordinatorLoss::Hold) => None,
            _ => named.filter(|&b| ready && writable(b)),
        };
        let fenced = (0..nodes.len())
            .map(|b| {
                writable(b)
                    && Some(b) != named
                    && (named.is_some() || t.fenced.get(b).copied().unwrap_or(false))
            })
            .collect();
        Topology { primary, fenced }
    }

    /// The member Patroni lists at `b`'s address, while in contact.
    fn member(&self, b: BackendId) -> Option<&fulcrum_coordination::Member> {
        let v = self.verdict.as_ref().filter(|v| !v.cut_off)?;
        let address = self.ops.address(b);
        v.members.iter().find(|m| m.address == address)
    }

    /// Why Patroni says replica `b` takes no reads (it reports it
    /// stopped, starting, crashed, ...); `None` when it may, when Patroni
    /// does not list it, or while cut off (reads go on by the probes).
    pub(crate) fn coordinator_excludes(&self, b: BackendId) -> Option<String> {
        let m = self.member(b)?;
        (!m.is_primary() && !m.serves_reads())
            .then(|| format!("Patroni reports member {} {} ({})", m.name, m.state, m.role))
    }

    /// The bytes Patroni reports replica `b` behind its leader.
    pub(crate) fn coordinator_lag(&self, b: BackendId) -> Option<u64> {
        self.member(b).filter(|m| !m.is_primary())?.lag
    }

    /// Reads the coordinator's state again (polling Patroni) and takes
    /// its verdict.
    pub(crate) async fn hear(&mut self) {
        self.authority.refresh().await;
        self.take_verdict();
    }

    /// Takes the coordinator's verdict as it stands.
    pub(crate) fn take_verdict(&mut self) {
        if matches!(self.authority, Authority::Probe) {
            return;
        }
        let now = Instant::now();
        let lease = self.lease();
        self.pause.took(now, lease, &self.settings.cluster);
        let v = self.authority.verdict(now);
        if let Some(v) = &v {
            // A coordinator never heard from yet (at start) was not "lost".
            let was_cut = self
                .verdict
                .as_ref()
                .is_some_and(|o| o.cut_off && o.last_heard.is_some());
            if v.cut_off && !was_cut && v.last_heard.is_some() {
                tracing::error!(cluster = %self.settings.cluster, source = self.authority.source(), error = v.last_error.as_deref().unwrap_or(""), on_loss = ?self.on_loss(), "cut off from the coordinator: no promotion; writes follow on_coordinator_loss");
            } else if !v.cut_off && was_cut {
                tracing::warn!(cluster = %self.settings.cluster, source = self.authority.source(), "the coordinator answers again");
            }
            self.view.set_coordination(CoordinationStatus {
                source: self.authority.source(),
                epoch: v.published.as_ref().map_or(0, |p| p.epoch),
                leader: v.leader.clone(),
                leading: v.leading,
                last_heard: v.last_heard,
                cut_off: v.cut_off,
            });
        }
        self.verdict = v;
    }

    /// Until when the router's primary may take writes without news from
    /// the coordinator (`None`: no bound).
    pub(crate) fn primary_valid_until(&self) -> Option<Instant> {
        let v = self.verdict.as_ref()?;
        match self.on_loss() {
            CoordinatorLoss::Hold => v.valid_until.or(Some(Instant::now())),
            // Vouched for by the coordinator within its lease, or by this
            // round's own probe that saw the named primary writable: a
            // process resumed after a freeze writes nowhere until one of
            // the two has spoken again, and after a pause past the lease
            // only the coordinator may ([`Pause`]).
            CoordinatorLoss::LastKnown => {
                let paused = self.pause.unheard_since_pause(v.last_heard);
                let probed = self
                    .named()
                    .filter(|_| !paused)
                    .filter(|&b| {
                        self.trackers[b].reachable()
                            && self.trackers[b].failures() == 0
                            && self.observed[b].is_some_and(|o| o.writable)
                    })
                    .map(|_| Instant::now() + self.lease());
                v.valid_until.max(probed).or(Some(Instant::now()))
            }
        }
    }

    /// How long a word from the coordinator holds (`etcd_lease`,
    /// `patroni_timeout`).
    fn lease(&self) -> std::time::Duration {
        match &self.settings.topology {
            Source::Etcd(e) => e.lease,
            Source::Patroni(p) => p.timeout,
            Source::Probe => std::time::Duration::ZERO,
        }
    }

    /// The etcd leader's duties after this round's probes; `raw` is what
    /// the probes alone decided.
    pub(crate) async fn lead(&mut self, raw: &Topology, now: Instant) {
        let Authority::Etcd(elected) = &self.authority else {
            return;
        };
        let elected = elected.clone();
        let Some(v) = self.verdict.clone().filter(|v| v.leading && !v.cut_off) else {
            return;
        };
        let Some(current) = v.published.clone() else {
            // The first topology: what this leader's probes see.
            if let Some(p) = raw.primary {
                let first = self.decision(1, p, Stage::Ready, None);
                match elected.publish(&first).await {
                    Ok(true) => {
                        tracing::warn!(cluster = %self.settings.cluster, primary = %self.ops.address(p), "published the first topology (epoch 1)")
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(cluster = %self.settings.cluster, error = %e, "could not publish the topology")
                    }
                }
                self.hear().await;
            }
            return;
        };
        let named = current.primary.as_deref().and_then(|a| self.backend_at(a));
        if current.stage == Stage::Promoting {
            if let Some(target) = named {
                self.finish_promotion(&current, target, now).await;
            }
            return;
        }
        let named_writable = named.is_some_and(|b| {
            self.trackers[b].reachable() && self.observed[b].is_some_and(|o| o.writable)
        });
        if let Some(p) = named.filter(|_| {
            named_writable
                && current.stage == Stage::Ready
                && (!current.followers_pending.is_empty() || current.command_pending)
        }) {
            // A failover published ready whose duties are not all done: its
            // leader died before them, or a replica was unreachable.
            self.finish_duties(&current, p).await;
            return;
        }
        if named_writable || self.settings.health.failover == Failover::None {
            return;
        }
        // A primary promoted by someone else (failover = follow, or an
        // operator): publish it under the next epoch.
        if let Some(p) = raw.primary.filter(|&p| Some(p) != named) {
            let next = self.decision(current.epoch + 1, p, Stage::Ready, None);
            if let Ok(true) = elected.publish(&next).await {
                tracing::warn!(cluster = %self.settings.cluster, primary = %self.ops.address(p), epoch = next.epoch, "published a primary promoted outside Fulcrum");
            }
            self.hear().await;
        }
    }

    /// A promotion published but not finished (this leader's, or a dead
    /// leader's): promote the same node under the same epoch; if it is
    /// gone for `failover_timeout`, the next round picks another under a
    /// new epoch.
    async fn finish_promotion(&mut self, current: &Published, target: BackendId, now: Instant) {
        let timeout = self.settings.health.failover_timeout;
        if self.trackers[target]
            .down_for(now)
            .is_some_and(|d| d >= timeout)
        {
            tracing::error!(cluster = %self.settings.cluster, backend = %self.ops.address(target), epoch = current.epoch, "the node being promoted is down: choosing another under a new epoch");
            self.primary = None;
            self.last_primary = Some(target);
            self.maybe_promote(now, Some(current.epoch)).await;
            return;
        }
        if !self.trackers[target].reachable() {
            return;
        }
        let done = self.observed[target].is_some_and(|o| o.writable);
        if !done {
            tracing::warn!(cluster = %self.settings.cluster, backend = %self.ops.address(target), epoch = current.epoch, "finishing a published promotion");
            if let Err(e) = self.ops.promote(target).await {
                tracing::error!(cluster = %self.settings.cluster, backend = %self.ops.address(target), error = %e, "promotion failed; will try again");
                return;
            }
            self.view.count_failover();
        }
        let floor = self.ops.commit_floor(target).await.ok().flatten();
        let mut ready = self.decision(
            current.epoch,
            target,
            Stage::Ready,
            floor.or(current.commit_floor),
        );
        // The dead leader's failover duties become this leader's.
        ready.replaces = current.replaces.clone();
        let old = current.replaces.as_deref().and_then(|a| self.backend_at(a));
        ready.followers_pending = (0..self.settings.roles.len())
            .filter(|&b| b != target && Some(b) != old)
            .map(|b| self.ops.address(b).to_owned())
            .collect();
        ready.command_pending = self.settings.health.failover_command.is_some();
        match self.publish_decision(&ready).await {
            Ok(()) => self.finish_duties(&ready, target).await,
            Err(NotDecided(why)) => tracing::warn!(cluster = %self.settings.cluster, "{why}"),
        }
    }

    /// Does what is left of a failover published ready (re-point the
    /// replicas still following the old primary, run `failover_command`),
    /// then publishes what remains (a replica unreachable now is tried
    /// again in a later round).
    async fn finish_duties(&mut self, current: &Published, primary: BackendId) {
        let followers: Vec<BackendId> = current
            .followers_pending
            .iter()
            .filter_map(|a| self.backend_at(a))
            .collect();
        let old = current
            .replaces
            .as_deref()
            .and_then(|a| self.backend_at(a))
            .unwrap_or(primary);
        if current.command_pending || followers.iter().any(|&b| self.trackers[b].reachable()) {
            tracing::warn!(cluster = %self.settings.cluster, epoch = current.epoch, pending = ?current.followers_pending, command = current.command_pending, "doing what is left of a published failover");
        }
        let left = self
            .complete_failover(old, primary, &followers, current.command_pending)
            .await;
        self.publish_duties_done(primary, left, false).await;
    }

    /// Publishes the decision naming `primary` again with what is left of
    /// its failover's duties, if that changed (etcd; the leader only).
    pub(crate) async fn publish_duties_done(
        &mut self,
        primary: BackendId,
        left: Vec<BackendId>,
        command_pending: bool,
    ) {
        let Some(current) = self
            .verdict
            .as_ref()
            .filter(|v| v.leading && !v.cut_off)
            .and_then(|v| v.published.clone())
        else {
            return;
        };
        if current.stage != Stage::Ready
            || current.primary.as_deref() != Some(self.ops.address(primary))
        {
            return;
        }
        let left: Vec<String> = left
            .iter()
            .map(|&b| self.ops.address(b).to_owned())
            .collect();
        if left == current.followers_pending && command_pending == current.command_pending {
            return;
        }
        let mut next = self.decision(current.epoch, primary, Stage::Ready, current.commit_floor);
        next.replaces = current.replaces.clone();
        next.followers_pending = left;
        next.command_pending = command_pending;
        if let Err(NotDecided(why)) = self.publish_decision(&next).await {
            tracing::warn!(cluster = %self.settings.cluster, "{why}");
        }
    }

    /// A decision to publish, with the other backends as replicas.
    pub(crate) fn decision(
        &self,
        epoch: u64,
        primary: BackendId,
        stage: Stage,
        commit_floor: Option<u64>,
    ) -> Published {
        let me = match &self.authority {
            Authority::Etcd(e) => e.me().to_owned(),
            _ => String::new(),
        };
        Published {
            epoch,
            primary: Some(self.ops.address(primary).to_owned()),
            replicas: (0..self.settings.roles.len())
                .filter(|&b| b != primary)
                .map(|b| self.ops.address(b).to_owned())
                .collect(),
            stage,
            by: me,
            at_ms: fulcrum_coordination::published::unix_ms(),
            commit_floor,
            ..Default::default()
        }
    }

    /// Publishes `d` (etcd); then reads the verdict again. Nothing to do
    /// with `topology = "probe"`.
    pub(crate) async fn publish_decision(&mut self, d: &Published) -> Result<(), NotDecided> {
        let Authority::Etcd(elected) = &self.authority else {
            return Ok(());
        };
        let r = elected.publish(d).await;
        self.hear().await;
        match r {
            Ok(true) => Ok(()),
            Ok(false) => Err(NotDecided(format!(
                "epoch {} not published: another decision came first, or this instance no longer leads",
                d.epoch
            ))),
            Err(e) => Err(NotDecided(format!("epoch {} not published: {e}", d.epoch))),
        }
    }

    /// Whether this instance may promote: always with `probe`; with etcd
    /// only the leader, in contact; with Patroni never.
    pub(crate) fn may_promote(&self) -> bool {
        match &self.authority {
            Authority::Probe => true,
            Authority::Etcd(_) => self
                .verdict
                .as_ref()
                .is_some_and(|v| v.leading && !v.cut_off),
            Authority::Patroni(_) => false,
        }
    }

    /// The epoch a promotion now would publish (etcd); `None` without
    /// one to publish to.
    pub(crate) fn next_epoch(&self) -> Option<u64> {
        match &self.authority {
            Authority::Etcd(_) => Some(
                self.verdict
                    .as_ref()
                    .and_then(|v| v.published.as_ref())
                    .map_or(1, |p| p.epoch + 1),
            ),
            _ => None,
        }
    }

    /// The commit floor the published topology carries for the primary
    /// this instance adopts (promoted by the leader, maybe elsewhere).
    pub(crate) fn published_floor(&self) -> Option<(BackendId, u64)> {
        let p = self.verdict.as_ref()?.published.as_ref()?;
        Some((self.backend_at(p.primary.as_deref()?)?, p.commit_floor?))
    }
}

#[cfg(test)]
mod pause_tests {
    use std::time::{Duration, Instant};

    use super::Pause;

    #[test]
    fn a_gap_past_the_lease_is_a_pause_until_the_coordinator_speaks_again() {
        let lease = Duration::from_secs(3);
        let t0 = Instant::now();
        let mut p = Pause::default();
        p.took(t0, lease, "c");
        p.took(t0 + Duration::from_millis(500), lease, "c");
        assert!(!p.unheard_since_pause(Some(t0)), "regular rounds: no pause");
        let resumed = t0 + Duration::from_secs(6);
        p.took(resumed, lease, "c");
        assert!(
            p.unheard_since_pause(Some(t0)),
            "heard before the pause only"
        );
        assert!(p.unheard_since_pause(None));
        assert!(!p.unheard_since_pause(Some(resumed + Duration::from_millis(10))));
    }
}
