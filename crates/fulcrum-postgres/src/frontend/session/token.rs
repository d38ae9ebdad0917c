//! Fulcrum's own answers, in PostgreSQL's words, to the statements that
//! read or set a session's read consistency: `SHOW fulcrum.position` and
//! `SET fulcrum.min_position` (the causal token), `SET/RESET/SHOW
//! fulcrum.consistency`. What they mean is `fulcrum_session::Reads`'s.

use fulcrum_session::reads::SettingAnswer;
use fulcrum_session::Status;
use fulcrum_sql::consistency::{position_op, setting_op, PositionOp, SETTING};

use super::reads::primary_position;
use super::status_byte;
use super::Session;
use crate::codec::backend_msg;
use crate::codec::frontend_msg::query_text;

impl Session {
    /// Answers the causal-token statements itself: `SHOW fulcrum.position`
    /// and `SET fulcrum.min_position = '...'`, once everything before them
    /// is answered (a position being learnt included).
    pub(super) async fn try_answer_position(&mut self, total: usize) -> PositionAnswer {
        let Some(op) =
            statement(&self.client.read_buf[..total], &[b"set", b"show"]).and_then(position_op)
        else {
            return PositionAnswer::No;
        };
        if self.owed.unsynced {
            // Inside an unsynced extended-protocol batch: left to the server.
            return PositionAnswer::No;
        }
        if self.owed.ready > 0 || !self.owed.expect.is_empty() {
            return PositionAnswer::Hold;
        }
        let mut out = bytes::BytesMut::new();
        let error = match op {
            PositionOp::Show => {
                let token = self
                    .reads
                    .token(&self.ctx.reads(&self.id.user, &self.id.database));
                // Nothing tracked: the primary's position now, past every
                // commit acknowledged so far. Boxed: a checkout and a
                // round trip, rare, not carried by every client's task.
                let position = match token {
                    Some(p) => Some(p),
                    None => {
                        let (ctx, user, db) = (&self.ctx, &self.id.pool_user, &self.id.database);
                        Box::pin(primary_position(ctx, user, db)).await
                    }
                };
                match position {
                    Some(p) => {
                        let text = fulcrum_cluster::lag::format_lsn(p);
                        backend_msg::one_text_row(&mut out, "fulcrum.position", &text);
                        backend_msg::command_complete(&mut out, "SHOW");
                        None
                    }
                    None => Some((
                        "57P03",
                        "fulcrum: the position is not known now (no primary answered)".to_owned(),
                    )),
                }
            }
            PositionOp::SetMin(v) if self.reads.set_min_position(v) => {
                backend_msg::command_complete(&mut out, "SET");
                None
            }
            PositionOp::SetMin(v) => Some(("22023", format!(
                "invalid value for parameter \"fulcrum.min_position\": \"{v}\"; expected a WAL position such as 0/3062A10 (SHOW fulcrum.position)"
            ))),
        };
        self.answer_local(out, error, total);
        PositionAnswer::Answered
    }

    /// Answers `SET/RESET/SHOW fulcrum.consistency` itself, when nothing is
    /// in flight; true when the frame at the front of the buffer (length
    /// `total`) was one.
    pub(super) fn try_answer_setting(&mut self, total: usize) -> bool {
        if self.owed.ready > 0 || !self.owed.expect.is_empty() || self.owed.unsynced {
            return false;
        }
        let Some(op) = statement(&self.client.read_buf[..total], &[b"set", b"reset", b"show"])
            .and_then(setting_op)
        else {
            return false;
        };
        let mut out = bytes::BytesMut::new();
        let error = match self.reads.setting(op) {
            SettingAnswer::Set => {
                backend_msg::command_complete(&mut out, "SET");
                None
            }
            SettingAnswer::Reset => {
                backend_msg::command_complete(&mut out, "RESET");
                None
            }
            SettingAnswer::Show(name) => {
                backend_msg::one_text_row(&mut out, SETTING, name);
                backend_msg::command_complete(&mut out, "SHOW");
                None
            }
            SettingAnswer::Invalid { names, .. } => Some((
                "22023",
                format!("invalid value for parameter \"{SETTING}\"; available values: {names}"),
            )),
        };
        self.answer_local(out, error, total);
        true
    }

    /// Queues Fulcrum's own answer to the `total`-byte frame at the front
    /// of the client buffer (its rows in `out`, or an error), then
    /// ReadyForQuery, and consumes the frame.
    pub(super) fn answer_local(
        &mut self,
        out: bytes::BytesMut,
        error: Option<(&str, String)>,
        total: usize,
    ) {
        let write = &mut self.client.write_buf;
        match error {
            None => write.extend_from_slice(&out),
            Some((code, msg)) => {
                backend_msg::error_response(write, "ERROR", code, &msg);
                if self.engine.status() == Status::InTransaction {
                    self.engine.told(Status::Failed);
                }
            }
        }
        backend_msg::ready_for_query(write, status_byte(self.engine.status()));
        let _ = self.client.read_buf.split_to(total);
    }
}

/// What `try_answer_position` did with the frame at the front.
pub(super) enum PositionAnswer {
    /// Not a causal-token statement.
    No,
    /// Answered (the frame is consumed).
    Answered,
    /// Earlier work is still owed an answer: kept until it has one.
    Hold,
}

/// The text of a simple Query `frame` whose first word is one of `words`.
pub(super) fn statement<'a>(frame: &'a [u8], words: &[&[u8]]) -> Option<&'a str> {
    let text = query_text(frame.get(5..)?)?;
    let first = fulcrum_sql::statements::first_word(text);
    if !words.iter().any(|w| first.eq_ignore_ascii_case(w)) {
        return None;
    }
    std::str::from_utf8(text).ok()
}
