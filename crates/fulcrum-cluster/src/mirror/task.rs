//! A lane's task: until the client's session ends (its sender drops), it
//! owns the client's connection to the target (opened at the first unit,
//! again after a failure, at most every `RETRY_AFTER` while the target
//! refuses), replays each unit, and records the diff by digest; the first
//! difference of a digest is logged with both sides.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::{Batch, Lane, MirrorProtocol, Target, Unit};

/// How long a target that refused a connection is left alone.
const RETRY_AFTER: Duration = Duration::from_secs(2);
/// How long one unit may take on the target before its connection is dropped.
const UNIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Starts a lane to `target` with `protocol`'s way there.
pub(super) fn start<P: MirrorProtocol>(
    target: Arc<Target>,
    protocol: P,
    cluster: String,
) -> Lane<P::Outcome> {
    let (tx, rx) = mpsc::channel(target.config.mirror_queue.max(1) as usize);
    let protocol = Arc::new(protocol);
    let counter = (protocol.clone(), target.clone());
    let dropped = Box::new(move |units: &[Unit<P::Outcome>]| {
        for u in units {
            let (key, text) = counter.0.digest(&u.frames, None);
            counter.1.stats.dropped(key, &|| text.clone(), 1);
        }
    });
    tokio::spawn(run(target.clone(), protocol, cluster, rx));
    Lane {
        target,
        tx,
        dropped,
        txn: Vec::new(),
        txn_bytes: 0,
        txn_writes: false,
        txn_over: false,
    }
}

async fn run<P: MirrorProtocol>(
    target: Arc<Target>,
    protocol: Arc<P>,
    cluster: String,
    mut rx: mpsc::Receiver<Batch<P::Outcome>>,
) {
    let mut conn: Option<P::Conn> = None;
    let mut down_until: Option<Instant> = None;
    let mut memory = P::Memory::default();
    let name = &target.config.name;
    while let Some(batch) = rx.recv().await {
        if conn.is_none() && down_until.is_none_or(|t| Instant::now() >= t) {
            match protocol.connect().await {
                Ok(c) => {
                    conn = Some(c);
                    down_until = None;
                    // A new connection knows none of the old one's statements.
                    memory = P::Memory::default();
                }
                Err(e) => {
                    tracing::debug!(cluster = %cluster, target = %name, error = %e, "mirror target refused a connection");
                    down_until = Some(Instant::now() + RETRY_AFTER);
                }
            }
        }
        for unit in &batch.units {
            let (key, text) = protocol.digest(&unit.frames, Some(&mut memory));
            let query = || text.clone();
            let Some(c) = conn.as_mut().filter(|_| !unit.skip) else {
                target.stats.dropped(key, &query, 1);
                continue;
            };
            let started = Instant::now();
            match tokio::time::timeout(UNIT_TIMEOUT, protocol.replay(c, unit, &mut memory)).await {
                Ok(Ok(outcome)) => {
                    let Some(primary) = unit.outcome else {
                        continue; // Fulcrum's own BEGIN: nothing to compare.
                    };
                    let mirror_us = started.elapsed().as_micros() as u64;
                    let differs = outcome != primary;
                    if target
                        .stats
                        .answered(key, &query, unit.primary_us, mirror_us, differs)
                    {
                        tracing::warn!(cluster = %cluster, target = %name, digest = %format!("{key:016x}"), query = %text, primary = %P::describe(&primary), mirror = %P::describe(&outcome), "mirror: the first answer of this digest that differs");
                    }
                }
                _ => {
                    tracing::debug!(cluster = %cluster, target = %name, "mirror connection lost or too slow; opened again at the next unit");
                    target.stats.dropped(key, &query, 1);
                    conn = None;
                }
            }
        }
        if let Some(done) = batch.done {
            let _ = done.send(());
        }
    }
}
