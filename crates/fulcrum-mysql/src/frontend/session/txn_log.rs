//! What the engine's transaction log (`transaction_replay`) is fed, in
//! MySQL's words: which command opens it (`BEGIN` / `START TRANSACTION`,
//! as a query or a prepared statement, outside a transaction), which
//! commands it keeps and which spoil it (new statement ids, files, another
//! user), where it closes (an answer outside a transaction), and whether
//! its last command (the client's own, when a replay of it is lost) may
//! commit.
//! `replay.rs` drives a replay of it.

use super::route::contains_ignore_case;
use super::*;
use crate::codec::command::Command;
use crate::codec::packet::Messages;

impl Session {
    /// A command about to be handled: `BEGIN` / `START TRANSACTION` outside
    /// a transaction opens the log; in it, every command is kept, and the
    /// ones whose replay would not give the same answer spoil it.
    pub(super) fn log_command(&mut self, cmd: Command, first: &[u8], msg: &[u8]) {
        if !self.engine.replay_on() || cmd == Command::Quit {
            return;
        }
        if !self.engine.log_open() {
            if self.in_transaction() || self.engine.pinned().is_some() {
                return;
            }
            // BEGIN as a query, or as a prepared statement (sysbench's
            // --db-ps-mode=auto prepares it).
            let text: Option<&[u8]> = match cmd {
                Command::Query => query_text(first),
                Command::StmtExecute => first
                    .get(1..5)
                    .map(|id| u32::from_le_bytes([id[0], id[1], id[2], id[3]]))
                    .and_then(|id| self.prepared.map.get(&id))
                    .map(|s| s.sql.as_bytes()),
                _ => None,
            };
            if !text.is_some_and(fulcrum_session::txn::begins) {
                return;
            }
            self.absorb_output();
            self.engine.txn_begun(self.client.output_position());
        }
        match cmd {
            // New statement ids, files, another user: not the same again.
            Command::StmtPrepare
            | Command::StmtClose
            | Command::StmtSendLongData
            | Command::ChangeUser
            | Command::ResetConnection => self.engine.log_spoiled(),
            Command::Query
                if query_text(first).is_some_and(|t| {
                    contains_ignore_case(&String::from_utf8_lossy(t), "local infile")
                }) =>
            {
                self.engine.log_spoiled()
            }
            _ => self.engine.logged(msg),
        }
    }

    /// After a command's answer: the log ends with the transaction.
    pub(super) fn log_answered(&mut self) {
        if self.txn.run.is_none() && self.engine.log_open() {
            if self.in_transaction() {
                self.engine.log_command_done(true);
            } else {
                self.engine.log_closed();
            }
        }
    }

    /// Whether the last command of `frames` (a replay's: the client's own
    /// command, waiting on it) may commit: a query whose text says so, or
    /// the execute of a statement prepared from one.
    pub(super) fn last_may_commit(&self, frames: &[u8]) -> bool {
        let max = self.ctx.config.max_message_size.min(usize::MAX as u64) as usize;
        let messages = Messages::new(BytesMut::from(frames), max.max(MAX_PAYLOAD));
        let Some((msg, span)) = messages.last() else {
            return false;
        };
        let first = &msg[HEADER_LEN..HEADER_LEN + span.payload_len.min(MAX_PAYLOAD)];
        match command(first) {
            Ok(Command::Query) => query_text(first).is_some_and(fulcrum_session::txn::may_commit),
            Ok(Command::StmtExecute | Command::StmtBulkExecute) => first
                .get(1..5)
                .map(|id| u32::from_le_bytes([id[0], id[1], id[2], id[3]]))
                .and_then(|id| self.prepared.map.get(&id))
                .is_some_and(|s| s.may_commit),
            _ => false,
        }
    }

    /// Feeds what was queued for the client to the transaction's checksum
    /// (before it is written).
    pub(super) fn absorb_output(&mut self) {
        fulcrum_cluster::replay::absorb_output(
            &mut self.engine,
            self.txn.run.is_some(),
            &self.client,
        );
    }
}
