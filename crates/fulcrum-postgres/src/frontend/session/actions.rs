//! Carrying out what the engine asks. Every `Actions` a step returns goes
//! through [`Session::carry_out`] (where an action may wait: attach, retry,
//! replay, resolve, end the session, clean the connection) or
//! [`Session::carry_out_now`] (events whose actions need no waiting), and
//! each matches every `Action` variant: a new action does not compile
//! until this front end performs it. An action an event cannot lead to is
//! reported (`unexpected`), never dropped unread.

use fulcrum_session::{Action, Actions, Ending};

use super::attach::Pick;
use super::*;

/// What is left to the caller once the engine's actions are carried out
/// (only a unit behind an attached connection can be held).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Carried {
    /// Everything asked was done.
    Done,
    /// `Hold`: the unit stays buffered until the attached connection has
    /// answered (and gone back).
    Held,
}

/// What [`Session::carry_out_at_once`] could not do without waiting.
pub(super) enum NotAtOnce {
    /// The one `Attach`: its full way, from the pick made already
    /// (`Session::attach_waiting`).
    Attach(Route, Pick),
    /// Actions, untouched, for [`Session::carry_out`].
    Actions(Actions),
}

impl Carried {
    /// Both of two results: a hold is kept.
    fn and(self, other: Carried) -> Carried {
        if other == Carried::Held {
            other
        } else {
            self
        }
    }
}

impl Session {
    /// Carries out `actions` in order, waiting where an action needs it.
    pub(super) async fn carry_out(&mut self, actions: Actions) -> Result<Carried, SessionError> {
        let mut carried = Carried::Done;
        for action in actions {
            match action {
                // A client holding its connection keeps it (`attach` does
                // nothing then).
                Action::Attach(route) => self.attach(route).await?,
                // The rare actions are boxed: allocated when they run,
                // not carried by every client's task (issue 44).
                Action::Retry => Box::pin(self.retry_unit()).await?,
                Action::Replay => Box::pin(self.replay_transaction()).await?,
                // Boxed: resolving may lead to a replay, whose units are
                // carried out here again.
                Action::Resolve => Box::pin(self.resolve_commit()).await?,
                Action::Close(Ending::StateLost) => return Err(self.state_lost().await),
                Action::Clean { rollback, reset } => Box::pin(self.clean(rollback, reset)).await,
                now @ (Action::Hold
                | Action::Detach
                | Action::Fail(_)
                | Action::Close(Ending::Drained)) => carried = carried.and(self.act_now(now)),
            }
        }
        Ok(carried)
    }

    /// Carries out `actions` with no async layer when that is all they
    /// ask: one `Attach` whose connection is at hand (`attach_now`), the
    /// usual unit. `Err`: what is left, for the caller to await.
    pub(super) fn carry_out_at_once(&mut self, actions: Actions) -> Result<Carried, NotAtOnce> {
        let mut all = actions.into_iter();
        match (all.next(), all.next()) {
            (Some(Action::Attach(route)), None) if self.server.is_none() => {
                match self.attach_now(route) {
                    Ok(()) => Ok(Carried::Done),
                    Err(pick) => Err(NotAtOnce::Attach(route, pick)),
                }
            }
            _ => Err(NotAtOnce::Actions(actions)),
        }
    }

    /// Carries out `actions` of an event that asks for nothing to wait on
    /// and holds nothing (`Ready`, `Pin`, `Attached`, `Drain`, `LostEnded`,
    /// `Replayed`, `ReplayFailed`).
    pub(super) fn carry_out_now(&mut self, actions: Actions) {
        for action in actions {
            if self.act_now(action) == Carried::Held {
                unexpected(action);
            }
        }
    }

    /// One action that needs no waiting.
    fn act_now(&mut self, action: Action) -> Carried {
        match action {
            Action::Hold => return Carried::Held,
            Action::Detach => self.detach(),
            Action::Fail(outcome) => self.fail_unit(outcome),
            // The session loop's boundary check ends the session (a drain
            // reached a boundary): it writes the client its FATAL first.
            Action::Close(Ending::Drained) => {}
            // The attached connection serves the unit.
            Action::Attach(_) if self.server.is_some() => {}
            Action::Attach(_)
            | Action::Retry
            | Action::Replay
            | Action::Resolve
            | Action::Close(Ending::StateLost)
            | Action::Clean { .. } => unexpected(action),
        }
        Carried::Done
    }

    /// `Close(StateLost)`: the server died with state that cannot be
    /// rebuilt elsewhere (pinned, session pooling, a message half
    /// forwarded): the client gets a FATAL error and the session ends.
    pub(super) async fn state_lost(&mut self) -> SessionError {
        let msg = format!(
            "{}; the session's state (transaction, prepared statements, settings) was on it: reconnect",
            self.lost_server_words()
        );
        self.fatal_client(sqlstate::CONNECTION_FAILURE, &msg).await
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
