//! The session's opt-out of the result cache, answered by Fulcrum (never
//! sent to a server): `SET [SESSION] fulcrum.cache = off | on`, `RESET
//! fulcrum.cache`, `SHOW fulcrum.cache`.

use fulcrum_sql::consistency::{setting_op_for, SettingOp};

use super::*;
use crate::frontend::wire::put_one_row;

/// The setting's name.
const SETTING: &str = "fulcrum.cache";

/// ER_WRONG_VALUE_FOR_VAR.
const WRONG_VALUE_FOR_VAR: u16 = 1231;

impl Session {
    /// Answers `SET/RESET/SHOW fulcrum.cache`; true when `text` was one.
    pub(in crate::frontend::session) fn try_answer_cache_setting(
        &mut self,
        text: &str,
        seq: u8,
    ) -> bool {
        let Some(op) = setting_op_for(text, SETTING) else {
            return false;
        };
        let (caps, status) = (self.hello.caps, self.status);
        match op {
            SettingOp::Show => {
                let value = if self.cache.off { "off" } else { "on" };
                put_one_row(
                    &mut self.client.write_buf,
                    seq,
                    caps,
                    status,
                    SETTING,
                    value,
                );
                return true;
            }
            SettingOp::Reset => self.cache.off = false,
            SettingOp::Set(v) => match v.to_ascii_lowercase().as_str() {
                "off" | "false" | "0" => self.cache.off = true,
                "on" | "true" | "1" => self.cache.off = false,
                _ => {
                    let msg = format!(
                        "Variable '{SETTING}' can't be set to the value of '{v}' (fulcrum: on or off)"
                    );
                    put_err(
                        &mut self.client.write_buf,
                        seq,
                        WRONG_VALUE_FOR_VAR,
                        *b"42000",
                        &msg,
                    );
                    return true;
                }
            },
        }
        put_ok(&mut self.client.write_buf, seq, caps, status);
        true
    }
}
