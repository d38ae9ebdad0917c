//! A client whose server connection died under its transaction (or under an
//! extended-protocol batch not yet synced): Fulcrum answers it the way
//! PostgreSQL answers a failed transaction, without a server, until it ends
//! the transaction. It is never moved to another server mid-transaction.
//! Pure: frames in, reply bytes out.

use bytes::BytesMut;

use crate::codec::backend_msg::{self, sqlstate};

const ABORTED: &str =
    "current transaction is aborted, commands ignored until end of transaction block";

/// What became of one client frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Answered (or ignored); still in the lost state.
    Held,
    /// Answered, and the client is out of the lost state (status `I`).
    Done,
    /// Not this state's business: process it normally.
    Pass,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lost {
    /// The client is in a transaction block (status `E` until it ends it).
    pub in_txn: bool,
    /// An error was sent for the current batch; skip to Sync.
    pub errored: bool,
    /// The current batch ends the transaction (ROLLBACK, COMMIT, ...).
    pub ending: bool,
    /// The error not delivered yet, its SQLSTATE and message (08006, or
    /// 08007 when what was lost may have committed: the connection died
    /// while the client was idle in its transaction, or under a replay of
    /// it): the next failed batch gets it instead of 25P02.
    /// Boxed: a pointer in every session, the message only when lost.
    pub untold: Option<Box<(&'static str, String)>>,
}

impl Lost {
    /// Answers the frame with `tag` and `body`; `ends_txn` says whether a
    /// statement text ends a transaction.
    pub fn answer(
        &mut self,
        tag: u8,
        body: &[u8],
        ends_txn: &dyn Fn(&[u8]) -> bool,
        out: &mut BytesMut,
    ) -> Answer {
        match tag {
            b'X' => Answer::Pass,
            b'Q' if !self.in_txn => Answer::Pass,
            b'Q' => {
                let text = body.strip_suffix(b"\0").unwrap_or(body);
                if ends_txn(text) {
                    backend_msg::command_complete(out, "ROLLBACK");
                    backend_msg::ready_for_query(out, b'I');
                    Answer::Done
                } else {
                    self.error(out);
                    backend_msg::ready_for_query(out, b'E');
                    Answer::Held
                }
            }
            b'P' => {
                let query = crate::codec::frontend_msg::parse_msg(body).map(|p| p.query);
                if self.in_txn && !self.errored && query.is_some_and(ends_txn) {
                    self.ending = true;
                    backend_msg::parse_complete(out);
                } else {
                    self.fail(out);
                }
                Answer::Held
            }
            b'B' | b'D' | b'E' if self.ending => {
                match tag {
                    b'B' => out.extend_from_slice(&[b'2', 0, 0, 0, 4]),
                    b'D' => out.extend_from_slice(&[b'n', 0, 0, 0, 4]),
                    _ => backend_msg::command_complete(out, "ROLLBACK"),
                }
                Answer::Held
            }
            b'S' => {
                if self.ending || !self.in_txn {
                    backend_msg::ready_for_query(out, b'I');
                    Answer::Done
                } else {
                    backend_msg::ready_for_query(out, b'E');
                    self.errored = false;
                    Answer::Held
                }
            }
            b'H' | b'd' | b'c' | b'f' => Answer::Held,
            b'F' => {
                self.fail(out);
                backend_msg::ready_for_query(out, if self.in_txn { b'E' } else { b'I' });
                self.errored = false;
                Answer::Held
            }
            _ => {
                self.fail(out);
                Answer::Held
            }
        }
    }

    /// One error per batch, as a server skipping to Sync sends.
    fn fail(&mut self, out: &mut BytesMut) {
        if !self.errored {
            self.error(out);
            self.errored = true;
        }
        self.ending = false;
    }

    fn error(&mut self, out: &mut BytesMut) {
        match self.untold.take().map(|u| *u) {
            Some((code, msg)) => backend_msg::error_response(out, "ERROR", code, &msg),
            None => {
                backend_msg::error_response(out, "ERROR", sqlstate::IN_FAILED_TRANSACTION, ABORTED)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::frame::check_frame;

    fn ends(text: &[u8]) -> bool {
        let t = String::from_utf8_lossy(text).to_ascii_lowercase();
        t.starts_with("rollback") || t.starts_with("commit") || t.starts_with("abort")
    }

    /// The tags of the messages in `out`.
    fn tags(out: &[u8]) -> Vec<char> {
        let mut v = Vec::new();
        let mut rest = out;
        while let Ok(Some(h)) = check_frame(rest, u32::MAX as u64) {
            v.push(h.tag as char);
            if rest.len() < h.total {
                break;
            }
            rest = &rest[h.total..];
        }
        v
    }

    fn parse(query: &str) -> Vec<u8> {
        let mut b = vec![0u8]; // unnamed statement
        b.extend_from_slice(query.as_bytes());
        b.extend_from_slice(&[0, 0, 0]);
        b
    }

    #[test]
    fn simple_queries_fail_until_rollback() {
        let mut lost = Lost {
            in_txn: true,
            errored: false,
            ending: false,
            untold: None,
        };
        let mut out = BytesMut::new();
        assert_eq!(
            lost.answer(b'Q', b"SELECT 1\0", &ends, &mut out),
            Answer::Held
        );
        assert_eq!(tags(&out), vec!['E', 'Z']);
        assert_eq!(*out.last().unwrap(), b'E', "status: failed transaction");
        out.clear();
        assert_eq!(
            lost.answer(b'Q', b"ROLLBACK\0", &ends, &mut out),
            Answer::Done
        );
        assert_eq!(tags(&out), vec!['C', 'Z']);
        assert_eq!(*out.last().unwrap(), b'I');
    }

    #[test]
    fn a_loss_while_idle_in_a_transaction_is_told_first() {
        let mut lost = Lost {
            in_txn: true,
            errored: false,
            ending: false,
            untold: Some(Box::new((
                sqlstate::CONNECTION_FAILURE,
                "lost the server".into(),
            ))),
        };
        let mut out = BytesMut::new();
        lost.answer(b'Q', b"SELECT 1\0", &ends, &mut out);
        assert!(
            out.windows(5).any(|w| w == b"08006"),
            "first: connection failure"
        );
        out.clear();
        lost.answer(b'Q', b"SELECT 1\0", &ends, &mut out);
        assert!(
            out.windows(5).any(|w| w == b"25P02"),
            "then: aborted transaction"
        );
    }

    #[test]
    fn an_untold_unknown_outcome_keeps_its_sqlstate() {
        // A replay lost with a statement that may commit in flight, the
        // client idle in its transaction: its next statement is told 08007.
        let mut lost = Lost {
            in_txn: true,
            errored: false,
            ending: false,
            untold: Some(Box::new(("08007", "may or may not have committed".into()))),
        };
        let mut out = BytesMut::new();
        assert_eq!(
            lost.answer(b'Q', b"INSERT INTO t VALUES (2)\0", &ends, &mut out),
            Answer::Held
        );
        assert_eq!(tags(&out), vec!['E', 'Z']);
        assert!(out.windows(5).any(|w| w == b"08007"), "unknown outcome");
        assert!(!out.windows(5).any(|w| w == b"08006"));
    }

    #[test]
    fn an_extended_rollback_ends_it() {
        let mut lost = Lost {
            in_txn: true,
            errored: false,
            ending: false,
            untold: None,
        };
        let mut out = BytesMut::new();
        for (tag, body) in [
            (b'P', parse("ROLLBACK")),
            (b'B', vec![0, 0, 0, 0, 0, 0, 0, 0]),
            (b'E', vec![0, 0, 0, 0, 0]),
        ] {
            assert_eq!(lost.answer(tag, &body, &ends, &mut out), Answer::Held);
        }
        assert_eq!(lost.answer(b'S', b"", &ends, &mut out), Answer::Done);
        assert_eq!(tags(&out), vec!['1', '2', 'C', 'Z']);
    }

    #[test]
    fn an_extended_batch_gets_one_error_then_ready_failed() {
        let mut lost = Lost {
            in_txn: true,
            errored: false,
            ending: false,
            untold: None,
        };
        let mut out = BytesMut::new();
        lost.answer(b'P', &parse("INSERT INTO t VALUES (1)"), &ends, &mut out);
        lost.answer(b'B', &[0; 8], &ends, &mut out);
        lost.answer(b'E', &[0; 5], &ends, &mut out);
        assert_eq!(lost.answer(b'S', b"", &ends, &mut out), Answer::Held);
        assert_eq!(tags(&out), vec!['E', 'Z']);
        assert_eq!(*out.last().unwrap(), b'E');
    }

    #[test]
    fn outside_a_transaction_only_the_unsynced_batch_is_skipped() {
        let mut lost = Lost {
            in_txn: false,
            errored: true,
            ending: false,
            untold: None,
        };
        let mut out = BytesMut::new();
        assert_eq!(lost.answer(b'E', &[0; 5], &ends, &mut out), Answer::Held);
        assert!(out.is_empty(), "the error was already sent");
        assert_eq!(lost.answer(b'S', b"", &ends, &mut out), Answer::Done);
        assert_eq!(tags(&out), vec!['Z']);
        assert_eq!(
            lost.answer(b'Q', b"SELECT 1\0", &ends, &mut out),
            Answer::Pass
        );
    }
}
