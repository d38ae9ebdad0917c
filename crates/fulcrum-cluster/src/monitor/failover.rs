//! Automatic failover (`failover = "promote"`): once the last primary has
//! been down for `failover_timeout`, the loop promotes the most advanced
//! replica (unless it is past `failover_max_lag`), publishes the choice to
//! a coordinator if there is one, re-points the other replicas at the new
//! primary and runs `failover_command`.

use std::time::{Duration, Instant};

use fulcrum_config::MaxLag;
use fulcrum_pool::BackendId;

use super::Monitor;
use crate::command::{self, FailoverEvent};
use crate::lag::format_lsn;
use crate::ops::ServerOps;
use crate::topology::promotion_candidate;

/// How long a promotion may take before it is given up (and retried).
const PROMOTE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long re-pointing one replica may take.
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(10);
/// How long failover_command may run before it is killed.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

impl<S: ServerOps> Monitor<S> {
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
