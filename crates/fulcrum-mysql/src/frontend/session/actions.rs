//! Carrying out what the engine asks. Every `Actions` a step returns goes
//! through [`Session::carry_out`] (where an action may wait: attach, clean
//! the connection; retry and replay hand the command back to its caller as
//! `SessionError::Retry` / `Replay`) or [`Session::carry_out_now`] (events
//! whose actions need no waiting), and each matches every `Action` variant:
//! a new action does not compile until this front end performs it. An
//! action an event cannot lead to is reported (`unexpected`), never
//! dropped unread.

use fulcrum_session::{Action, Actions, Ending, Outcome};

use super::*;

/// What is left to the caller once the engine's actions are carried out:
/// MySQL answers a command whose server was lost with one ERR, whose words
/// the caller chooses (`lost`, a failed replay).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Carried {
    /// Everything asked was done.
    Done,
    /// `Fail`: the command in flight is answered with this outcome.
    Failed(Outcome),
    /// `Close(StateLost)`: the transaction or session state is gone; the
    /// command is answered and the session ends.
    StateLost,
}

impl Carried {
    /// Both of two results: an answer owed is kept.
    fn and(self, other: Carried) -> Carried {
        if other == Carried::Done {
            self
        } else {
            other
        }
    }
}

impl Session {
    /// Carries out `actions` in order, waiting where an action needs it;
    /// `seq` is the sequence id of the answer to the command in flight.
    pub(super) async fn carry_out(
        &mut self,
        actions: Actions,
        seq: u8,
    ) -> Result<Carried, SessionError> {
        let mut carried = Carried::Done;
        for action in actions {
            match action {
                // A client holding its connection keeps it.
                Action::Attach(route) if self.server.is_none() => {
                    self.check_out(route, seq).await?
                }
                Action::Attach(_) => {}
                Action::Retry => {
                    tracing::warn!(server = %self.ctx.address(self.backend), "server connection lost before it answered a read");
                    let _ = self.engine.retry_elsewhere(self.backend);
                    self.client.write_buf.clear();
                    return Err(SessionError::Retry);
                }
                Action::Replay => {
                    self.txn.lost_seq = seq;
                    return Err(SessionError::Replay);
                }
                // MariaDB cannot say whether a given transaction committed:
                // the loss never asks for it (`commit_resolvable: false`).
                Action::Resolve => unexpected(action),
                Action::Clean { rollback, reset } => self.give_back(rollback || reset),
                now @ (Action::Hold
                | Action::Detach
                | Action::Fail(_)
                | Action::Close(Ending::Drained | Ending::StateLost)) => {
                    carried = carried.and(self.act_now(now))
                }
            }
        }
        Ok(carried)
    }

    /// Carries out `actions` with no async layer when that is all they
    /// ask: one `Attach` whose connection is at hand (`check_out_now`),
    /// the usual unit. `Err` gives them back untouched, for
    /// [`carry_out`](Self::carry_out).
    pub(super) fn carry_out_at_once(&mut self, actions: Actions) -> Result<Carried, Actions> {
        let mut all = actions.into_iter();
        match (all.next(), all.next()) {
            (Some(Action::Attach(route)), None)
                if self.server.is_none() && self.check_out_now(route) =>
            {
                Ok(Carried::Done)
            }
            _ => Err(actions),
        }
    }

    /// Carries out `actions` of an event that asks for nothing to wait on
    /// (`Ready`, `Pin`, `Attached`, `Reset`, `Drain`, `LostEnded`,
    /// `Replayed`, a command behind an attached connection); what is left
    /// to answer (a failed replay's `Fail`) comes back.
    pub(super) fn carry_out_now(&mut self, actions: Actions) -> Carried {
        actions
            .into_iter()
            .fold(Carried::Done, |carried, a| carried.and(self.act_now(a)))
    }

    /// One action that needs no waiting.
    fn act_now(&mut self, action: Action) -> Carried {
        match action {
            Action::Hold => {
                // The command needs another connection: MySQL answered the
                // last one already, so the held connection goes back now.
                self.engine.drop_keep();
                let ready = Event::Ready {
                    status: self.engine.status(),
                    owed: Owed::Nothing,
                };
                let actions = self.engine.step(ready);
                return self.carry_out_now(actions);
            }
            Action::Detach => self.detach(),
            Action::Fail(outcome) => return Carried::Failed(outcome),
            Action::Close(Ending::StateLost) => return Carried::StateLost,
            // The boundary check before the next command ends the session
            // (a drain reached a boundary).
            Action::Close(Ending::Drained) => {}
            // The attached connection serves the command.
            Action::Attach(_) if self.server.is_some() => {}
            Action::Attach(_)
            | Action::Retry
            | Action::Replay
            | Action::Resolve
            | Action::Clean { .. } => unexpected(action),
        }
        Carried::Done
    }

    /// The server connection goes back to the pool, or is closed when it
    /// is `dirty` (the engine's `Clean`: a rollback or reset is owed), the
    /// client is in a transaction, or an answer is half read.
    pub(super) fn give_back(&mut self, dirty: bool) {
        if let Some(server) = self.server.take() {
            let dirty = dirty || self.in_transaction();
            if dirty || !server.io.read_buf.is_empty() {
                server.discard();
            } else {
                server.release();
            }
        }
    }
}

/// An action the event just stepped cannot lead to (a transition-table
/// bug): loud in debug builds, logged in release ones.
fn unexpected(action: Action) {
    debug_assert!(false, "an action this event cannot lead to: {action:?}");
    tracing::error!(
        ?action,
        "the session engine asked for an action its event cannot lead to; not carried out"
    );
}
