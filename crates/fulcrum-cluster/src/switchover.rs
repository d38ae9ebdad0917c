//! Planned switchover (`SWITCHOVER cluster TO backend` in the admin
//! console), run by the health loop so its picture of the cluster stays the
//! truth: hold new units of work, let the ones on the primary finish, fence
//! the primary (read-only), wait until the target has everything it wrote,
//! promote the target, re-point the other replicas, resume. The old primary
//! is then `stale` until an operator re-joins it as a replica.

use std::time::{Duration, Instant};

use fulcrum_pool::BackendId;
use tokio::sync::{mpsc, oneshot};

use crate::lag::format_lsn;
use crate::monitor::Monitor;
use crate::ops::ServerOps;

/// How long each step may take before the switchover is given up.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// With `transaction_replay`: how long transactions on the primary get to
/// end by themselves before the sessions idle in one are ended (and then
/// again at this interval while some remain).
const REPLAY_GRACE: Duration = Duration::from_secs(1);

/// A request to the health loop.
pub(crate) struct Request {
    pub target: BackendId,
    pub reply: oneshot::Sender<Result<Duration, String>>,
}

/// Sends requests to a cluster's health loop.
#[derive(Clone)]
pub struct MonitorHandle {
    pub(crate) tx: mpsc::Sender<Request>,
}

impl MonitorHandle {
    /// Runs a planned switchover to `target`; returns how long new work was
    /// held, or why it was not done (the cluster is then as before).
    pub async fn switchover(&self, target: BackendId) -> Result<Duration, String> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request { target, reply })
            .await
            .map_err(|_| "the health loop is not running".to_string())?;
        rx.await
            .map_err(|_| "the health loop stopped during the switchover".to_string())?
    }
}

impl<S: ServerOps> Monitor<S> {
    pub(crate) async fn switchover(&mut self, target: BackendId) -> Result<Duration, String> {
        if let fulcrum_coordination::Authority::Patroni(patroni) = &self.authority {
            return self.patroni_switchover(patroni.clone(), target).await;
        }
        if !self.may_promote() {
            let leader = self
                .verdict
                .as_ref()
                .and_then(|v| v.leader.clone())
                .unwrap_or_else(|| "nobody now".into());
            return Err(format!(
                "this instance does not lead the cluster's topology in etcd; run SWITCHOVER on the leader ({leader})"
            ));
        }
        let old = self
            .primary
            .ok_or("the cluster has no primary now; nothing to switch over")?;
        if target == old {
            return Err(format!(
                "{} is already the primary",
                self.ops.address(target)
            ));
        }
        let ok_target = self.trackers.get(target).is_some_and(|t| t.reachable())
            && self
                .observed
                .get(target)
                .and_then(|o| *o)
                .is_some_and(|o| !o.writable)
            && !self.fenced[target];
        if !ok_target {
            return Err(format!(
                "{} is not a reachable replica",
                self.ops.address(target)
            ));
        }
        let held = Instant::now();
        self.router.set_paused(true);
        let result = self.switch(old, target).await;
        self.router.set_paused(false);
        let took = held.elapsed();
        match &result {
            Ok(()) => tracing::warn!(
                cluster = %self.settings.cluster, old = %self.ops.address(old), new = %self.ops.address(target),
                held_ms = took.as_millis() as u64,
                "switchover done: {} is the primary; {} is fenced until it is re-joined as a replica",
                self.ops.address(target), self.ops.address(old)
            ),
            Err(e) => {
                tracing::error!(cluster = %self.settings.cluster, error = %e, "switchover abandoned; the cluster is as before")
            }
        }
        result.map(|()| took)
    }

    async fn switch(&mut self, old: BackendId, target: BackendId) -> Result<(), String> {
        // The units of work already on the primary finish, and none is left
        // between the pause gate and a server connection (it could still
        // reach the old primary after the fence below).
        let deadline = Instant::now() + STEP_TIMEOUT;
        let mut next_end = Instant::now() + REPLAY_GRACE;
        while self.router.load(old) > 0 || self.router.admitting() > 0 {
            if Instant::now() > deadline {
                return Err("transactions on the primary did not finish in 10 s".into());
            }
            if self.settings.replay && self.router.load(old) > 0 && Instant::now() >= next_end {
                // Transactions whose clients are idle in them would hold
                // the switchover up (to its 10 s limit): end their
                // sessions; Fulcrum replays them on the new primary once
                // the held work resumes. Active statements finish first.
                next_end = Instant::now() + REPLAY_GRACE;
                match self.ops.end_idle_transactions(old).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(
                        cluster = %self.settings.cluster, ended = n,
                        "switchover: ended sessions idle in a transaction on the old primary; their transactions are replayed on the new one"
                    ),
                    Err(e) => {
                        tracing::warn!(cluster = %self.settings.cluster, error = %e, "switchover: could not end sessions idle in a transaction")
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let last = self
            .ops
            .fence(old)
            .await
            .map_err(|e| format!("cannot make the primary read-only: {e}"))?;
        loop {
            let o = self
                .ops
                .probe(target)
                .await
                .map_err(|e| format!("cannot read the target's position: {e}"))?;
            if o.position >= last {
                break;
            }
            if Instant::now() > deadline + STEP_TIMEOUT {
                return Err(format!(
                    "the target replayed {} of {} in 20 s",
                    format_lsn(o.position),
                    format_lsn(last)
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let epoch = self.next_epoch();
        if let Some(epoch) = epoch {
            let intent = self.decision(epoch, target, fulcrum_coordination::Stage::Promoting, None);
            self.publish_decision(&intent)
                .await
                .map_err(|crate::coordinated::NotDecided(why)| why)?;
        }
        self.ops
            .promote(target)
            .await
            .map_err(|e| format!("promotion failed: {e}"))?;
        self.view.count_failover();
        if let Some(epoch) = epoch {
            let floor = self.ops.commit_floor(target).await.ok().flatten();
            let ready = self.decision(epoch, target, fulcrum_coordination::Stage::Ready, floor);
            self.publish_decision(&ready)
                .await
                .map_err(|crate::coordinated::NotDecided(why)| format!("promoted, but {why}"))?;
        }
        if let Some(o) = self.observed[target].as_mut() {
            o.writable = true;
        }
        self.primary = Some(target);
        self.last_primary = Some(target);
        self.primary_position = None;
        self.router.set_primary(Some(target));
        self.publish();
        for r in 0..self.settings.roles.len() {
            let replica = self.observed[r].is_some_and(|o| !o.writable);
            if r != target && r != old && replica && self.trackers[r].reachable() {
                if let Err(e) = self.ops.follow(r, target).await {
                    tracing::error!(cluster = %self.settings.cluster, replica = %self.ops.address(r), error = %e, "could not re-point replica");
                }
            }
        }
        Ok(())
    }

    /// `topology = "patroni"`: Patroni switches over; this loop follows
    /// once Patroni names the target its running leader.
    async fn patroni_switchover(
        &mut self,
        patroni: std::sync::Arc<fulcrum_coordination::Followed>,
        target: BackendId,
    ) -> Result<Duration, String> {
        let started = Instant::now();
        let address = self.ops.address(target).to_owned();
        let said = patroni
            .switchover(&address)
            .await
            .map_err(|e| e.to_string())?;
        tracing::warn!(cluster = %self.settings.cluster, target = %address, patroni = %said.trim(), "switchover asked of Patroni");
        let deadline = Instant::now() + STEP_TIMEOUT * 6;
        while Instant::now() < deadline {
            self.round().await;
            if self.primary == Some(target) {
                return Ok(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "Patroni accepted the switchover, but {address} did not become the primary within {:?}",
            STEP_TIMEOUT * 6
        ))
    }
}
