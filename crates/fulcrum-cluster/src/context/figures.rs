//! The core's figures for a metrics scrape: per backend its state, role,
//! lag and pooled connections; the cluster's failovers, classifier
//! counters and top statement digests.

use fulcrum_metrics::{BackendFigures, ClusterFigures, Metrics};
use fulcrum_pool::Poolable;

use super::{ClusterCore, PoolScope};

impl<C: Poolable, P, S: PoolScope> ClusterCore<C, P, S> {
    /// Sets this cluster's gauges in `metrics`; `prepared_statements` is
    /// the protocol's count of them, where it keeps one.
    pub fn refresh_metrics(&self, metrics: &Metrics, prepared_statements: Option<usize>) {
        let (active, idle) = self.pool_totals();
        let view = self.view.backends();
        let c = self.classifier.stats();
        let coordination = self.view.coordination();
        metrics.set_cluster(&ClusterFigures {
            cluster: &self.config.name,
            backends: view
                .iter()
                .enumerate()
                .map(|(b, v)| BackendFigures {
                    address: &v.address,
                    state: v.state.as_str(),
                    primary: self.router.is_primary(b),
                    lag_bytes: v.lag_bytes,
                    lag_time: v.lag_time,
                    active: active[b],
                    idle: idle[b],
                    probe_login_refused: v.probe_login_refused,
                })
                .collect(),
            failovers: self.view.failovers(),
            failover_blocked: self.view.failover_blocked().is_some(),
            classifier_hits: c.hits,
            classifier_misses: c.misses,
            unparsed: c.unparsed,
            oversized: c.oversized,
            digests: match self.config.digests.metrics_top {
                0 => Vec::new(),
                n => self.digest_table().top(n as usize),
            },
            prepared_statements,
            coordination: coordination
                .as_ref()
                .map(|k| fulcrum_metrics::CoordinationFigures {
                    source: k.source,
                    epoch: k.epoch,
                    leading: k.leading,
                    heard_ago: k.last_heard.map(|t| t.elapsed().as_secs_f64()),
                    cut_off: k.cut_off,
                }),
        });
    }
}
