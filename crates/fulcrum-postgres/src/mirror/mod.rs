//! Mirroring (`[[cluster.mirror]]`): a mirrored client's units of work are
//! replayed, in its order, on a connection of its own to each target, and
//! their answers compared with the primary's (`fulcrum_metrics::MirrorStats`,
//! SHOW MIRROR).
//!
//! The session owns a `ClientMirror`: the client's own frames of each unit
//! (a Query, or extended-protocol messages up to Sync, as the client sent
//! them: statement names, SETs and all, so the target's connection carries
//! the client's session state), the outcome of the primary's answer, and
//! per target the units of the open transaction. A transaction goes to the
//! target whole when it ends (`async`: dropped whole, and counted, when
//! the queue is full) or unit by unit, the client's next answer waiting
//! for the mirror (`sync`). Each target's task (`lane.rs`) owns the
//! connection and the diff.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use fulcrum_config::{Mirror, MirrorMode};
use fulcrum_metrics::MirrorStats;
use tokio::sync::{mpsc, oneshot};

use crate::codec::frontend_msg::put_query;
use crate::frontend::context::ClusterContext;

mod lane;
mod outcome;

pub use outcome::Outcome;

/// The longest a `sync` mirror may hold a client's answer per unit.
pub const SYNC_WAIT: Duration = Duration::from_secs(10);
/// A transaction larger than this (client bytes) is not kept for a mirror.
const TXN_BYTES_MAX: usize = 1 << 20;

/// One mirror target of a cluster and its diff.
pub struct Target {
    pub config: Mirror,
    pub stats: Arc<MirrorStats>,
}

/// A cluster's mirror targets.
#[derive(Default)]
pub struct Targets(Vec<Arc<Target>>);

impl Targets {
    pub fn new(
        ctx_config: &fulcrum_config::Cluster,
        metrics: &fulcrum_metrics::Metrics,
    ) -> Targets {
        let max = ctx_config.digests.max_entries.max(1) as usize;
        Targets(
            ctx_config
                .mirrors
                .iter()
                .map(|m| {
                    Arc::new(Target {
                        stats: Arc::new(MirrorStats::new(metrics, &ctx_config.name, &m.name, max)),
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

    /// A new client's mirror: for each target that picks it (`exposure`),
    /// a lane with its task and connection. `None`: not mirrored.
    pub fn for_client(
        ctx: &Arc<ClusterContext>,
        user: &str,
        database: &str,
    ) -> Option<Box<ClientMirror>> {
        let lanes: Vec<Lane> = ctx
            .mirrors
            .0
            .iter()
            .filter(|t| t.config.exposure > 0.0 && rand::random::<f64>() < t.config.exposure)
            .filter_map(|t| lane::start(ctx, t, user, database))
            .collect();
        (!lanes.is_empty()).then(|| {
            Box::new(ClientMirror {
                lanes,
                frames: BytesMut::new(),
                writes: false,
                pending: VecDeque::new(),
                outcome: Outcome::default(),
                skip: false,
                acks: Vec::new(),
            })
        })
    }
}

/// One unit as the mirror replays it.
#[derive(Clone)]
pub struct Unit {
    /// The client's frames.
    pub frames: Bytes,
    /// The primary's answer (`None`: answered by Fulcrum, not compared).
    pub outcome: Option<Outcome>,
    pub primary_us: u64,
    /// Cannot be replayed (COPY): counted as dropped.
    pub skip: bool,
}

/// What a target's task takes: units in order; `done` is told when they
/// are answered (`sync`).
pub struct Batch {
    pub units: Vec<Unit>,
    pub done: Option<oneshot::Sender<()>>,
}

/// A mirrored client's part, per target.
pub struct Lane {
    target: Arc<Target>,
    tx: mpsc::Sender<Batch>,
    /// The units of the open transaction (async), and its size.
    txn: Vec<Unit>,
    txn_bytes: usize,
    /// A unit of the open transaction may write (reads-only mirrors skip it).
    txn_writes: bool,
}

/// A unit sent to the primary whose answer has not ended yet.
struct Pending {
    frames: Bytes,
    writes: bool,
    started: Instant,
    /// Answered by Fulcrum (a deferred BEGIN sent with the next unit): no
    /// ReadyForQuery of its own comes back.
    local: bool,
}

pub struct ClientMirror {
    lanes: Vec<Lane>,
    /// The client's frames of the unit being sent.
    frames: BytesMut,
    /// The unit being sent may write.
    writes: bool,
    pending: VecDeque<Pending>,
    /// The primary's answer to the unit at the front of `pending`, so far.
    outcome: Outcome,
    skip: bool,
    /// `sync` mirrors still to answer before the client is.
    acks: Vec<oneshot::Receiver<()>>,
}

impl ClientMirror {
    /// A client frame on its way to the server (only the client's own: what
    /// Fulcrum answers itself never comes here).
    pub fn client_frame(&mut self, tag: u8, frame: &[u8]) {
        match tag {
            // COPY data: the unit is not replayed (see `server_frame`).
            b'd' | b'c' | b'f' | b'X' => {}
            b'Q' | b'S' | b'F' => {
                self.frames.extend_from_slice(frame);
                self.pending.push_back(Pending {
                    frames: self.frames.split().freeze(),
                    writes: std::mem::take(&mut self.writes),
                    started: Instant::now(),
                    local: false,
                });
            }
            _ => self.frames.extend_from_slice(frame),
        }
    }

    /// The unit being routed may write (its statements' decision).
    pub fn unit_writes(&mut self, writes: bool) {
        self.writes |= writes;
    }

    /// A deferred `BEGIN` Fulcrum sends ahead of the unit.
    pub fn begin(&mut self, sql: &str) {
        let mut frame = BytesMut::new();
        put_query(&mut frame, sql);
        self.pending.push_back(Pending {
            frames: frame.freeze(),
            writes: false,
            started: Instant::now(),
            local: true,
        });
    }

    /// A large DataRow streaming through: its first bytes and length.
    pub fn server_row(&mut self, start: &[u8], len: usize) {
        self.outcome.row(start, len);
    }

    /// A server message forwarded to the client (`body` after the header).
    pub fn server_frame(&mut self, tag: u8, body: &[u8]) {
        match tag {
            b'G' | b'H' | b'W' => self.skip = true,
            b'Z' => {
                let status = body.first().copied().unwrap_or(b'I');
                while self.pending.front().is_some_and(|p| p.local) {
                    let p = self.pending.pop_front().expect("a pending unit");
                    let unit = Unit {
                        frames: p.frames,
                        outcome: None,
                        primary_us: 0,
                        skip: false,
                    };
                    self.finished(unit, p.writes, b'T');
                }
                let Some(p) = self.pending.pop_front() else {
                    return;
                };
                let unit = Unit {
                    frames: p.frames,
                    outcome: Some(std::mem::take(&mut self.outcome)),
                    primary_us: p.started.elapsed().as_micros() as u64,
                    skip: std::mem::take(&mut self.skip),
                };
                self.finished(unit, p.writes, status);
            }
            _ => self.outcome.observe(tag, body),
        }
    }

    /// A unit the primary answered; the transaction status after it.
    fn finished(&mut self, unit: Unit, writes: bool, status: u8) {
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
                    Err(e) => lane::dropped_units(&lane.target, &e.into_inner().units),
                }
                continue;
            }
            lane.txn_writes |= writes;
            lane.txn_bytes += unit.frames.len();
            lane.txn.push(unit.clone());
            if status != b'I' {
                continue;
            }
            let units = std::mem::take(&mut lane.txn);
            let (writes, bytes) = (lane.txn_writes, lane.txn_bytes);
            lane.txn_writes = false;
            lane.txn_bytes = 0;
            if writes && !config.mirror_writes {
                continue; // A reads-only mirror: not its traffic.
            }
            if bytes > TXN_BYTES_MAX {
                lane::dropped_units(&lane.target, &units);
                continue;
            }
            if let Err(e) = lane.tx.try_send(Batch { units, done: None }) {
                // The queue is full (or the task gone): the transaction is
                // dropped whole, and counted.
                lane::dropped_units(&lane.target, &e.into_inner().units);
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

    /// The server connection was lost (its units are replayed or failed
    /// elsewhere): what was in flight is not mirrored.
    pub fn abandon(&mut self) {
        let mut units: Vec<Unit> = self
            .pending
            .drain(..)
            .map(|p| Unit {
                frames: p.frames,
                outcome: None,
                primary_us: 0,
                skip: true,
            })
            .collect();
        self.frames.clear();
        self.outcome = Outcome::default();
        self.skip = false;
        for lane in &mut self.lanes {
            let mut txn = std::mem::take(&mut lane.txn);
            txn.append(&mut units.clone());
            lane.txn_bytes = 0;
            lane.txn_writes = false;
            lane::dropped_units(&lane.target, &txn);
        }
        units.clear();
    }
}
