//! The open transaction's log (`transaction_replay`) as the engine keeps
//! it: the front ends tell it what happened (a transaction begun, a client
//! message sent, a command done, output queued for the client, the log
//! spoiled or closed, a replay started, restarted or matched) through
//! these methods, and ask it through the read-only ones (`replay_on`,
//! `log_open`, `replayable_log`, `log_state`); they never reach the
//! [`TxnLog`] itself. The ones a unit's bytes pass through are `#[inline]`
//! forwards: no work is added per message.

use super::Engine;
use crate::replay::{Framing, Replay, TxnLog};

impl Engine {
    /// The engine with `log` as its transaction log (`transaction_replay`).
    pub fn with_txn_log(mut self, log: TxnLog) -> Engine {
        self.txn_log = log;
        self
    }

    /// Takes the transaction log (its limits), leaving replay off: for an
    /// engine made anew for the same client (MySQL's change of user).
    pub fn take_txn_log(&mut self) -> TxnLog {
        std::mem::replace(&mut self.txn_log, TxnLog::new(None, Framing::Whole))
    }

    /// `transaction_replay` is on for this client (it has a log).
    #[inline]
    pub fn replay_on(&self) -> bool {
        self.txn_log.enabled()
    }

    /// A transaction (or the unit that may open one) is being logged.
    #[inline]
    pub fn log_open(&self) -> bool {
        self.txn_log.is_open()
    }

    /// The open transaction's log can be replayed: logged whole from the
    /// statement that began it.
    pub fn replayable_log(&self) -> bool {
        self.txn_log.replayable()
    }

    /// The log's state, for log lines (`closed`, `open`, `spoiled`, ...).
    pub fn log_state(&self) -> &'static str {
        self.txn_log.describe()
    }

    /// A unit that starts with `BEGIN`, with nothing in flight, goes to the
    /// server: the transaction is logged from `position` (the client's
    /// output position now), its first statement the BEGIN.
    pub fn txn_begun(&mut self, position: u64) {
        self.txn_log.open(position, None);
        self.txn_log.opens_with_begin();
    }

    /// The deferred `BEGIN` (`sql`) goes ahead of the transaction's first
    /// statement: the transaction is logged from `position`, with it.
    pub fn deferred_begin_sent(&mut self, position: u64, sql: String) {
        self.txn_log.open(position, Some(sql));
    }

    /// A client message of the logged transaction was sent to its server.
    #[inline]
    pub fn logged(&mut self, frame: &[u8]) {
        self.txn_log.record(frame);
    }

    /// A command of the logged transaction completed; `began`: it was the
    /// transaction's start (only a log whose first command began the
    /// transaction is replayable).
    #[inline]
    pub fn log_command_done(&mut self, began: bool) {
        self.txn_log.command_done(began);
    }

    /// Something in the transaction cannot be replayed (COPY, a file, a
    /// new statement id, an answer from the cache, ...): not replayable
    /// until it ends.
    pub fn log_spoiled(&mut self) {
        self.txn_log.spoil();
    }

    /// The logged transaction ended (committed, rolled back, resolved, or
    /// its replay failed): nothing is logged until the next one begins.
    pub fn log_closed(&mut self) {
        self.txn_log.close();
    }

    /// Output was queued for the client up to `position`
    /// (`Connection::output_position`; `write_buf`, what is still queued):
    /// it is fed to the transaction's checksum before it can be written.
    #[inline]
    pub fn output_absorbed(&mut self, write_buf: &[u8], position: u64) {
        self.txn_log.absorb(write_buf, position);
    }

    /// The transaction's server was lost and it is replayed: what to send
    /// again and what the client must be seen to have received. The log
    /// starts over at `position`, so the replayed messages are logged again.
    pub fn replay_started(&mut self, position: u64) -> Replay {
        self.txn_log.start_replay(position)
    }

    /// The replay's own server was lost: the log starts over at
    /// `position` for the next attempt (`started`: it starts with the
    /// transaction already begun).
    pub fn replay_restarted(&mut self, position: u64, replay: &Replay, started: bool) {
        self.txn_log.restart(position, replay, started);
    }

    /// The replay matched: the client's output so far is what it replayed.
    pub fn replay_matched(&mut self, replay: &Replay) {
        self.txn_log.replayed(replay);
    }
}

#[cfg(test)]
mod tests {
    use crate::replay::{Framing, TxnLog};
    use crate::state::Engine;

    #[test]
    fn a_begun_transaction_is_replayable_until_spoiled_and_the_log_survives_a_new_engine() {
        let mut engine = Engine::new(None).with_txn_log(TxnLog::new(Some(1024), Framing::Whole));
        assert!(engine.replay_on() && !engine.log_open());
        engine.txn_begun(0);
        engine.logged(b"BEGIN");
        assert!(engine.log_open() && engine.replayable_log());
        engine.log_command_done(true);
        assert_eq!(engine.log_state(), "open");
        engine.log_spoiled();
        assert!(engine.log_open() && !engine.replayable_log());
        engine.log_closed();
        assert!(!engine.log_open());
        let log = engine.take_txn_log();
        assert!(!engine.replay_on());
        assert!(Engine::new(None).with_txn_log(log).replay_on());
    }

    #[test]
    fn a_replay_logs_the_transaction_anew() {
        let mut engine = Engine::new(None).with_txn_log(TxnLog::new(Some(1024), Framing::Whole));
        engine.deferred_begin_sent(0, "BEGIN".into());
        engine.logged(b"\x03SELECT 1");
        engine.output_absorbed(b"answer", 6);
        let replay = engine.replay_started(6);
        assert_eq!(replay.frames, b"\x03SELECT 1");
        assert_eq!(replay.begin.as_deref(), Some("BEGIN"));
        assert!(engine.replayable_log());
        engine.replay_restarted(6, &replay, true);
        engine.replay_matched(&replay);
        assert!(engine.replayable_log());
    }
}
