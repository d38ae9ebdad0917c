//! Which Fulcrum client notified through which server connection, so a
//! NotificationResponse carries the pid Fulcrum gave that client (the one
//! its BackendKeyData and `SELECT pg_backend_pid()` showed), not the pooled
//! server connection's: a client's own notification then carries its own
//! pid, as it would directly. Recorded when a unit with `NOTIFY` or
//! `pg_notify()` is sent, so before the server can deliver it (at its
//! commit); a notification from a server connection no client recorded
//! keeps the server's pid. A notification still on its way when another
//! client notifies through the same connection can carry that client's pid
//! (a window of one network delay). Bounded: emptied past `MAX` server
//! connections.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::{Bytes, BytesMut};

/// Most server connections remembered.
const MAX: usize = 4096;

#[derive(Default)]
pub struct Senders {
    /// Server pid -> the pid Fulcrum gave the client that last notified there.
    by_server: Mutex<HashMap<i32, i32>>,
}

impl Senders {
    /// The client known as `client_pid` notified through the server
    /// connection whose pid is `server_pid`.
    pub fn record(&self, server_pid: i32, client_pid: i32) {
        let mut map = self.by_server.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX && !map.contains_key(&server_pid) {
            map.clear();
        }
        map.insert(server_pid, client_pid);
    }

    /// `frame` (a NotificationResponse) with its pid replaced by the
    /// client's that sent it, when one did.
    pub fn rewrite(&self, frame: Bytes) -> Bytes {
        let Some(pid) = frame.get(5..9) else {
            return frame;
        };
        let server_pid = i32::from_be_bytes([pid[0], pid[1], pid[2], pid[3]]);
        let client = self
            .by_server
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&server_pid)
            .copied();
        match client {
            Some(client_pid) => {
                let mut out = BytesMut::from(&frame[..]);
                out[5..9].copy_from_slice(&client_pid.to_be_bytes());
                out.freeze()
            }
            None => frame,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Senders;
    use bytes::Bytes;

    fn notification(pid: i32) -> Bytes {
        let mut f = b"A\0\0\0\x0f".to_vec();
        f.extend_from_slice(&pid.to_be_bytes());
        f.extend_from_slice(b"ch\0p\0");
        Bytes::from(f)
    }

    #[test]
    fn a_notification_carries_the_pid_of_the_client_that_sent_it() {
        let s = Senders::default();
        s.record(100, 7);
        assert_eq!(&s.rewrite(notification(100))[5..9], &7i32.to_be_bytes());
        assert_eq!(
            &s.rewrite(notification(200))[5..9],
            &200i32.to_be_bytes(),
            "no client recorded: the server's pid"
        );
        s.record(100, 8);
        assert_eq!(&s.rewrite(notification(100))[5..9], &8i32.to_be_bytes());
        assert_eq!(&s.rewrite(Bytes::from_static(b"A\0\0"))[..], b"A\0\0");
    }
}
