//! What the engine's transaction log (`transaction_replay`) is fed, in
//! PostgreSQL's words: which unit opens it (one that starts with `BEGIN`
//! and nothing in flight), which client frames it keeps and which spoil it
//! (COPY, function calls), which server frames end a command, and where
//! it closes (`ReadyForQuery` idle). `replay.rs` drives a replay of it.

use super::*;

/// A server frame on the logged transaction: its first command must be
/// the transaction's start; COPY spoils it.
pub(super) fn log_server_frame(engine: &mut Engine, tag: u8, body: &[u8]) {
    match tag {
        b'C' => {
            let t = command_tag(body);
            engine.log_command_done(t == b"BEGIN" || t == b"START TRANSACTION");
        }
        b'E' => engine.log_command_done(false),
        b'G' | b'H' | b'W' => engine.log_spoiled(),
        _ => {}
    }
}

impl Session {
    /// The open transaction can be replayed if its server dies now (not
    /// failed, no COPY streaming, no replay of it already under way).
    pub(super) fn replayable(&self) -> bool {
        let extra = self.engine.status() != Status::Failed && self.owed.stream_left == 0;
        fulcrum_cluster::replay::replayable(self.txn.run.as_deref(), &self.engine, extra)
    }

    /// Feeds what was queued for the client since the last call to the
    /// transaction's checksum (before it can be written).
    pub(super) fn absorb_output(&mut self) {
        fulcrum_cluster::replay::absorb_output(
            &mut self.engine,
            self.txn.run.is_some(),
            &self.client,
        );
    }

    /// Before a client frame goes to the server: a unit that starts with
    /// `BEGIN` with nothing in flight opens the log; every frame of the
    /// transaction is kept.
    pub(super) fn log_client_frame(&mut self, tag: u8, frame: &[u8]) {
        if !self.engine.replay_on() {
            return;
        }
        if !self.engine.log_open() {
            // Only a unit that starts with BEGIN can be replayed: any other
            // (an autocommit statement) is not copied at all.
            if self.engine.status() != Status::Idle
                || self.owed.ready > 0
                || self.owed.unsynced
                || !self.stmts.rewrite
                || self.engine.pinned().is_some()
                || !self.begins_transaction(tag, frame)
            {
                return;
            }
            self.engine.txn_begun(self.client.output_position());
        }
        match tag {
            // COPY and function calls (large objects) are never replayed.
            b'd' | b'c' | b'f' | b'F' => self.engine.log_spoiled(),
            _ => self.engine.logged(frame),
        }
    }

    /// ReadyForQuery: the log ends with the transaction. One that ends with
    /// more work pipelined behind it cannot be told apart from the next.
    pub(super) fn log_ready(&mut self, status: u8) {
        if status == b'I' && self.engine.log_open() && self.txn.run.is_none() {
            if self.owed.ready == 0 {
                self.engine.log_closed();
            } else {
                self.engine.log_spoiled();
            }
        }
    }

    /// The frame runs (or prepares) a statement that starts a transaction.
    fn begins_transaction(&self, tag: u8, frame: &[u8]) -> bool {
        let body = &frame[5..];
        let text: Option<&[u8]> = match tag {
            b'Q' => query_text(body),
            b'P' => parse_msg(body).map(|p| p.query),
            b'B' => bind_msg(body)
                .filter(|b| !b.statement.is_empty())
                .and_then(|b| self.stmts.map.get(b.statement))
                .map(|s| &s.query[..]),
            _ => None,
        };
        text.is_some_and(fulcrum_session::txn::begins)
    }
}
