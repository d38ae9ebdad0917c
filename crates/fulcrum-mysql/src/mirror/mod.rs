//! Mirroring (`[[cluster.mirror]]`), MySQL's capture: each command the
//! client sends to a server (COM_QUERY, COM_INIT_DB, COM_FIELD_LIST,
//! COM_STATISTICS: as the client sent it), with the outcome of the
//! primary's answer, goes to the client's lanes (`fulcrum_cluster::mirror`,
//! which owns whole transactions, queues, `sync` and the diff); replaying
//! them is `protocol.rs`. A prepared statement's execute is mirrored by its
//! text (the target's connection prepares it once, under its own id); a
//! cursor's fetches and COM_STMT_SEND_LONG_DATA are not mirrored.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use fulcrum_cluster::mirror::{Lanes, Unit};
use mysql_common::constants::CapabilityFlags as C;

use crate::codec::packet::HEADER_LEN;
use crate::frontend::context::MyClusterContext;
use crate::frontend::reply::Reply;

mod outcome;
mod protocol;

pub use outcome::Outcome;
pub use protocol::MyMirror;

pub struct ClientMirror {
    lanes: Lanes<Outcome>,
    /// The primary's answer to the command in flight, so far.
    outcome: Outcome,
    /// What the next answered command is mirrored as, when not as sent.
    next: Option<Next>,
    /// The command being routed may write (its statements' decisions,
    /// `unit_writes`); until told, a command counts as one that may.
    writes: bool,
}

/// The next command's mirror, when not the message the server got.
enum Next {
    /// A prepared statement's execute: by text (`protocol::by_text`).
    Frames(Bytes),
    /// Not mirrored (COM_STMT_RESET, a cursor's fetch).
    Ignore,
}

impl ClientMirror {
    /// A new client's mirror, when a target draws it (`exposure`).
    pub fn for_client(
        ctx: &Arc<MyClusterContext>,
        user: &str,
        schema: Option<&str>,
        wire_format: C,
        charset: u8,
    ) -> Option<Box<Self>> {
        let lanes = ctx.mirrors.for_client(ctx.name(), |t| {
            MyMirror::new(ctx, t, user, schema, wire_format, charset)
        })?;
        Some(Box::new(ClientMirror {
            lanes,
            outcome: Outcome::default(),
            next: None,
            writes: true,
        }))
    }

    /// The next command is COM_STMT_EXECUTE `body` (the client's, its
    /// parameter types bound) of the statement `sql`: mirrored by text, the
    /// target preparing it under its own id.
    pub fn execute(&mut self, sql: &str, body: &[u8]) {
        self.next = Some(Next::Frames(protocol::by_text(sql, body)));
    }

    /// Whether the command being routed may write, judged by the
    /// classifier's decisions (`fulcrum_cluster::mirror::unit_may_write`):
    /// a reads-only mirror leaves it out (with its whole transaction).
    pub fn unit_writes(&mut self, writes: bool) {
        self.writes = writes;
    }

    /// The next command is not mirrored.
    pub fn ignore_next(&mut self) {
        self.next = Some(Next::Ignore);
    }

    /// A row packet of the primary's answer.
    pub fn row(&mut self, payload: &[u8]) {
        self.outcome.row(payload);
    }

    /// The primary answered `command` (the client's message, headers
    /// included), sent at `started`.
    pub fn answered(&mut self, command: &[u8], reply: &Reply, started: Instant, skip: bool) {
        let mut outcome = std::mem::take(&mut self.outcome);
        // COM_INIT_DB moves session state, COM_FIELD_LIST and
        // COM_STATISTICS only read; a statement is judged by its decisions.
        let writes = std::mem::replace(&mut self.writes, true)
            && !matches!(command.get(HEADER_LEN), Some(0x02 | 0x04 | 0x09));
        let frames = match self.next.take() {
            Some(Next::Ignore) => return,
            Some(Next::Frames(f)) => f,
            None => Bytes::copy_from_slice(command),
        };
        outcome.end(reply);
        let in_txn = reply.status.is_some_and(|s| {
            s.contains(mysql_common::constants::StatusFlags::SERVER_STATUS_IN_TRANS)
        });
        let unit = Unit {
            frames,
            outcome: Some(outcome),
            primary_us: started.elapsed().as_micros() as u64,
            skip,
        };
        self.lanes.finished(unit, writes, in_txn);
    }

    /// Whether a `sync` mirror still owes an answer.
    pub fn waiting(&self) -> bool {
        self.lanes.waiting()
    }

    /// Waits for the `sync` mirrors.
    pub async fn wait(&mut self) {
        self.lanes.wait().await
    }

    /// The server was lost under the client: its transaction is not mirrored.
    pub fn abandon(&mut self) {
        self.outcome = Outcome::default();
        self.next = None;
        self.writes = true;
        self.lanes.abandon(&[]);
    }
}
