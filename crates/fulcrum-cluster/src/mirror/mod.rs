//! Mirroring (`[[cluster.mirror]]`), the part that is not about a
//! protocol's bytes: which clients are mirrored (`exposure`), each mirrored
//! client's lanes (one per target: the units of its open transaction, the
//! bounded queue to the lane's task, `sync` acknowledgements), whole
//! transactions sent or dropped whole, reads-only mirrors leaving writes
//! out, and the task that owns the client's connection to the target,
//! replays each unit and records the diff (`fulcrum_metrics::MirrorStats`).
//!
//! A protocol implements [`MirrorProtocol`]: connect to the target as the
//! client, replay one unit's raw frames and sum its answer up as an
//! outcome, and name a unit's digest. Its front end captures the client's
//! frames and the primary's outcome of each unit and hands finished units
//! to [`Lanes::finished`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fulcrum_config::{Mirror, MirrorMode};
use fulcrum_metrics::MirrorStats;
use tokio::sync::{mpsc, oneshot};

mod task;
mod writes;

pub use writes::{reads_only_takes, unit_may_write};

/// The longest a `sync` mirror may hold a client's answer per unit.
pub const SYNC_WAIT: Duration = Duration::from_secs(10);

/// What a protocol does for mirroring.
pub trait MirrorProtocol: Send + Sync + 'static {
    /// A connection to the target.
    type Conn: Send + 'static;
    /// What an answer amounts to, compared between the two sides.
    type Outcome: Copy + PartialEq + Send + Sync + std::fmt::Debug + 'static;
    /// What a lane remembers between units to name digests (statement
    /// names and their text) and to replay (statement ids).
    type Memory: Default + Send + 'static;

    /// Opens a connection to the target, as the client.
    fn connect(&self) -> impl Future<Output = Result<Self::Conn, String>> + Send;
    /// Replays a unit's frames and reads the whole answer.
    fn replay(
        &self,
        conn: &mut Self::Conn,
        unit: &Unit<Self::Outcome>,
        memory: &mut Self::Memory,
    ) -> impl Future<Output = std::io::Result<Self::Outcome>> + Send;
    /// The digest of a unit and its text (`memory`: what earlier units
    /// taught, `None` when counting a unit the lane never saw).
    fn digest(&self, frames: &[u8], memory: Option<&mut Self::Memory>) -> (u64, String);
    /// How an outcome reads in a log line.
    fn describe(outcome: &Self::Outcome) -> String;
}

/// One mirror target of a cluster and its diff.
pub struct Target {
    pub config: Mirror,
    pub stats: Arc<MirrorStats>,
}

/// A cluster's mirror targets.
#[derive(Default)]
pub struct Targets(Vec<Arc<Target>>);

impl Targets {
    pub fn new(config: &fulcrum_config::Cluster, metrics: &fulcrum_metrics::Metrics) -> Targets {
        let max = config.digests.max_entries.max(1) as usize;
        Targets(
            config
                .mirrors
                .iter()
                .map(|m| {
                    Arc::new(Target {
                        stats: Arc::new(MirrorStats::new(metrics, &config.name, &m.name, max)),
                        config: m.clone(),
                    })
                })
                .collect(),
        )
    }

    /// Each target's diff (SHOW MIRROR).
    pub fn stats(&self) -> Vec<Arc<MirrorStats>> {
        self.0.iter().map(|t| t.stats.clone()).collect()
    }

    /// A new client's lanes: for each target that draws it (`exposure`),
    /// the protocol's way there (`protocol(target)`; `None`: no login for
    /// this client there, so it is not mirrored there, logged and counted)
    /// and a task. `None`: not mirrored.
    pub fn for_client<P: MirrorProtocol>(
        &self,
        cluster: &str,
        mut protocol: impl FnMut(&Target) -> Option<P>,
    ) -> Option<Lanes<P::Outcome>> {
        let lanes: Vec<Lane<P::Outcome>> = self
            .0
            .iter()
            .filter(|t| t.config.exposure > 0.0 && draw() < t.config.exposure)
            .filter_map(|t| {
                let Some(p) = protocol(t) else {
                    // Never with another login's password: not mirrored.
                    tracing::debug!(cluster = %cluster, target = %t.config.name, "client not mirrored: the target lists no login for its user");
                    t.stats.skipped_no_login();
                    return None;
                };
                Some(task::start(t.clone(), p, cluster.to_owned()))
            })
            .collect();
        (!lanes.is_empty()).then_some(Lanes {
            lanes,
            acks: Vec::new(),
        })
    }
}

/// A number in [0, 1), different for each call (a client's draw).
fn draw() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// One unit as the mirror replays it.
#[derive(Debug, Clone)]
pub struct Unit<O> {
    /// The client's frames, as it sent them.
    pub frames: Bytes,
    /// The primary's answer (`None`: answered by Fulcrum, not compared).
    pub outcome: Option<O>,
    pub primary_us: u64,
    /// Cannot be replayed (COPY, LOAD DATA LOCAL): counted as dropped.
    pub skip: bool,
}

/// What a lane's task takes: units in order; `done` is told when they are
/// answered (`sync`).
pub(crate) struct Batch<O> {
    pub units: Vec<Unit<O>>,
    pub done: Option<oneshot::Sender<()>>,
}

/// Counts units a lane's task never saw as dropped, by digest.
pub(crate) type CountDropped<O> = Box<dyn Fn(&[Unit<O>]) + Send + Sync>;

/// A mirrored client's part in one target.
pub(crate) struct Lane<O> {
    target: Arc<Target>,
    tx: mpsc::Sender<Batch<O>>,
    /// Counts a unit the task never saw as dropped, by digest.
    dropped: CountDropped<O>,
    /// The units of the open transaction (async), their size, and whether
    /// one of them may write.
    txn: Vec<Unit<O>>,
    txn_bytes: u64,
    txn_writes: bool,
    /// The open transaction went past `mirror_max_transaction_bytes`: it
    /// was dropped, and the rest of it is counted, not kept.
    txn_over: bool,
}

/// A mirrored client's lanes, owned by its session.
pub struct Lanes<O> {
    lanes: Vec<Lane<O>>,
    /// `sync` mirrors still to answer before the client is.
    acks: Vec<oneshot::Receiver<()>>,
}

impl<O: Clone> Lanes<O> {
    /// A unit the primary answered: `writes` when it may write,
    /// `in_txn` when the client is in a transaction after it.
    pub fn finished(&mut self, unit: Unit<O>, writes: bool, in_txn: bool) {
        for lane in &mut self.lanes {
            let config = &lane.target.config;
            if config.mirror_mode == MirrorMode::Sync {
                if writes && !config.mirror_writes {
                    continue;
                }
                let (done, ack) = oneshot::channel();
                let batch = Batch {
                    units: vec![unit.clone()],
                    done: Some(done),
                };
                match lane.tx.try_send(batch) {
                    Ok(()) => self.acks.push(ack),
                    Err(e) => (lane.dropped)(&e.into_inner().units),
                }
                continue;
            }
            let reads_only = !config.mirror_writes;
            if lane.txn_over {
                // Past the bound: the rest of the transaction is counted only.
                (lane.dropped)(std::slice::from_ref(&unit));
            } else if reads_only && (writes || lane.txn_writes) {
                // A reads-only mirror: not its traffic; nothing of it is kept.
                lane.txn_writes = true;
                lane.txn.clear();
                lane.txn_bytes = 0;
            } else {
                lane.txn_writes |= writes;
                lane.txn_bytes += unit.frames.len() as u64;
                lane.txn.push(unit.clone());
                if lane.txn_bytes > config.mirror_max_transaction_bytes {
                    // Dropped whole, and freed now (not at its end).
                    (lane.dropped)(&std::mem::take(&mut lane.txn));
                    lane.txn_bytes = 0;
                    lane.txn_over = true;
                }
            }
            if in_txn {
                continue;
            }
            let units = std::mem::take(&mut lane.txn);
            let writes = std::mem::take(&mut lane.txn_writes);
            let over = std::mem::take(&mut lane.txn_over);
            lane.txn_bytes = 0;
            if over || units.is_empty() || (writes && reads_only) {
                continue;
            }
            if let Err(e) = lane.tx.try_send(Batch { units, done: None }) {
                // The queue is full (or the task gone): the transaction is
                // dropped whole, and counted.
                (lane.dropped)(&e.into_inner().units);
            }
        }
    }

    /// Whether a `sync` mirror still owes an answer.
    pub fn waiting(&self) -> bool {
        !self.acks.is_empty()
    }

    /// Waits (at most `SYNC_WAIT` each) for the `sync` mirrors.
    pub async fn wait(&mut self) {
        for ack in std::mem::take(&mut self.acks) {
            let _ = tokio::time::timeout(SYNC_WAIT, ack).await;
        }
    }

    /// The client's server was lost under its transaction (replayed or
    /// failed elsewhere): that transaction and `in_flight` are not
    /// mirrored, and are counted as dropped.
    pub fn abandon(&mut self, in_flight: &[Unit<O>]) {
        for lane in &mut self.lanes {
            let mut units = std::mem::take(&mut lane.txn);
            units.extend_from_slice(in_flight);
            lane.txn_bytes = 0;
            lane.txn_writes = false;
            lane.txn_over = false;
            (lane.dropped)(&units);
        }
    }
}
