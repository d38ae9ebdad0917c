//! Mirroring (`[[cluster.mirror]]`), PostgreSQL's capture: the client's
//! own frames of each unit (a Query, or extended-protocol messages up to
//! Sync, as the client sent them: statement names, SETs and all, so the
//! target's connection carries the client's session state) and the outcome
//! of the primary's answer. Finished units go to the client's lanes
//! (`fulcrum_cluster::mirror`, which owns whole transactions, queues,
//! `sync` and the diff); replaying them is `protocol.rs`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use fulcrum_cluster::mirror::{Lanes, Unit};

use crate::codec::frontend_msg::put_query;
use crate::frontend::context::ClusterContext;

mod outcome;
mod protocol;

pub use outcome::Outcome;
pub use protocol::PgMirror;

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
    lanes: Lanes<Outcome>,
    /// The client's frames of the unit being sent.
    frames: BytesMut,
    /// The unit being sent may write.
    writes: bool,
    pending: VecDeque<Pending>,
    /// The primary's answer to the unit at the front of `pending`, so far.
    outcome: Outcome,
    skip: bool,
}

impl ClientMirror {
    /// A new client's mirror, when a target draws it (`exposure`).
    pub fn for_client(
        ctx: &Arc<ClusterContext>,
        user: &str,
        database: &str,
        startup: &crate::backend::conn::SessionParams,
    ) -> Option<Box<Self>> {
        let lanes = ctx.mirrors.for_client(ctx.name(), |t| {
            PgMirror::new(ctx, t, user, database, startup)
        })?;
        Some(Box::new(ClientMirror {
            lanes,
            frames: BytesMut::new(),
            writes: false,
            pending: VecDeque::new(),
            outcome: Outcome::default(),
            skip: false,
        }))
    }

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

    /// The unit just captured was answered by Fulcrum (a DEALLOCATE of a
    /// statement it maps): it is replayed, not compared, and waits for no
    /// ReadyForQuery of the server's.
    pub fn answered_locally(&mut self) {
        if let Some(p) = self.pending.back_mut() {
            p.local = true;
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
                let in_txn = body.first().is_some_and(|&s| s != b'I');
                while let Some(p) = self.pending.pop_front() {
                    if !p.local {
                        self.pending.push_front(p);
                        break;
                    }
                    let unit = Unit {
                        frames: p.frames,
                        outcome: None,
                        primary_us: 0,
                        skip: false,
                    };
                    self.lanes.finished(unit, false, true);
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
                self.lanes.finished(unit, p.writes, in_txn);
            }
            _ => self.outcome.observe(tag, body),
        }
    }

    /// Whether a `sync` mirror still owes an answer.
    pub fn waiting(&self) -> bool {
        self.lanes.waiting()
    }

    /// Waits for the `sync` mirrors.
    pub async fn wait(&mut self) {
        self.lanes.wait().await
    }

    /// The server connection was lost (its units are replayed or failed
    /// elsewhere): what was in flight is not mirrored.
    pub fn abandon(&mut self) {
        let in_flight: Vec<Unit<Outcome>> = self
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
        self.lanes.abandon(&in_flight);
    }
}
