//! What a client in transaction pooling asks about itself and other
//! Fulcrum clients, answered by Fulcrum, since only Fulcrum knows the pids
//! it gave out (BackendKeyData): `SELECT pg_backend_pid()` is the client's
//! own pid, and `SELECT pg_terminate_backend(<pid>)` /
//! `SELECT pg_cancel_backend(<pid>)` of a Fulcrum client's pid end that
//! client (57P01, as the server would) or cancel its running statement, and
//! answer `t`. Only these exact forms, as one simple Query; any other form,
//! or a pid Fulcrum did not give out, goes to the server as before. Through
//! the extended protocol (psycopg, asyncpg), a Parse of exactly
//! `SELECT pg_backend_pid()` is sent as `SELECT <pid>::int4 AS
//! pg_backend_pid`, so every driver reads the pid its BackendKeyData said,
//! and a Parse of `SELECT pg_terminate_backend($1)` (psycopg's `%s`) is made
//! one Fulcrum can answer at Bind for its own clients' pids
//! ([`signal_parse`]).

use super::*;

use super::token::statement;
use crate::frontend::cancel::Signal;

/// A signal call recognised with certainty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PidCall {
    /// `SELECT pg_backend_pid()`.
    BackendPid,
    /// `SELECT pg_terminate_backend(<pid>)`.
    Terminate(i32),
    /// `SELECT pg_cancel_backend(<pid>)`.
    Cancel(i32),
    /// `SELECT pg_terminate_backend($1)` (true) or `pg_cancel_backend($1)`.
    Bound(bool),
}

impl PidCall {
    fn column(self) -> &'static str {
        match self {
            PidCall::BackendPid => "pg_backend_pid",
            PidCall::Terminate(_) => "pg_terminate_backend",
            PidCall::Cancel(_) | PidCall::Bound(false) => "pg_cancel_backend",
            PidCall::Bound(true) => "pg_terminate_backend",
        }
    }
}

/// The call `text` makes when it is exactly `SELECT [pg_catalog.]f(args)`
/// with an optional `;` (case and white space as the client wrote them).
pub(super) fn pid_call(text: &str) -> Option<PidCall> {
    let t = text.trim().trim_end_matches(';').trim_end();
    let rest = strip_word(t, "select")?;
    let rest = strip_ci(rest, "pg_catalog.").unwrap_or(rest);
    let (name, rest) = rest.split_once('(')?;
    let args = rest.strip_suffix(')')?.trim();
    let pid = || args.parse::<i32>().ok().filter(|p| *p > 0);
    match name.trim_end().to_ascii_lowercase().as_str() {
        "pg_backend_pid" if args.is_empty() => Some(PidCall::BackendPid),
        "pg_terminate_backend" if args == "$1" => Some(PidCall::Bound(true)),
        "pg_cancel_backend" if args == "$1" => Some(PidCall::Bound(false)),
        "pg_terminate_backend" => pid().map(PidCall::Terminate),
        "pg_cancel_backend" => pid().map(PidCall::Cancel),
        _ => None,
    }
}

/// `s` after the keyword `word` and the white space that must follow it.
fn strip_word<'a>(s: &'a str, word: &str) -> Option<&'a str> {
    let rest = strip_ci(s, word)?;
    rest.starts_with(|c: char| c.is_ascii_whitespace())
        .then(|| rest.trim_start())
}

fn strip_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// A cheap look at a Query body: may it be one of the calls above? (A
/// SELECT whose select list starts with `p`: one compare for most.)
fn may_be_pid_call(frame: &[u8]) -> bool {
    frame.get(5..).and_then(query_text).is_some_and(select_of_p)
}

/// `text` opens with `SELECT` and a select list starting with `p`.
fn select_of_p(text: &[u8]) -> bool {
    let first = first_word(text);
    first.eq_ignore_ascii_case(b"select") && select_list_opens_with_p(text, first)
}

/// `text`, whose first word is `first` (`SELECT`), has a select list
/// starting with `p`.
pub(super) fn select_list_opens_with_p(text: &[u8], first: &[u8]) -> bool {
    let at = text.len() - text.trim_ascii_start().len() + first.len();
    text.get(at..)
        .map(|r| r.trim_ascii_start())
        .and_then(|r| r.first())
        .is_some_and(|c| c.eq_ignore_ascii_case(&b'p'))
}

/// The Parse `frame` of exactly `SELECT pg_backend_pid()`, made to answer
/// `pid` (the name and parameter types kept); `None` for any other Parse.
pub(super) fn backend_pid_parse(frame: &[u8], pid: i32) -> Option<BytesMut> {
    let p = parse_msg(frame.get(5..)?)?;
    if !select_of_p(p.query) {
        return None;
    }
    let text = std::str::from_utf8(p.query).ok()?;
    if pid_call(text)? != PidCall::BackendPid {
        return None;
    }
    let query = format!("SELECT {pid}::int4 AS pg_backend_pid");
    let mut definition = query.into_bytes();
    definition.extend_from_slice(&p.definition[p.query.len()..]);
    let mut out = BytesMut::new();
    crate::codec::frontend_msg::put_parse(&mut out, p.name, &definition);
    Some(out)
}

/// The Parse `frame` of exactly `SELECT pg_terminate_backend($1)` (or
/// `pg_cancel_backend($1)`), made to let Fulcrum answer for its own
/// clients: `SELECT CASE WHEN $1 < 0 THEN true ELSE f($1) END AS f`, the
/// same parameter and result; a Bind whose pid is a Fulcrum client's is
/// given `-1` ([`Session::bind_signal`]), any other pid reaches the server's
/// function. Returns the frame and whether it terminates.
pub(super) fn signal_parse(frame: &[u8]) -> Option<(BytesMut, bool)> {
    let p = parse_msg(frame.get(5..)?)?;
    if !select_of_p(p.query) {
        return None;
    }
    let PidCall::Bound(terminate) = pid_call(std::str::from_utf8(p.query).ok()?)? else {
        return None;
    };
    let f = PidCall::Bound(terminate).column();
    let query = format!("SELECT CASE WHEN $1 < 0 THEN true ELSE pg_catalog.{f}($1) END AS {f}");
    let mut definition = query.into_bytes();
    definition.extend_from_slice(&p.definition[p.query.len()..]);
    let mut out = BytesMut::new();
    crate::codec::frontend_msg::put_parse(&mut out, p.name, &definition);
    Some((out, terminate))
}

/// A pid bound as text, or in binary as an int2, int4 or int8; with the
/// value `-1` in the same format and width.
fn bound_pid(value: &[u8], binary: bool) -> Option<(i32, Vec<u8>)> {
    if !binary {
        let pid = std::str::from_utf8(value).ok()?.trim().parse().ok()?;
        return Some((pid, b"-1".to_vec()));
    }
    let pid = match value.len() {
        2 => i16::from_be_bytes([value[0], value[1]]).into(),
        4 => i32::from_be_bytes([value[0], value[1], value[2], value[3]]),
        8 => i32::try_from(i64::from_be_bytes(value.try_into().ok()?)).ok()?,
        _ => return None,
    };
    Some((pid, vec![0xff; value.len()]))
}

impl Session {
    /// Transaction pooling: the unit being sent notifies, so what the
    /// attached server connection notifies carries this client's pid
    /// (`notify/senders.rs`). Recorded as it is sent, before the server
    /// can deliver it (at the statement's commit).
    pub(super) fn record_notifier(&self) {
        if let (true, Some(server)) = (self.stmts.rewrite, self.server.as_ref()) {
            let senders = &self.ctx.notifications.senders;
            senders.record(server.cancel.process_id, self.id.cancel.process_id);
        }
    }

    /// A Bind of a statement [`signal_parse`] made: when its pid is a
    /// Fulcrum client's of this user, that client is ended (or its
    /// statement cancelled) and the Bind carries `-1`, so the server answers
    /// `t`; otherwise the Bind is unchanged.
    pub(super) fn bind_signal(&mut self, frame: BytesMut) -> BytesMut {
        let Some(b) = bind_msg(&frame[5..]) else {
            return frame;
        };
        let Some(&terminate) = self.stmts.signals.get(b.statement) else {
            return frame;
        };
        let binary = crate::codec::frontend_msg::bind_param_binary(b.rest, 0);
        let value = crate::codec::frontend_msg::bind_param(b.rest, 0).flatten();
        let Some((pid, minus_one)) = value.zip(binary).and_then(|(v, bin)| bound_pid(v, bin))
        else {
            return frame;
        };
        let timeout = self.ctx.config.connect_timeout;
        if self
            .ctx
            .cancels
            .signal(pid, &self.id.user, terminate, timeout)
            != Signal::Done
        {
            return frame;
        }
        let Some(rest) = crate::codec::frontend_msg::with_bind_param(b.rest, 0, &minus_one) else {
            return frame;
        };
        let mut out = BytesMut::new();
        put_bind(&mut out, b.portal, b.statement, &rest);
        out
    }

    /// Answers one of the calls above for the `total`-byte Query at the
    /// front of the client buffer; false when it is not one (or names a pid
    /// Fulcrum did not give out), and the Query goes on as usual.
    pub(super) fn try_answer_pid_call(&mut self, total: usize) -> bool {
        if !self.stmts.rewrite
            || self.owed.ready > 0
            || !self.owed.expect.is_empty()
            || self.owed.unsynced
            || !may_be_pid_call(&self.client.read_buf[..total])
        {
            return false;
        }
        let Some(call) = statement(&self.client.read_buf[..total], &[b"select"]).and_then(pid_call)
        else {
            return false;
        };
        let (cancels, me) = (&self.ctx.cancels, &self.id.user);
        let answer = match call {
            PidCall::Bound(_) => return false,
            PidCall::BackendPid => Ok(self.id.cancel.process_id.to_string()),
            PidCall::Terminate(pid) | PidCall::Cancel(pid) => {
                let terminate = matches!(call, PidCall::Terminate(_));
                match cancels.signal(pid, me, terminate, self.ctx.config.connect_timeout) {
                    Signal::NotOurs => return false,
                    Signal::Done => Ok("t".to_owned()),
                    Signal::Denied => Err((
                        "42501",
                        format!(
                            "permission denied to {} process",
                            if terminate { "terminate" } else { "cancel" }
                        ),
                    )),
                }
            }
        };
        let mut out = bytes::BytesMut::new();
        let error = match answer {
            Ok(value) => {
                let oid = if call == PidCall::BackendPid { 23 } else { 16 };
                backend_msg::one_row(&mut out, call.column(), oid, &value);
                backend_msg::command_complete(&mut out, "SELECT 1");
                None
            }
            Err((code, msg)) => Some((code, msg)),
        };
        self.answer_local(out, error, total);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::{may_be_pid_call, pid_call, PidCall};

    #[test]
    fn only_the_exact_forms_are_recognised() {
        assert_eq!(
            pid_call("SELECT pg_backend_pid()"),
            Some(PidCall::BackendPid)
        );
        assert_eq!(
            pid_call("select  pg_catalog.PG_TERMINATE_BACKEND( 1234 ) ;"),
            Some(PidCall::Terminate(1234))
        );
        assert_eq!(
            pid_call("SELECT pg_cancel_backend(77)"),
            Some(PidCall::Cancel(77))
        );
        for other in [
            "SELECT pg_backend_pid() + 0",
            "SELECT pg_backend_pid(), 1",
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity",
            "SELECT pg_terminate_backend(12, 1000)",
            "SELECT pg_terminate_backend(-1)",
            "SELECT pg_terminate_backend(99999999999)",
            "SELECTpg_backend_pid()",
            "SELECT x.pg_backend_pid()",
        ] {
            assert_eq!(pid_call(other), None, "{other}");
        }
    }

    #[test]
    fn bound_pids_are_read_in_text_and_binary() {
        use super::bound_pid;
        assert_eq!(bound_pid(b"1234", false), Some((1234, b"-1".to_vec())));
        assert_eq!(
            bound_pid(&77i16.to_be_bytes(), true),
            Some((77, vec![0xff; 2]))
        );
        assert_eq!(
            bound_pid(&77i32.to_be_bytes(), true),
            Some((77, vec![0xff; 4]))
        );
        assert_eq!(
            bound_pid(&77i64.to_be_bytes(), true),
            Some((77, vec![0xff; 8]))
        );
        assert_eq!(bound_pid(&(1i64 << 40).to_be_bytes(), true), None);
        assert_eq!(bound_pid(b"1111", true), Some((0x3131_3131, vec![0xff; 4])));
        assert_eq!(bound_pid(b"x", false), None);
        assert_eq!(
            pid_call("SELECT pg_terminate_backend($1)"),
            Some(PidCall::Bound(true))
        );
        let mut frame = bytes::BytesMut::new();
        crate::codec::frontend_msg::put_parse(
            &mut frame,
            b"",
            b"select pg_cancel_backend($1)\0\0\x01\0\0\0\x17",
        );
        let (out, terminate) = super::signal_parse(&frame).expect("rewritten");
        assert!(!terminate);
        let p = crate::codec::frontend_msg::parse_msg(&out[5..]).unwrap();
        assert_eq!(
            p.query,
            &b"SELECT CASE WHEN $1 < 0 THEN true ELSE pg_catalog.pg_cancel_backend($1) END AS pg_cancel_backend"[..]
        );
        assert_eq!(
            &p.definition[p.query.len()..],
            b"\0\0\x01\0\0\0\x17",
            "its parameter type kept"
        );
    }

    #[test]
    fn a_parse_of_backend_pid_answers_the_clients_pid() {
        use crate::codec::frontend_msg::{parse_msg, put_parse};
        let mut frame = bytes::BytesMut::new();
        put_parse(&mut frame, b"s1", b"select pg_backend_pid()\0\0\0");
        let out = super::backend_pid_parse(&frame, 4242).expect("rewritten");
        let p = parse_msg(&out[5..]).unwrap();
        assert_eq!(p.name, b"s1");
        assert_eq!(p.query, b"SELECT 4242::int4 AS pg_backend_pid");
        assert_eq!(&p.definition[p.query.len()..], b"\0\0\0");
        let mut other = bytes::BytesMut::new();
        put_parse(&mut other, b"", b"SELECT pg_backend_pid() + 1\0\0\0");
        assert!(super::backend_pid_parse(&other, 1).is_none());
    }

    #[test]
    fn the_cheap_look_rejects_ordinary_selects_at_once() {
        let q = |s: &str| {
            let mut f = vec![b'Q', 0, 0, 0, 0];
            f.extend_from_slice(s.as_bytes());
            f.push(0);
            f
        };
        assert!(may_be_pid_call(&q("SELECT pg_backend_pid()")));
        assert!(may_be_pid_call(&q("  select\n PG_cancel_backend(3)")));
        assert!(!may_be_pid_call(&q(
            "SELECT abalance FROM pgbench_accounts"
        )));
        assert!(!may_be_pid_call(&q("UPDATE t SET a = 1")));
        assert!(!may_be_pid_call(b"Q\0\0"));
    }
}
