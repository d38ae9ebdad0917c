//! ERR packets: the ones Fulcrum sends in a server's place (built with
//! mysql_common's `ErrPacket`), reading a server's, and the few error codes
//! Fulcrum itself raises (mysql_common has no table of server error codes).
//! See <https://dev.mysql.com/doc/dev/mysql-server/latest/page_protocol_basic_err_packet.html>.

use std::borrow::Cow;

use mysql_common::packets::{ErrPacket as McErr, ServerError, SqlState};
use mysql_common::proto::MySerialize;

use super::wire::{DecodeError, Reader};

/// A server error code and the SQL state that goes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode {
    pub code: u16,
    pub state: [u8; 5],
}

macro_rules! codes {
    ($($(#[$doc:meta])* $name:ident = $code:literal, $state:literal;)*) => {
        $( $(#[$doc])* pub const $name: ErrorCode = ErrorCode { code: $code, state: *$state }; )*
    };
}

/// Server error codes (as in MySQL's `mysqld_error.h`, shared by MariaDB).
pub mod codes {
    use super::ErrorCode;
    codes! {
        /// ER_CON_COUNT_ERROR: too many connections.
        CON_COUNT = 1040, b"08004";
        /// ER_HANDSHAKE_ERROR: bad handshake.
        HANDSHAKE = 1043, b"08S01";
        /// ER_DBACCESS_DENIED_ERROR: access denied to a database.
        DBACCESS_DENIED = 1044, b"42000";
        /// ER_ACCESS_DENIED_ERROR: wrong user or password.
        ACCESS_DENIED = 1045, b"28000";
        /// ER_UNKNOWN_COM_ERROR: unknown command.
        UNKNOWN_COM = 1047, b"08S01";
        /// ER_BAD_DB_ERROR: unknown database.
        BAD_DB = 1049, b"42000";
        /// ER_SERVER_SHUTDOWN: server shutdown in progress.
        SERVER_SHUTDOWN = 1053, b"08S01";
        /// ER_CONNECTION_KILLED: the connection was killed.
        CONNECTION_KILLED = 1927, b"70100";
        /// ER_PARSE_ERROR: a syntax error (also what a server answers a second
        /// statement from a client without CLIENT_MULTI_STATEMENTS).
        PARSE = 1064, b"42000";
        /// ER_UNKNOWN_ERROR.
        UNKNOWN = 1105, b"HY000";
        /// ER_NET_PACKET_TOO_LARGE: packet bigger than max_allowed_packet.
        NET_PACKET_TOO_LARGE = 1153, b"08S01";
        /// ER_NET_READ_ERROR: error reading communication packets.
        NET_READ = 1158, b"08S01";
        /// ER_NOT_SUPPORTED_YET: this version does not support it yet.
        NOT_SUPPORTED_YET = 1235, b"42000";
        /// ER_UNKNOWN_STMT_HANDLER: unknown prepared statement handler.
        UNKNOWN_STMT_HANDLER = 1243, b"HY000";
        /// ER_MAX_PREPARED_STMT_COUNT_REACHED: too many prepared statements.
        MAX_PREPARED_STMT_COUNT = 1461, b"42000";
        /// ER_NOT_SUPPORTED_AUTH_MODE: client does not support the auth protocol.
        NOT_SUPPORTED_AUTH_MODE = 1251, b"08004";
        /// ER_OPTION_PREVENTS_STATEMENT: e.g. a write on a --read-only server.
        OPTION_PREVENTS_STATEMENT = 1290, b"HY000";
        /// ER_QUERY_INTERRUPTED: query execution was interrupted.
        QUERY_INTERRUPTED = 1317, b"70100";
        /// ER_SECURE_TRANSPORT_REQUIRED: a plain connection where TLS is required.
        INSECURE_TRANSPORT = 3159, b"HY000";
        /// ER_MALFORMED_PACKET: a command too short for its fields.
        MALFORMED_PACKET = 1835, b"HY000";
        /// ER_CLIENT_INTERACTION_TIMEOUT: disconnected for inactivity.
        CLIENT_INTERACTION_TIMEOUT = 4031, b"HY000";
    }
}

/// An ERR packet, its message borrowed from the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrPacket<'a> {
    pub code: u16,
    /// Absent when the server sent no `#` marker (errors sent before the
    /// capabilities are agreed, such as "Too many connections" at connect).
    pub sql_state: Option<[u8; 5]>,
    pub message: &'a [u8],
}

impl ErrPacket<'_> {
    pub fn message_str(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(self.message)
    }
}

/// Builds an ERR packet with a SQL state (the PROTOCOL_41 form).
pub fn build_err(code: u16, sql_state: [u8; 5], message: &str) -> Vec<u8> {
    let packet = McErr::Error(ServerError::new(
        code,
        Some(SqlState::new(sql_state)),
        message.as_bytes(),
    ));
    let mut out = Vec::with_capacity(9 + message.len());
    packet.serialize(&mut out);
    out
}

/// Builds an ERR packet for one of the [`codes`].
pub fn build_error(e: ErrorCode, message: &str) -> Vec<u8> {
    build_err(e.code, e.state, message)
}

/// Parses an ERR packet: 0xFF, code, then `#` and a 5-byte SQL state when the
/// marker is there, then the message to the end.
pub fn parse_err(payload: &[u8]) -> Result<ErrPacket<'_>, DecodeError> {
    let mut r = Reader::new(payload);
    if r.u8("ERR header")? != 0xFF {
        return Err(DecodeError::Malformed("not an ERR packet"));
    }
    let code = r.u16("error code")?;
    let sql_state = match r.rest().first() {
        Some(b'#') => {
            r.u8("SQL state marker")?;
            Some(r.array("SQL state")?)
        }
        _ => None,
    };
    Ok(ErrPacket {
        code,
        sql_state,
        message: r.take_rest(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mysql_common::constants::CapabilityFlags as C;
    use mysql_common::io::ParseBuf;
    use mysql_common::proto::MyDeserialize;

    #[test]
    fn exact_bytes_and_round_trip() {
        let out = build_error(codes::ACCESS_DENIED, "Access denied for user 'x'");
        let mut want = vec![0xFF, 0x15, 0x04, b'#'];
        want.extend_from_slice(b"28000Access denied for user 'x'");
        assert_eq!(out, want);
        let e = parse_err(&out).unwrap();
        assert_eq!((e.code, e.sql_state), (1045, Some(*b"28000")));
        assert_eq!(e.message_str(), "Access denied for user 'x'");
    }

    #[test]
    fn mysql_common_reads_ours() {
        let out = build_err(1243, *b"HY000", "Unknown prepared statement handler (7)");
        let McErr::Error(e) =
            McErr::deserialize(C::CLIENT_PROTOCOL_41, &mut ParseBuf(&out)).unwrap()
        else {
            panic!("progress report")
        };
        assert_eq!(e.error_code(), 1243);
        assert_eq!(e.sql_state_ref().unwrap().as_bytes(), *b"HY000");
        assert_eq!(e.message_ref(), b"Unknown prepared statement handler (7)");
    }

    #[test]
    fn error_without_sql_state_marker() {
        let e = parse_err(b"\xff\x10\x04Too many connections").unwrap();
        assert_eq!((e.code, e.sql_state), (1040, None));
        assert_eq!(e.message, b"Too many connections");
        let e = parse_err(b"\xff\x10\x04").unwrap();
        assert_eq!(e.message, b"");
    }

    #[test]
    fn truncated_err_packets() {
        assert_eq!(parse_err(b""), Err(DecodeError::Truncated("ERR header")));
        assert_eq!(
            parse_err(b"\xff\x10"),
            Err(DecodeError::Truncated("error code"))
        );
        assert_eq!(
            parse_err(b"\xff\x10\x04#280"),
            Err(DecodeError::Truncated("SQL state"))
        );
        assert_eq!(
            parse_err(b"\x00\x10\x04"),
            Err(DecodeError::Malformed("not an ERR packet"))
        );
    }
}
