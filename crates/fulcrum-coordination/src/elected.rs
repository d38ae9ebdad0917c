//! `topology = "etcd"`: this instance's side of the election and of the
//! published topology. A background task holds a lease, campaigns for the
//! cluster's leader key with it, renews it every third of its TTL, and
//! watches the topology key; it records when etcd last answered. The
//! health loop reads a [`Verdict`] each round and, while it leads,
//! publishes through [`Elected::publish`], a compare-and-swap that a
//! leader who lost its key cannot win.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::etcd::{candidate_key, watch_event, EtcdClient, Kv};
use crate::http::{next_chunk, split_messages};
use crate::published::Published;
use crate::{CoordError, Verdict};

/// What the task has learned.
#[derive(Debug, Default)]
struct State {
    published: Option<Published>,
    /// The topology key's mod revision (0: it does not exist yet).
    revision: i64,
    leader: Option<String>,
    leading: bool,
    /// This candidate's key in the election and its create revision
    /// (what a publication's compare holds on).
    candidate: Option<(String, i64)>,
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
    /// lead is lost); read again before deciding anything.
    pub async fn publish(&self, next: &Published) -> Result<bool, CoordError> {
        let (revision, seen, candidate) = {
            let s = self.state();
            (s.revision, s.published.clone(), s.candidate.clone())
        };
        if !next.supersedes(seen.as_ref()) {
            return Ok(false);
        }
        let Some((candidate, created)) = candidate else {
            return Ok(false);
        };
        let written = self
            .client
            .put_if_leader(
                &self.topology_key,
                &next.encode(),
                &candidate,
                created,
                revision,
            )
            .await?;
        match written {
            Some(rev) => {
                let mut s = self.state();
                s.last_heard = Some(Instant::now());
                if s.revision < rev {
                    s.revision = rev;
                    s.published = Some(next.clone());
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

    /// Reads the topology key and keeps it if its epoch is not lower.
    async fn read_topology(&self) -> Result<(), CoordError> {
        let kv = self.client.get(&self.topology_key).await?;
        self.take(kv);
        Ok(())
    }

    fn take(&self, kv: Option<Kv>) {
        let mut s = self.state();
        s.last_heard = Some(Instant::now());
        let Some(kv) = kv else {
            return;
        };
        if kv.mod_revision <= s.revision {
            return;
        }
        match Published::decode(&kv.value) {
            Ok(p) if p.supersedes(s.published.as_ref()) => {
                let changed = s.published.as_ref() != Some(&p);
                if changed {
                    tracing::info!(cluster = %self.cluster, epoch = p.epoch, primary = ?p.primary, stage = ?p.stage, by = %p.by, "published topology");
                }
                s.published = Some(p);
                s.revision = kv.mod_revision;
                drop(s);
                if changed {
                    self.bump();
                }
            }
            Ok(p) => {
                tracing::error!(cluster = %self.cluster, epoch = p.epoch, seen = s.published.as_ref().map_or(0, |s| s.epoch), "refusing a published topology with a lower epoch than one already seen");
            }
            Err(e) => {
                tracing::error!(cluster = %self.cluster, key = %self.topology_key, error = %e, "unreadable topology in etcd; keeping the last one");
            }
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
            s.candidate = (created > 0).then(|| (candidate_key(&self.leader_key, id), created));
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
                    let mut buffer = Vec::new();
                    while let Some(chunk) = next_chunk(&mut body).await {
                        let Ok(chunk) = chunk else { break };
                        buffer.extend_from_slice(&chunk);
                        for message in split_messages(&mut buffer) {
                            match watch_event(&message) {
                                Ok(Some(Some(kv))) => self.take(Some(kv)),
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
