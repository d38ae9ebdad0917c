//! SHOW CLUSTERS and SHOW BACKENDS: each backend of each cluster, its role,
//! state and lag, and its probe and pooled connections; SHOW FAILOVERS.

use bytes::BytesMut;

use super::protocol;
use crate::rows::result;
use crate::Admin;

impl Admin {
    /// SHOW CLUSTERS: a row per backend: role, state, lag, weight, whether
    /// disabled or paused, why failover is blocked; and the cluster's
    /// topology source, its epoch, its leader, whether this instance leads
    /// and how long ago the coordinator last answered (empty with `probe`).
    pub(super) fn show_clusters(&self, out: &mut BytesMut) {
        let mut rows = Vec::new();
        for c in &self.clusters() {
            let cfg = c.config();
            let blocked = c.view().failover_blocked().unwrap_or_default();
            let coord = c.view().coordination();
            let source = coord.as_ref().map_or(cfg.topology.name(), |s| s.source);
            let epoch = coord
                .as_ref()
                .map_or(String::new(), |s| s.epoch.to_string());
            let leader = coord
                .as_ref()
                .and_then(|s| s.leader.clone())
                .unwrap_or_default();
            let leads = coord
                .as_ref()
                .map_or(String::new(), |s| s.leading.to_string());
            let heard = coord
                .as_ref()
                .and_then(|s| s.last_heard)
                .map_or(String::new(), |t| {
                    format!("{:.3}", t.elapsed().as_secs_f64())
                });
            for (i, v) in c.view().backends().iter().enumerate() {
                let role = if c.router().is_primary(i) {
                    "primary"
                } else if v.writable == Some(true) {
                    "writable (not the primary)"
                } else {
                    "replica"
                };
                rows.push(vec![
                    cfg.name.clone(),
                    protocol(cfg),
                    v.address.clone(),
                    role.into(),
                    v.state.as_str().into(),
                    v.lag_bytes.to_string(),
                    format!("{:.3}", v.lag_time.as_secs_f64()),
                    cfg.backends[i].weight.to_string(),
                    c.router().is_disabled(i).to_string(),
                    c.router().is_paused().to_string(),
                    blocked.clone(),
                    source.into(),
                    epoch.clone(),
                    leader.clone(),
                    leads.clone(),
                    heard.clone(),
                ]);
            }
        }
        result(
            out,
            &[
                "cluster",
                "protocol",
                "backend",
                "role",
                "state",
                "lag_bytes",
                "lag_seconds",
                "weight",
                "disabled",
                "paused",
                "failover_blocked",
                "topology",
                "epoch",
                "leader",
                "leads",
                "coordinator_heard_seconds_ago",
            ],
            &rows,
        );
    }

    /// SHOW BACKENDS: a row per backend: role, state, the last probe, its pooled connections, and why it serves no reads.
    pub(super) fn show_backends(&self, out: &mut BytesMut) {
        let mut rows = Vec::new();
        for c in &self.clusters() {
            let pools = c.pools();
            for (i, v) in c.view().backends().iter().enumerate() {
                let mine = pools.iter().filter(|p| p.backend == v.address);
                let (active, idle) = mine.fold((0, 0), |(a, d), p| (a + p.active, d + p.idle));
                rows.push(vec![
                    c.config().name.clone(),
                    v.address.clone(),
                    if c.router().is_primary(i) {
                        "primary"
                    } else {
                        "replica"
                    }
                    .into(),
                    v.state.as_str().into(),
                    if v.probe_login_refused {
                        "login refused"
                    } else if v.last_error.is_some() {
                        "failing"
                    } else {
                        "ok"
                    }
                    .into(),
                    active.to_string(),
                    idle.to_string(),
                    v.last_error.clone().unwrap_or_default(),
                    crate::reason::reason(
                        v,
                        c.router().is_disabled(i),
                        c.config().health.max_lag.as_ref(),
                    ),
                ]);
            }
        }
        result(
            out,
            &[
                "cluster",
                "backend",
                "role",
                "state",
                "probe",
                "sv_active",
                "sv_idle",
                "last_error",
                "reason",
            ],
            &rows,
        );
    }

    /// SHOW FAILOVERS: each change of primary this instance saw (promoted
    /// by it or by anyone), oldest first, the last 20 per cluster.
    pub(super) fn show_failovers(&self, out: &mut BytesMut) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut rows = Vec::new();
        for c in &self.clusters() {
            for r in c.view().failover_log() {
                rows.push(vec![
                    c.config().name.clone(),
                    r.at_ms.to_string(),
                    format!("{:.1}", now.saturating_sub(r.at_ms) as f64 / 1000.0),
                    r.old,
                    r.new,
                ]);
            }
        }
        result(
            out,
            &[
                "cluster",
                "at_unix_ms",
                "seconds_ago",
                "old_primary",
                "new_primary",
            ],
            &rows,
        );
    }
}
