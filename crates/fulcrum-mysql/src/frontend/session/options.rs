//! The client's own protocol options, kept by Fulcrum because server
//! connections are shared: whether the client allows several statements in
//! one COM_QUERY (CLIENT_MULTI_STATEMENTS at login, then COM_SET_OPTION).
//! Server connections always allow them, so Fulcrum refuses a second
//! statement itself, with the error the server gives. And whether a
//! multi-statement text is only settings, so it may be replayed.

use fulcrum_sql::Decision;
use mysql_common::constants::CapabilityFlags as C;

use super::Session;
use crate::codec::err::codes;
use crate::codec::packet::write_packet;
use crate::codec::response::build_eof;
use crate::codec::statements::{second_statement, syntax_error_near};
use crate::frontend::wire::{put_error, put_ok};

/// COM_SET_OPTION's options (MYSQL_OPTION_MULTI_STATEMENTS_ON / _OFF).
const MULTI_STATEMENTS_ON: u16 = 0;
const MULTI_STATEMENTS_OFF: u16 = 1;

impl Session {
    /// COM_SET_OPTION: turns multi-statements on or off for this client,
    /// answered as a server answers it (EOF, or OK without EOF packets).
    pub(super) fn set_option(&mut self, payload: &[u8], seq: u8) {
        let option = payload.get(1..3).map(|b| u16::from_le_bytes([b[0], b[1]]));
        match option {
            Some(MULTI_STATEMENTS_ON) => self.hello.multi_statements = true,
            Some(MULTI_STATEMENTS_OFF) => self.hello.multi_statements = false,
            _ => {
                put_error(
                    &mut self.client.write_buf,
                    seq,
                    codes::UNKNOWN_COM,
                    "Unknown command",
                );
                return;
            }
        }
        if self.hello.caps.contains(C::CLIENT_DEPRECATE_EOF) {
            put_ok(
                &mut self.client.write_buf,
                seq,
                self.hello.caps,
                self.status,
            );
        } else {
            write_packet(&mut self.client.write_buf, seq, &build_eof(0, self.status));
        }
    }

    /// A COM_QUERY with a second statement from a client that did not
    /// allow them gets the server's syntax error (1064) here; true when so.
    pub(super) fn refuse_second_statement(&mut self, text: &[u8], seq: u8) -> bool {
        if self.hello.multi_statements {
            return false;
        }
        let Some(at) = second_statement(text) else {
            return false;
        };
        let (near, line) = syntax_error_near(text, at);
        let message = format!(
            "You have an error in your SQL syntax; check the manual that corresponds to your MariaDB server version for the right syntax to use near '{near}' at line {line}"
        );
        put_error(&mut self.client.write_buf, seq, codes::PARSE, &message);
        true
    }

    /// Whether every statement of `text` is a session setting on its own
    /// (so the text can be replayed on another connection as it is).
    pub(super) fn only_settings(&self, text: &str) -> bool {
        let mut rest = text.as_bytes();
        loop {
            let (this, next) = match second_statement(rest) {
                Some(at) => (&rest[..at], Some(&rest[at..])),
                None => (rest, None),
            };
            let sql = String::from_utf8_lossy(this);
            let sql = sql.trim().trim_end_matches(';');
            if !sql.trim().is_empty() && self.ctx.classify(sql) != Decision::Set {
                return false;
            }
            match next {
                Some(n) => rest = n,
                None => return true,
            }
        }
    }
}
