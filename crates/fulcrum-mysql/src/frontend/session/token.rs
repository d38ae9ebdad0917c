//! Fulcrum's own answers, in MySQL's words, to the statements that read or
//! set a session's read consistency: `SELECT @@fulcrum_position` and
//! `SET @@fulcrum_min_position` (the causal token), `SET/RESET/SHOW
//! fulcrum.consistency`. What they mean is `fulcrum_session::Reads`'s.

use fulcrum_session::reads::SettingAnswer;
use fulcrum_sql::consistency::{position_op, setting_op, PositionOp, SETTING};

use super::reads::primary_position;
use super::Session;
use crate::frontend::wire::{put_err, put_ok, put_one_row};

/// ER_WRONG_VALUE_FOR_VAR.
const WRONG_VALUE_FOR_VAR: u16 = 1231;

impl Session {
    /// Answers the causal-token statements itself: `SELECT @@fulcrum_position`
    /// and `SET @@fulcrum_min_position = '...'`; true when `text` was one.
    pub(super) async fn try_answer_position(&mut self, text: &str, seq: u8) -> bool {
        let Some(op) = first_word_in(text, &["select", "set"])
            .then(|| position_op(text))
            .flatten()
        else {
            return false;
        };
        let out = match op {
            PositionOp::Show => {
                let schema = self.schema_key();
                let token = self.reads.token(&self.ctx.reads(&self.user, &schema));
                // Nothing tracked: the primary's position now, past every
                // commit acknowledged so far.
                let position = match token {
                    Some(p) => Some(p),
                    None => {
                        primary_position(&self.ctx, &self.user, self.hello.wire_format, self.hello.charset)
                            .await
                    }
                };
                let (caps, status) = (self.hello.caps, self.status);
                let out = &mut self.client.write_buf;
                match position {
                    Some(p) => put_one_row(out, seq, caps, status, "@@fulcrum_position", &p),
                    None => put_err(
                        out,
                        seq,
                        crate::codec::err::codes::SERVER_SHUTDOWN.code,
                        *b"08S01",
                        "fulcrum: the position is not known now (no primary answered)",
                    ),
                }
                return true;
            }
            PositionOp::SetMin(v) if self.reads.set_min_position(v) => None,
            PositionOp::SetMin(v) => Some(format!(
                "Variable 'fulcrum_min_position' can't be set to the value of '{v}' (fulcrum: a GTID list such as 0-1-42, from SELECT @@fulcrum_position)"
            )),
        };
        self.answer_set(seq, out);
        true
    }

    /// Answers `SET/RESET/SHOW fulcrum.consistency`; true when `text` was one.
    pub(super) fn try_answer_setting(&mut self, text: &str, seq: u8) -> bool {
        let Some(op) = first_word_in(text, &["set", "reset", "show"])
            .then(|| setting_op(text))
            .flatten()
        else {
            return false;
        };
        let error = match self.reads.setting(op) {
            SettingAnswer::Set | SettingAnswer::Reset => None,
            SettingAnswer::Show(name) => {
                let (caps, status) = (self.hello.caps, self.status);
                put_one_row(&mut self.client.write_buf, seq, caps, status, SETTING, name);
                return true;
            }
            SettingAnswer::Invalid { value, names } => Some(format!(
                "Variable '{SETTING}' can't be set to the value of '{value}' (fulcrum: one of {names})"
            )),
        };
        self.answer_set(seq, error);
        true
    }

    /// OK for a setting Fulcrum took, or ER_WRONG_VALUE_FOR_VAR with `error`.
    fn answer_set(&mut self, seq: u8, error: Option<String>) {
        match error {
            None => put_ok(
                &mut self.client.write_buf,
                seq,
                self.hello.caps,
                self.status,
            ),
            Some(msg) => put_err(
                &mut self.client.write_buf,
                seq,
                WRONG_VALUE_FOR_VAR,
                *b"42000",
                &msg,
            ),
        }
    }
}

/// Whether the first word of `text` is one of `words`.
fn first_word_in(text: &str, words: &[&str]) -> bool {
    let first = text.split_whitespace().next().unwrap_or("");
    words.iter().any(|w| first.eq_ignore_ascii_case(w))
}
