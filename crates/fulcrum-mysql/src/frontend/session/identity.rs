//! The connection id a client sees is the one it was given at login: the
//! greeting goes out before the client names its user, so that id is
//! Fulcrum's, not a server thread's. This module keeps every answer true to
//! it: `SELECT CONNECTION_ID()` is answered here (and the call made that
//! literal in other statements); a process list's `Id` column shows, for
//! each server thread serving a client, that client's id; and
//! `KILL [QUERY | CONNECTION] <id>` (COM_PROCESS_KILL too) reaches the
//! client of that id: its query is killed on its server, as the killer's
//! user, and `KILL CONNECTION` then ends the client.

use std::collections::HashMap;

use super::*;
use crate::codec::thread_ids::{is_id_column, replace_id};
use crate::frontend::wire::{put_one_row_of, ColumnType};

/// A process list's answer on its way to the client: the server thread ids
/// of its `Id` column become the ids of the clients they serve.
pub(super) struct ThreadIds {
    /// Server thread id -> client id, on the backend that answers.
    owners: HashMap<u32, u32>,
    /// Column definitions seen so far, and which one is `Id`.
    columns: usize,
    id_column: Option<usize>,
}

impl ThreadIds {
    pub(super) fn new(owners: HashMap<u32, u32>) -> ThreadIds {
        ThreadIds {
            owners,
            columns: 0,
            id_column: None,
        }
    }

    /// A column definition of the answer (its payload).
    pub(super) fn column(&mut self, def: &[u8]) {
        if self.id_column.is_none() && is_id_column(def) {
            self.id_column = Some(self.columns);
        }
        self.columns += 1;
    }

    /// A row's whole frame (one packet), its id translated; `None` to send
    /// it as it is.
    pub(super) fn row(&self, frame: &[u8]) -> Option<BytesMut> {
        let column = self.id_column?;
        let payload = frame.get(HEADER_LEN..)?;
        if payload.len() >= MAX_PAYLOAD {
            return None;
        }
        let to = |thread: u64| {
            u32::try_from(thread)
                .ok()
                .and_then(|t| self.owners.get(&t).copied())
        };
        let new = replace_id(payload, column, to)?;
        let mut out = BytesMut::with_capacity(HEADER_LEN + new.len());
        write_packet(&mut out, frame[3], &new);
        Some(out)
    }
}

impl Session {
    /// `SELECT CONNECTION_ID()` (the whole statement): the id the client
    /// was given, typed as the server types it.
    pub(super) fn try_answer_connection_id(&mut self, text: &str, seq: u8) -> bool {
        let Some(name) = fulcrum_sql::select_connection_id(text) else {
            return false;
        };
        let id = self.hello.connection_id.to_string();
        let head = (seq, self.hello.caps, self.status);
        let column = (name, ColumnType::UNSIGNED_BIGINT);
        put_one_row_of(&mut self.client.write_buf, head, column, &id);
        true
    }

    /// The COM_QUERY of `text` with its `CONNECTION_ID()` calls made the
    /// client's id (sequence id `seq`, the client's).
    pub(super) fn with_own_id(&self, text: &str, seq: u8) -> BytesMut {
        let sql = fulcrum_sql::with_connection_id(text, self.hello.connection_id);
        let mut packet = BytesMut::with_capacity(sql.len() + HEADER_LEN + 1);
        let body = crate::codec::command::build_command(Command::Query, sql.as_bytes());
        write_packet(&mut packet, seq, &body);
        packet
    }

    /// `KILL [QUERY | CONNECTION] <id>` or COM_PROCESS_KILL, where `id` is
    /// the connection id Fulcrum gave a client: the query running for that
    /// client is killed on its server, as the killer's user; `KILL
    /// [CONNECTION]` then ends the client (ER_CONNECTION_KILLED on its
    /// socket, as the server ends a killed connection). Ok(false): the
    /// client killed itself.
    pub(super) async fn kill(
        &mut self,
        (query_only, id): (bool, u32),
        seq: u8,
    ) -> Result<(), SessionError> {
        let Some(target) = self.ctx.running_on(id) else {
            let msg = format!("Unknown thread id: {id}");
            put_err(&mut self.client.write_buf, seq, 1094, *b"HY000", &msg);
            return Ok(());
        };
        // Another user's client: the server's answer to a user without the
        // PROCESS privilege (Fulcrum does not know the privileges).
        if target.user != self.user {
            let msg = format!("You are not owner of thread {id}");
            put_err(&mut self.client.write_buf, seq, 1095, *b"HY000", &msg);
            return Ok(());
        }
        if !query_only && id == self.hello.connection_id {
            let msg = "Connection was killed";
            put_error(
                &mut self.client.write_buf,
                seq,
                codes::CONNECTION_KILLED,
                msg,
            );
            let _ = self.client.flush().await;
            return Err(SessionError::Refused(msg.into()));
        }
        // The target's server by address: it may have logged in to the
        // context a reload replaced, which numbered the backends otherwise.
        let on = target
            .on_address()
            .map(|(address, thread)| (self.ctx.backend_at(address), address.to_owned(), thread));
        if let Some((backend, address, thread)) = on {
            let Some(backend) = backend else {
                let msg = format!(
                    "fulcrum: could not kill the query of connection {id}: its server {address} is no longer in the config"
                );
                put_error(&mut self.client.write_buf, seq, codes::UNKNOWN, &msg);
                return Ok(());
            };
            if let Err(e) = self.kill_query_of(backend, thread).await {
                match e {
                    Ok(payload) => {
                        write_packet(&mut self.client.write_buf, seq, &payload);
                    }
                    Err(e) => put_error(
                        &mut self.client.write_buf,
                        seq,
                        codes::UNKNOWN,
                        &format!("fulcrum: could not kill the query of connection {id}: {e}"),
                    ),
                }
                return Ok(());
            }
        }
        if !query_only {
            target.entry.kill();
        }
        put_ok(
            &mut self.client.write_buf,
            seq,
            self.hello.caps,
            self.status,
        );
        Ok(())
    }

    /// `KILL QUERY <thread>` on `backend`, on a connection of its own as the
    /// client's user: Err(Ok(payload)) is the server's ERR.
    async fn kill_query_of(
        &self,
        backend: BackendId,
        thread: u32,
    ) -> Result<(), Result<Vec<u8>, String>> {
        let (format, charset) = (self.hello.wire_format, self.hello.charset);
        let mut conn = self
            .ctx
            .open(backend, &self.user, format, charset)
            .await
            .map_err(|e| Err(e.to_string()))?;
        conn.run_simple(Command::Query, format!("KILL QUERY {thread}").as_bytes())
            .await
            .map_err(|e| match e {
                InternalError::Server { payload, .. } => Ok(payload),
                other => Err(other.to_string()),
            })
    }
}

/// `KILL [QUERY | CONNECTION] <id>`: (query only?, id).
pub fn kill_target(text: &str) -> Option<(bool, u32)> {
    let mut words = text.trim().trim_end_matches(';').split_whitespace();
    if !words.next()?.eq_ignore_ascii_case("kill") {
        return None;
    }
    let mut w = words.next()?;
    let mut query = false;
    if w.eq_ignore_ascii_case("query") {
        query = true;
        w = words.next()?;
    } else if w.eq_ignore_ascii_case("connection") {
        w = words.next()?;
    }
    let id = w.parse().ok()?;
    words.next().is_none().then_some((query, id))
}

/// COM_PROCESS_KILL's payload (after the command byte): the id, as
/// `KILL CONNECTION <id>`.
pub fn process_kill_target(payload: &[u8]) -> Option<(bool, u32)> {
    let id = payload.get(1..5)?;
    Some((false, u32::from_le_bytes([id[0], id[1], id[2], id[3]])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_statements_name_their_target() {
        assert_eq!(kill_target("KILL QUERY 12"), Some((true, 12)));
        assert_eq!(kill_target("kill 7;"), Some((false, 7)));
        assert_eq!(kill_target("KILL CONNECTION 3"), Some((false, 3)));
        assert_eq!(kill_target("KILL QUERY ID 5"), None);
        assert_eq!(kill_target("SELECT 1"), None);
        assert_eq!(kill_target("KILL QUERY x"), None);
        assert_eq!(
            process_kill_target(&[0x0c, 5, 0, 0, 0x40]),
            Some((false, 0x4000_0005))
        );
        assert_eq!(process_kill_target(&[0x0c, 5]), None);
    }
}
