//! Where a server's answer to one command ends, read from the first packet of
//! each message only: OK/ERR, result sets (column count, column definitions,
//! the EOF after them unless `DEPRECATE_EOF`, rows, the terminating EOF or
//! OK-as-EOF), several result sets while `SERVER_MORE_RESULTS_EXISTS` is set,
//! COM_STMT_PREPARE's answer, and the one-packet answers. The final status
//! flags (in a transaction? autocommit?) and the last insert id come out of
//! it. Pure: messages in, decisions out.

use mysql_common::constants::{CapabilityFlags as C, StatusFlags};

use crate::codec::command::parse_prepare_ok;
use crate::codec::response::{
    classify, is_result_set_end, last_gtid, parse_ok, parse_session_state, status_flags,
    ResponseKind,
};

/// What the command was, as far as its answer's shape goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// COM_QUERY, COM_STMT_EXECUTE, COM_INIT_DB, COM_STMT_RESET, ...:
    /// OK, ERR, or result sets.
    Results,
    /// COM_STMT_PREPARE.
    Prepare,
    /// COM_FIELD_LIST: column definitions up to an EOF.
    FieldList,
    /// COM_STATISTICS: one string packet.
    OnePacket,
    /// COM_STMT_FETCH: binary rows (each begins with 0x00, which must not
    /// be read as an OK) up to an EOF, or an ERR; no column count or
    /// definitions.
    Fetch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    First,
    /// Column (or parameter) definitions still to come; then what follows.
    Definitions {
        left: u64,
        then: After,
    },
    /// The EOF after definitions (without DEPRECATE_EOF).
    DefinitionsEof {
        then: After,
    },
    Rows,
    /// LOAD DATA LOCAL INFILE: the client sends the file; then the server's OK/ERR.
    AwaitFile,
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    Rows,
    /// COM_STMT_PREPARE: the column definitions after the parameters.
    Columns(u64),
    Done,
}

/// Tracks one command's answer.
#[derive(Debug, Clone)]
pub struct Reply {
    caps: C,
    shape: Shape,
    state: State,
    /// Status flags of the last OK/EOF seen.
    pub status: Option<StatusFlags>,
    /// Last insert id of the last OK seen (0 if none).
    pub last_insert_id: u64,
    /// The answer was an ERR.
    pub error: bool,
    /// Rows of its result sets, or the rows its OK says it changed.
    pub rows: u64,
    /// Its error code.
    pub error_code: Option<u16>,
    /// The last `last_gtid` an OK reported (session-state tracking): the
    /// GTID of the transaction this answer committed.
    pub last_gtid: Option<String>,
}

/// A malformed answer: the connection cannot be trusted any more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadReply(pub String);

impl Reply {
    pub fn new(shape: Shape, caps: C) -> Reply {
        Reply {
            caps,
            shape,
            state: match shape {
                Shape::FieldList | Shape::Fetch => State::Rows,
                _ => State::First,
            },
            status: None,
            last_insert_id: 0,
            error: false,
            rows: 0,
            error_code: None,
            last_gtid: None,
        }
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Between a result set's definitions and its end: a message fed now
    /// that leaves this true was a row.
    pub fn in_rows(&self) -> bool {
        self.state == State::Rows
    }

    /// The next message is a result set's column definition.
    pub fn next_is_column(&self) -> bool {
        matches!(
            self.state,
            State::Definitions {
                then: After::Rows,
                ..
            }
        )
    }

    /// A result ended with SERVER_MORE_RESULTS_EXISTS: another follows.
    pub fn awaits_next_result(&self) -> bool {
        self.state == State::First
    }

    /// The server asked the client for a file (LOAD DATA LOCAL INFILE):
    /// the client's packets go to the server up to an empty one.
    pub fn wants_file(&self) -> bool {
        self.state == State::AwaitFile
    }

    /// The client sent the file; the server's OK or ERR comes next.
    pub fn file_sent(&mut self) {
        if self.state == State::AwaitFile {
            self.state = State::First;
        }
    }

    /// Feeds the first packet's payload of the next message of the answer.
    pub fn on_message(&mut self, payload: &[u8]) -> Result<(), BadReply> {
        let bad = |e: String| BadReply(e);
        self.state = match self.state {
            State::Done => return Err(bad("message after the end of the answer".into())),
            State::First if self.shape == Shape::OnePacket => State::Done,
            State::First => match classify(payload).map_err(|e| bad(e.to_string()))? {
                ResponseKind::Ok if self.shape == Shape::Prepare => {
                    let p = parse_prepare_ok(payload).map_err(|e| bad(e.to_string()))?;
                    let columns = u64::from(p.num_columns);
                    let then = if columns > 0 {
                        After::Columns(columns)
                    } else {
                        After::Done
                    };
                    self.definitions(u64::from(p.num_params), then)
                }
                ResponseKind::Ok => {
                    let ok = parse_ok(payload, self.caps).map_err(|e| bad(e.to_string()))?;
                    self.status = Some(ok.status);
                    self.last_insert_id = ok.last_insert_id;
                    self.rows += ok.affected_rows;
                    if !ok.session_state.is_empty() {
                        if let Ok(changes) = parse_session_state(ok.session_state) {
                            if let Some(g) = last_gtid(&changes).filter(|g| !g.is_empty()) {
                                self.last_gtid = Some(String::from_utf8_lossy(g).into_owned());
                            }
                        }
                    }
                    self.after_end(ok.status)
                }
                ResponseKind::Err => {
                    self.error = true;
                    self.error_code = payload.get(1..3).map(|c| u16::from_le_bytes([c[0], c[1]]));
                    State::Done
                }
                ResponseKind::Eof => {
                    return Err(bad("EOF where an answer should start".into()));
                }
                ResponseKind::LocalInfile if self.shape == Shape::Results => State::AwaitFile,
                ResponseKind::LocalInfile => {
                    return Err(bad("LOCAL INFILE request where none can come".into()));
                }
                ResponseKind::ResultSet { columns } => self.definitions(columns, After::Rows),
            },
            State::Definitions { left, then } => {
                if payload.first() == Some(&0xFF) {
                    self.error = true;
                    State::Done
                } else if left > 1 {
                    State::Definitions {
                        left: left - 1,
                        then,
                    }
                } else if self.caps.contains(C::CLIENT_DEPRECATE_EOF) {
                    self.follow(then)
                } else {
                    State::DefinitionsEof { then }
                }
            }
            State::DefinitionsEof { then } => {
                let status = status_flags(payload);
                match status {
                    // COM_STMT_EXECUTE that opened a cursor: the rows come
                    // later, with COM_STMT_FETCH; the answer ends here.
                    Some(s) if s.contains(StatusFlags::SERVER_STATUS_CURSOR_EXISTS) => {
                        self.status = Some(s);
                        State::Done
                    }
                    _ => self.follow(then),
                }
            }
            State::AwaitFile => {
                return Err(bad("server message while the client sends a file".into()))
            }
            State::Rows => {
                if payload.first() == Some(&0xFF) {
                    self.error = true;
                    State::Done
                } else if is_result_set_end(payload, self.caps) {
                    let status =
                        status_flags(payload).ok_or_else(|| bad("malformed EOF".into()))?;
                    self.status = Some(status);
                    if matches!(self.shape, Shape::FieldList | Shape::Fetch) {
                        State::Done
                    } else {
                        self.after_end(status)
                    }
                } else {
                    self.rows += 1;
                    State::Rows
                }
            }
        };
        Ok(())
    }

    fn definitions(&self, n: u64, then: After) -> State {
        if n == 0 {
            self.follow(then)
        } else {
            State::Definitions { left: n, then }
        }
    }

    fn follow(&self, then: After) -> State {
        match then {
            After::Rows => State::Rows,
            After::Columns(n) => self.definitions(n, After::Done),
            After::Done => State::Done,
        }
    }

    fn after_end(&self, status: StatusFlags) -> State {
        if status.contains(StatusFlags::SERVER_MORE_RESULTS_EXISTS) {
            State::First
        } else {
            State::Done
        }
    }

    /// After the answer: the client is in a transaction (or autocommit is
    /// off, which opens one with every statement), so its server connection
    /// must stay.
    pub fn holds_connection(&self) -> bool {
        self.status.is_some_and(|s| {
            s.contains(StatusFlags::SERVER_STATUS_IN_TRANS)
                || !s.contains(StatusFlags::SERVER_STATUS_AUTOCOMMIT)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::response::{build_eof, build_ok, build_ok_as_eof, OkPacket};

    const AUTOCOMMIT: StatusFlags = StatusFlags::SERVER_STATUS_AUTOCOMMIT;

    fn ok(status: StatusFlags, last_insert_id: u64) -> Vec<u8> {
        build_ok(
            &OkPacket {
                affected_rows: 1,
                last_insert_id,
                status,
                warnings: 0,
                info: b"",
                session_state: b"",
            },
            C::CLIENT_PROTOCOL_41 | C::CLIENT_TRANSACTIONS,
        )
    }

    fn ok_eof(status: StatusFlags) -> Vec<u8> {
        build_ok_as_eof(
            &OkPacket {
                affected_rows: 0,
                last_insert_id: 0,
                status,
                warnings: 0,
                info: b"",
                session_state: b"",
            },
            C::CLIENT_PROTOCOL_41 | C::CLIENT_DEPRECATE_EOF,
        )
    }

    fn feed(r: &mut Reply, msgs: &[Vec<u8>]) {
        for (i, m) in msgs.iter().enumerate() {
            assert!(!r.is_done(), "done before message {i}");
            r.on_message(m).unwrap();
        }
    }

    #[test]
    fn an_ok_ends_it_and_carries_the_insert_id() {
        let mut r = Reply::new(Shape::Results, C::CLIENT_PROTOCOL_41);
        feed(&mut r, &[ok(AUTOCOMMIT, 42)]);
        assert!(r.is_done());
        assert_eq!(r.last_insert_id, 42);
        assert!(!r.holds_connection());
    }

    #[test]
    fn an_execute_that_opens_a_cursor_ends_after_its_definitions() {
        use crate::codec::response::build_eof;
        let caps = C::CLIENT_PROTOCOL_41;
        let mut r = Reply::new(Shape::Results, caps);
        r.on_message(&[0x01]).unwrap(); // one column
        r.on_message(b"\x03def").unwrap(); // its definition
        let cursor =
            StatusFlags::SERVER_STATUS_CURSOR_EXISTS | StatusFlags::SERVER_STATUS_AUTOCOMMIT;
        r.on_message(&build_eof(0, cursor)).unwrap();
        assert!(r.is_done(), "no rows follow: they are fetched");
        let mut plain = Reply::new(Shape::Results, caps);
        plain.on_message(&[0x01]).unwrap();
        plain.on_message(b"\x03def").unwrap();
        plain
            .on_message(&build_eof(0, StatusFlags::SERVER_STATUS_AUTOCOMMIT))
            .unwrap();
        assert!(
            !plain.is_done(),
            "rows follow a plain result set's definitions"
        );
    }

    #[test]
    fn a_fetch_answer_is_binary_rows_up_to_an_eof() {
        use crate::codec::response::build_eof;
        let caps = C::CLIENT_PROTOCOL_41;
        let mut r = Reply::new(Shape::Fetch, caps);
        // Binary rows: a 0x00 header, the NULL bitmap, the values.
        for row in [
            &[0x00, 0x00, 0x01, 0x00, 0x00, 0x00][..],
            &[0x00, 0x00, 0x02, 0, 0, 0],
        ] {
            r.on_message(row).unwrap();
            assert!(!r.is_done(), "a row is not the end");
        }
        let last_row_sent =
            StatusFlags::SERVER_STATUS_LAST_ROW_SENT | StatusFlags::SERVER_STATUS_AUTOCOMMIT;
        r.on_message(&build_eof(0, last_row_sent)).unwrap();
        assert!(r.is_done());
        assert_eq!(r.status, Some(last_row_sent));
        let mut e = Reply::new(Shape::Fetch, caps);
        e.on_message(&[0xFF, 0x43, 0x04, b'#', b'H', b'Y', b'0', b'0', b'0', b'x'])
            .unwrap();
        assert!(e.is_done() && e.error);
    }

    #[test]
    fn a_transaction_or_autocommit_off_holds_the_connection() {
        let mut r = Reply::new(Shape::Results, C::CLIENT_PROTOCOL_41);
        feed(
            &mut r,
            &[ok(AUTOCOMMIT | StatusFlags::SERVER_STATUS_IN_TRANS, 0)],
        );
        assert!(r.holds_connection());
        let mut r = Reply::new(Shape::Results, C::CLIENT_PROTOCOL_41);
        feed(&mut r, &[ok(StatusFlags::empty(), 0)]);
        assert!(r.holds_connection(), "autocommit off");
    }

    #[test]
    fn a_result_set_with_eofs_ends_at_its_last_eof() {
        let mut r = Reply::new(Shape::Results, C::CLIENT_PROTOCOL_41);
        let coldef = vec![3, b'd', b'e', b'f'];
        let row = vec![1, b'7'];
        feed(
            &mut r,
            &[
                vec![2],
                coldef.clone(),
                coldef,
                build_eof(0, AUTOCOMMIT),
                row.clone(),
                row,
            ],
        );
        assert!(!r.is_done());
        r.on_message(&build_eof(0, AUTOCOMMIT)).unwrap();
        assert!(r.is_done());
        assert!(!r.error);
    }

    #[test]
    fn with_deprecate_eof_there_is_no_eof_after_the_columns() {
        let caps = C::CLIENT_PROTOCOL_41 | C::CLIENT_DEPRECATE_EOF;
        let mut r = Reply::new(Shape::Results, caps);
        feed(&mut r, &[vec![1], vec![3, b'd', b'e', b'f'], vec![1, b'x']]);
        r.on_message(&ok_eof(AUTOCOMMIT)).unwrap();
        assert!(r.is_done());
    }

    #[test]
    fn more_results_continue_to_the_next_result() {
        let caps = C::CLIENT_PROTOCOL_41 | C::CLIENT_DEPRECATE_EOF;
        let mut r = Reply::new(Shape::Results, caps);
        let more = AUTOCOMMIT | StatusFlags::SERVER_MORE_RESULTS_EXISTS;
        feed(&mut r, &[vec![1], vec![3, b'd', b'e', b'f'], ok_eof(more)]);
        assert!(!r.is_done(), "a second result follows");
        r.on_message(&ok(AUTOCOMMIT, 0)).unwrap();
        assert!(r.is_done());
    }

    #[test]
    fn an_error_in_the_rows_ends_it() {
        let mut r = Reply::new(
            Shape::Results,
            C::CLIENT_PROTOCOL_41 | C::CLIENT_DEPRECATE_EOF,
        );
        feed(&mut r, &[vec![1], vec![3, b'd', b'e', b'f'], vec![1, b'x']]);
        r.on_message(&[0xFF, 0x10, 0x04, b'#', b'H', b'Y', b'0', b'0', b'0', b'x'])
            .unwrap();
        assert!(r.is_done() && r.error);
    }

    #[test]
    fn prepare_ok_is_followed_by_params_then_columns() {
        // statement 1, 2 columns, 1 param, no EOFs (DEPRECATE_EOF).
        let prepare_ok = vec![0, 1, 0, 0, 0, 2, 0, 1, 0, 0, 0, 0];
        let caps = C::CLIENT_PROTOCOL_41 | C::CLIENT_DEPRECATE_EOF;
        let mut r = Reply::new(Shape::Prepare, caps);
        let def = vec![3, b'd', b'e', b'f'];
        feed(&mut r, &[prepare_ok, def.clone(), def.clone()]);
        assert!(!r.is_done());
        r.on_message(&def).unwrap();
        assert!(r.is_done());
    }

    #[test]
    fn one_packet_answers_and_field_lists() {
        let mut r = Reply::new(Shape::OnePacket, C::CLIENT_PROTOCOL_41);
        feed(&mut r, &[b"Uptime: 5".to_vec()]);
        assert!(r.is_done());
        let mut r = Reply::new(Shape::FieldList, C::CLIENT_PROTOCOL_41);
        feed(&mut r, &[vec![3, b'd', b'e', b'f']]);
        r.on_message(&build_eof(0, AUTOCOMMIT)).unwrap();
        assert!(r.is_done());
    }

    #[test]
    fn a_local_infile_request_waits_for_the_file_then_an_ok() {
        let mut r = Reply::new(Shape::Results, C::CLIENT_PROTOCOL_41);
        r.on_message(b"\xFB/tmp/data.csv").unwrap();
        assert!(r.wants_file() && !r.is_done());
        assert!(
            r.on_message(&ok(AUTOCOMMIT, 0)).is_err(),
            "not before the file"
        );
        r.file_sent();
        r.on_message(&ok(AUTOCOMMIT, 0)).unwrap();
        assert!(r.is_done());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut r = Reply::new(Shape::Results, C::CLIENT_PROTOCOL_41);
        assert!(r.on_message(&[]).is_err());
        let mut r = Reply::new(Shape::Results, C::CLIENT_PROTOCOL_41);
        assert!(r.on_message(&[0xFE]).is_err());
    }
}
