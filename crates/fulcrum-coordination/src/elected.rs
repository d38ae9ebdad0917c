//! `topology = "etcd"`: this instance's side of the election and of the
//! published topology. A background task holds a lease, campaigns for the
//! cluster's leader key with it, renews it every third of its TTL, and
//! watches the topology key; it records when etcd last answered. The
//! health loop reads a [`Verdict`] each round and, while it leads,
//! publishes through [`Elected::publish`], a compare-and-swap that a
//! leader who lost its key cannot win. A topology read from etcd is taken
//! only if the leader wrote it in its own lease-bound transaction
//! (`proof`); anything else is refused with a warning and the last
//! accepted topology kept. A new leader writes the topology it accepted
//! again under its own lease.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::etcd::{candidate_key, watch_event, Candidate, EtcdClient, Kv};
use crate::http::{next_chunk, Messages};
use crate::proof::refusal;
use crate::published::Published;
use crate::{CoordError, Verdict};

/// The highest epoch of a refused topology that a first publication
/// steps over; higher ones are ignored (an epoch that only grows has no
/// business near the end of `u64`).
const UNPROVEN_EPOCH_CAP: u64 = u32::MAX as u64;

/// What the task has learned.
#[derive(Debug, Default)]
struct State {
    published: Option<Published>,
    /// The topology key's mod revision as last read, accepted or refused
    /// (0: it does not exist yet): what a publication's compare holds on.
    revision: i64,
    /// The highest epoch of a topology refused (none accepted yet): a
    /// first publication goes above it, so that instances that accepted
    /// it before (an older Fulcrum's, or one whose proof etcd compacted
    /// away) move on.
    unproven_epoch: u64,
    leader: Option<String>,
    leading: bool,
    /// This candidate's key in the election (what a publication's compare
    /// holds on and writes again).
    candidate: Option<Candidate>,
    last_heard: Option<Instant>,
    last_error: Option<String>,
}

pub struct Elected {
    client: EtcdClient,
    me: String,
    lease: Duration,
    leader_key: String,
    topology_key: String,
    state: Mutex<State>,
    /// Bumped on every change the health loop should look at now.
    changed: watch::Sender<u64>,
    cluster: String,
}

impl Elected {
    pub fn new(cluster: &str, settings: &fulcrum_config::Etcd) -> Arc<Elected> {
        let base = format!("{}/{}", settings.prefix, cluster);
        Arc::new(Elected {
            client: EtcdClient::new(settings),
            me: settings.instance.clone(),
            lease: settings.lease,
            leader_key: format!("{base}/leader"),
            topology_key: format!("{base}/topology"),
            state: Mutex::new(State::default()),
            changed: watch::channel(0).0,
            cluster: cluster.to_owned(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub fn me(&self) -> &str {
        &self.me
    }

    /// What the health loop routes by.
    pub fn verdict(&self, now: Instant) -> Verdict {
        let s = self.state();
        let cut_off = s
            .last_heard
            .is_none_or(|t| now.saturating_duration_since(t) > self.lease);
        Verdict {
            published: s.published.clone(),
            leading: s.leading && !cut_off,
            leader: s.leader.clone(),
            cut_off,
            last_heard: s.last_heard,
            valid_until: s.last_heard.map(|t| t + self.lease),
            last_error: s.last_error.clone(),
            members: Vec::new(),
        }
    }

    /// Publishes `next` if this instance still leads and nobody wrote the
    /// topology since it was last read. `Ok(false)`: someone did (or the
    /// lead is lost); read again before deciding anything. It goes out as
    /// this leader's: `by`, its lease and its candidate key's create
    /// revision, in a transaction that writes that key too (`proof`).
    pub async fn publish(&self, next: &Published) -> Result<bool, CoordError> {
        let (revision, seen, candidate, unproven) = {
            let s = self.state();
            (
                s.revision,
                s.published.clone(),
                s.candidate.clone(),
                s.unproven_epoch,
            )
        };
        if !next.supersedes(seen.as_ref()) {
            return Ok(false);
        }
        let Some(candidate) = candidate else {
            return Ok(false);
        };
        let mut next = next.clone();
        next.by = self.me.clone();
        next.leader_lease = Some(candidate.lease);
        next.leader_revision = Some(candidate.created);
        if seen.is_none() && next.epoch <= unproven {
            tracing::warn!(cluster = %self.cluster, epoch = unproven + 1, refused = unproven, "first topology this instance accepts: published above the epoch of the refused one");
            next.epoch = unproven + 1;
        }
        let written = self
            .client
            .put_if_leader(&self.topology_key, &next.encode(), &candidate, revision)
            .await?;
        match written {
            Some(rev) => {
                let mut s = self.state();
                s.last_heard = Some(Instant::now());
                if s.revision < rev {
                    s.revision = rev;
                    s.published = Some(next);
                }
                drop(s);
                self.bump();
                Ok(true)
            }
            None => {
                // Someone else wrote it, or the lead is gone: read it now.
                self.read_topology().await?;
                Ok(false)
            }
        }
    }

    /// Reads the topology key and keeps it if the leader wrote it and its
    /// epoch is not lower.
    /// etcd counts as heard (the router may trust the topology again) only
    /// once the topology read is taken: `take` asks etcd again for the
    /// proof, and a round in between (or a failed proof read) must not
    /// route by the old topology as if etcd had just confirmed it.
    async fn read_topology(&self) -> Result<(), CoordError> {
        let kv = self.client.get(&self.topology_key).await?;
        let read_at = Instant::now();
        let taken = match kv {
            Some(kv) => self.take(kv).await,
            None => Ok(()),
        };
        if taken.is_ok() {
            self.state().last_heard = Some(read_at);
        }
        taken
    }

    /// Takes a version of the topology key newer than the last one read,
    /// once its proof holds (`proof`): the election read as it was at the
    /// topology's revision.
    async fn take(&self, kv: Kv) -> Result<(), CoordError> {
        if kv.mod_revision <= self.state().revision {
            return Ok(());
        }
        let p = match Published::decode(&kv.value) {
            Ok(p) => p,
            Err(e) => {
                if self.pass_over(kv.mod_revision, None) {
                    tracing::error!(cluster = %self.cluster, key = %self.topology_key, error = %e, "unreadable topology in etcd; keeping the last one");
                }
                return Ok(());
            }
        };
        let candidates = self
            .client
            .candidates(&self.leader_key, kv.mod_revision)
            .await?;
        if let Some(why) = refusal(&self.leader_key, &kv, &p, &candidates) {
            if self.pass_over(kv.mod_revision, Some(p.epoch)) {
                tracing::warn!(cluster = %self.cluster, key = %self.topology_key, revision = kv.mod_revision, by = %p.by, epoch = p.epoch, primary = ?p.primary, stage = ?p.stage, why = %why, "refusing a topology the leader did not write; keeping the last one");
            }
            return Ok(());
        }
        let mut s = self.state();
        if kv.mod_revision <= s.revision {
            return Ok(());
        }
        s.revision = kv.mod_revision;
        if !p.supersedes(s.published.as_ref()) {
            tracing::error!(cluster = %self.cluster, epoch = p.epoch, seen = s.published.as_ref().map_or(0, |s| s.epoch), "refusing a published topology with a lower epoch than one already seen");
            return Ok(());
        }
        let changed = s.published.as_ref() != Some(&p);
        if changed {
            tracing::info!(cluster = %self.cluster, epoch = p.epoch, primary = ?p.primary, stage = ?p.stage, by = %p.by, "published topology");
        }
        s.published = Some(p);
        drop(s);
        if changed {
            self.bump();
        }
        Ok(())
    }

    /// Moves past a version of the topology key not taken (so that the
    /// leader's next compare-and-swap replaces it), remembering its epoch
    /// while none was accepted. False when it was already passed.
    fn pass_over(&self, revision: i64, epoch: Option<u64>) -> bool {
        let mut s = self.state();
        if revision <= s.revision {
            return false;
        }
        s.revision = revision;
        if let Some(e) = epoch.filter(|&e| e <= UNPROVEN_EPOCH_CAP && s.published.is_none()) {
            s.unproven_epoch = s.unproven_epoch.max(e);
        }
        true
    }

    /// A new leader writes the topology it accepted again, under its own
    /// lease: once the leader that wrote it is gone and etcd compacted
    /// the revision it was written at, instances starting later could no
    /// longer tell it from a forgery.
    async fn sign_again(&self) {
        let (mine, lease) = {
            let s = self.state();
            if !s.leading {
                return;
            }
            let Some(c) = &s.candidate else { return };
            (s.published.clone(), c.lease)
        };
        let Some(p) = mine.filter(|p| p.leader_lease != Some(lease)) else {
            return;
        };
        match self.publish(&p).await {
            Ok(true) => {
                tracing::info!(cluster = %self.cluster, epoch = p.epoch, "wrote the topology again under this leader's lease")
            }
            Ok(false) => {}
            Err(e) => self.failed(&e),
        }
    }

    fn failed(&self, e: &CoordError) {
        let mut s = self.state();
        if s.last_error.as_deref() != Some(&e.to_string()) {
            tracing::warn!(cluster = %self.cluster, error = %e, "etcd call failed");
        }
        s.last_error = Some(e.to_string());
    }

    /// The lease, election and read loop, until `stop` turns true. On
    /// stop it resigns (revokes its lease), so a next leader need not wait
    /// for the TTL.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let watcher = tokio::spawn(self.clone().watch_loop(stop.clone()));
        let mut lease: Option<i64> = None;
        let tick = self.lease / 3;
        loop {
            if let Err(e) = self.step(&mut lease).await {
                self.failed(&e);
                // A lease we could not renew may be gone: a fresh grant
                // and campaign next time, never a lead assumed.
                let mut s = self.state();
                if s.leading {
                    tracing::warn!(cluster = %self.cluster, error = %e, "lost contact with etcd while leading");
                }
                s.leading = false;
                drop(s);
                self.bump();
            }
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = stop.changed() => {}
            }
            if *stop.borrow() {
                break;
            }
        }
        watcher.abort();
        if let Some(id) = lease {
            let _ = tokio::time::timeout(Duration::from_secs(1), self.client.revoke(id)).await;
        }
    }

    async fn step(&self, lease: &mut Option<i64>) -> Result<(), CoordError> {
        let id = match *lease {
            Some(id) => {
                if self.client.keep_alive(id).await? == 0 {
                    *lease = None;
                    let mut s = self.state();
                    if s.leading {
                        tracing::warn!(cluster = %self.cluster, "leader lease expired: no longer leading");
                    }
                    s.leading = false;
                    return Err(CoordError::Etcd("lease expired".into()));
                }
                id
            }
            None => {
                let (id, _ttl) = self.client.grant(self.lease).await?;
                *lease = Some(id);
                id
            }
        };
        let (created, holder) = self.client.campaign(&self.leader_key, &self.me, id).await?;
        let leading = created > 0
            && holder.as_ref().is_some_and(|h| {
                h.value == self.me.as_bytes() && h.lease == id && h.create_revision == created
            });
        let leader = holder.map(|h| String::from_utf8_lossy(&h.value).into_owned());
        {
            let mut s = self.state();
            s.candidate = (created > 0).then(|| Candidate {
                key: candidate_key(&self.leader_key, id),
                me: self.me.clone(),
                lease: id,
                created,
            });
            if leading != s.leading {
                if leading {
                    tracing::warn!(cluster = %self.cluster, instance = %self.me, "elected leader: this instance decides the topology");
                } else {
                    tracing::info!(cluster = %self.cluster, leader = ?leader, "not the leader");
                }
            }
            s.leading = leading;
            s.leader = leader;
            s.last_error = None;
        }
        self.read_topology().await?;
        self.sign_again().await;
        self.bump();
        Ok(())
    }

    /// Watches the topology key so that a new epoch is seen at once;
    /// reopens after any break.
    async fn watch_loop(self: Arc<Self>, stop: watch::Receiver<bool>) {
        while !*stop.borrow() {
            let from = self.state().revision + 1;
            match self.client.watch(&self.topology_key, from).await {
                Ok(mut body) => {
                    let mut messages = Messages::default();
                    while let Some(chunk) = next_chunk(&mut body).await {
                        let Ok(chunk) = chunk else { break };
                        let whole = match messages.push(&chunk) {
                            Ok(whole) => whole,
                            Err(e) => {
                                tracing::debug!(cluster = %self.cluster, error = %e, "etcd watch ended");
                                break;
                            }
                        };
                        for message in whole {
                            match watch_event(&message) {
                                Ok(Some(Some(kv))) => {
                                    // Taken at once (convergence), but not
                                    // "heard": a watch resumed after a pause
                                    // replays history (a new leader's
                                    // re-signed old topology, then its
                                    // failover), each true only at its own
                                    // revision. Only a read of the key as it
                                    // is now (read_topology, each tick)
                                    // makes the verdict fresh.
                                    if let Err(e) = self.take(kv).await {
                                        self.failed(&e);
                                    }
                                }
                                // A deletion (by hand) keeps the last topology seen.
                                Ok(Some(None)) | Ok(None) => {}
                                Err(e) => {
                                    tracing::debug!(cluster = %self.cluster, error = %e, "etcd watch ended");
                                }
                            }
                        }
                    }
                }
                Err(e) => tracing::debug!(cluster = %self.cluster, error = %e, "etcd watch failed"),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
