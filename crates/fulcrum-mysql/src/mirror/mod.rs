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

use crate::frontend::context::MyClusterContext;
use crate::frontend::reply::Reply;

mod outcome;
mod protocol;

pub use outcome::Outcome;
pub use protocol::MyMirror;

/// A command that only moves session state or transaction control (`SET`,
/// `USE`, `BEGIN`, `COMMIT`, ...; COM_INIT_DB): a reads-only mirror takes
/// it, since its connection needs it.
pub fn session_only(command: &[u8]) -> bool {
    const WORDS: [&[u8]; 9] = [
        b"set",
        b"use",
        b"begin",
        b"start",
        b"commit",
        b"rollback",
        b"savepoint",
        b"release",
        b"xa",
    ];
    match command
        .get(crate::codec::packet::HEADER_LEN..)
        .and_then(|p| p.split_first())
    {
        Some((0x02, _)) => true,
        // A COM_QUERY, or a prepared statement's execute mirrored by text.
        Some((0x03 | 0x16, text)) => {
            let first = fulcrum_sql::statements::first_word(text);
            WORDS.iter().any(|w| first.eq_ignore_ascii_case(w))
        }
        _ => false,
    }
}

pub struct ClientMirror {
    lanes: Lanes<Outcome>,
    /// The primary's answer to the command in flight, so far.
    outcome: Outcome,
    /// What the next answered command is mirrored as, when not as sent.
    next: Option<Next>,
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
        }))
    }

    /// The next command is COM_STMT_EXECUTE `body` (the client's, its
    /// parameter types bound) of the statement `sql`: mirrored by text, the
    /// target preparing it under its own id.
    pub fn execute(&mut self, sql: &str, body: &[u8]) {
        self.next = Some(Next::Frames(protocol::by_text(sql, body)));
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
    /// included), sent at `started`; `writes` when its route may write
    /// (session state and transaction control are a reads-only mirror's
    /// too).
    pub fn answered(
        &mut self,
        command: &[u8],
        reply: &Reply,
        writes: bool,
        started: Instant,
        skip: bool,
    ) {
        let mut outcome = std::mem::take(&mut self.outcome);
        let frames = match self.next.take() {
            Some(Next::Ignore) => return,
            Some(Next::Frames(f)) => f,
            None => Bytes::copy_from_slice(command),
        };
        outcome.end(reply);
        let writes = writes && !session_only(&frames);
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
        self.lanes.abandon(&[]);
    }
}
