//! A cluster context's handle on its health loop, the same for every
//! protocol: starts the loop once, keeps its switchover handle for the admin
//! console, and stops it on shutdown or when the context is dropped (after a
//! reload, once its last client has left).

use std::sync::{Arc, OnceLock};

use fulcrum_config::Cluster;
use fulcrum_pool::Router;
use tokio::sync::watch;

use crate::monitor::{Monitor, MonitorSettings};
use crate::ops::ServerOps;
use crate::switchover::MonitorHandle;
use crate::view::ClusterView;

#[derive(Default)]
pub struct HealthLoop {
    monitor: OnceLock<MonitorHandle>,
    stop: OnceLock<Arc<watch::Sender<bool>>>,
    /// Turns true when the loop's task has ended (its last round done).
    finished: OnceLock<watch::Receiver<bool>>,
}

impl HealthLoop {
    /// Starts the loop for `config` with `ops`, until `shutdown` turns true
    /// or this handle is dropped.
    pub fn start<S: ServerOps>(
        &self,
        config: &Cluster,
        ops: Arc<S>,
        router: Arc<Router>,
        view: Arc<ClusterView>,
        mut shutdown: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let settings = MonitorSettings {
            cluster: config.name.clone(),
            health: config.health.clone(),
            roles: config.backends.iter().map(|b| b.role).collect(),
            replay: config.transaction_replay.is_some(),
            topology: config.topology.clone(),
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let authority =
            fulcrum_coordination::Authority::start(&config.name, &config.topology, stop_rx.clone());
        let monitor = Monitor::new(settings, ops, router, view).with_authority(authority);
        let _ = self.monitor.set(monitor.handle());
        let stop_tx = Arc::new(stop_tx);
        let _ = self.stop.set(stop_tx.clone());
        let forward = Arc::downgrade(&stop_tx);
        tokio::spawn(async move {
            let _ = shutdown.changed().await;
            if let Some(tx) = forward.upgrade() {
                let _ = tx.send(true);
            }
        });
        let task = monitor.spawn(stop_rx);
        let (done_tx, done_rx) = watch::channel(false);
        let _ = self.finished.set(done_rx);
        tokio::spawn(async move {
            let _ = task.await;
            let _ = done_tx.send(true);
        })
    }

    /// Stops the loop and waits (up to `within`) for its round in progress,
    /// a promotion included, to end: an upgrade's new process starts its
    /// own loop only after this one is over. False if it did not end in
    /// time.
    pub async fn stop_and_wait(&self, within: std::time::Duration) -> bool {
        self.stop();
        let Some(mut done) = self.finished.get().cloned() else {
            return true;
        };
        let ended = tokio::time::timeout(within, done.wait_for(|d| *d))
            .await
            .is_ok();
        ended
    }

    /// Stops the loop now: a reload started the cluster's next one, and a
    /// cluster has one health loop at a time.
    pub fn stop(&self) {
        if let Some(stop) = self.stop.get() {
            let _ = stop.send(true);
        }
    }

    /// Turns true when the loop stops (shutdown, a reload's next context,
    /// or this handle dropped): for the context's other background tasks.
    /// `None` before the loop started.
    pub fn stopped(&self) -> Option<watch::Receiver<bool>> {
        self.stop.get().map(|s| s.subscribe())
    }

    /// The running loop's handle (for SWITCHOVER), once started.
    pub fn handle(&self) -> Option<MonitorHandle> {
        self.monitor.get().cloned()
    }
}

impl Drop for HealthLoop {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.get() {
            let _ = stop.send(true);
        }
    }
}
