//! Server-to-client messages: the ones Fulcrum writes itself (errors, auth,
//! parameter status, synthetic completions) and the few fields it reads from
//! the server's messages (ready-for-query status, SQLSTATE, command tags).

use bytes::{BufMut, BytesMut};

use super::frame::put_header;

/// SQLSTATE codes Fulcrum emits itself.
pub mod sqlstate {
    pub const PROTOCOL_VIOLATION: &str = "08P01";
    pub const CONNECTION_FAILURE: &str = "08006";
    /// transaction_resolution_unknown: a COMMIT (or an autocommit write)
    /// was in flight when its server connection died; it may have committed.
    pub const TRANSACTION_RESOLUTION_UNKNOWN: &str = "08007";
    pub const INVALID_PASSWORD: &str = "28P01";
    pub const INVALID_AUTHORIZATION: &str = "28000";
    pub const TOO_MANY_CONNECTIONS: &str = "53300";
    pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
    pub const CANNOT_CONNECT_NOW: &str = "57P03";
    pub const ADMIN_SHUTDOWN: &str = "57P01";
    pub const IN_FAILED_TRANSACTION: &str = "25P02";
    /// A write refused by a server in recovery (or a read-only transaction).
    pub const READ_ONLY_SQL_TRANSACTION: &str = "25006";
    pub const QUERY_CANCELED: &str = "57014";
    pub const INVALID_CATALOG_NAME: &str = "3D000";
}

pub const AUTH_OK: i32 = 0;
pub const AUTH_CLEARTEXT: i32 = 3;
pub const AUTH_MD5: i32 = 5;
pub const AUTH_SASL: i32 = 10;
pub const AUTH_SASL_CONTINUE: i32 = 11;
pub const AUTH_SASL_FINAL: i32 = 12;

fn cstr(out: &mut BytesMut, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.put_u8(0);
}

/// ErrorResponse with severity, SQLSTATE and message (V duplicates S, as servers since 9.6 do).
pub fn error_response(out: &mut BytesMut, severity: &str, code: &str, message: &str) {
    // Four fields of (type byte, text, NUL), then the terminating NUL.
    let body = 2 * (severity.len() + 2) + (code.len() + 2) + (message.len() + 2) + 1;
    put_header(out, b'E', body);
    out.put_u8(b'S');
    cstr(out, severity);
    out.put_u8(b'V');
    cstr(out, severity);
    out.put_u8(b'C');
    cstr(out, code);
    out.put_u8(b'M');
    cstr(out, message);
    out.put_u8(0);
}

pub fn auth_request(out: &mut BytesMut, kind: i32, extra: &[u8]) {
    put_header(out, b'R', 4 + extra.len());
    out.put_i32(kind);
    out.extend_from_slice(extra);
}

/// AuthenticationSASL listing one mechanism.
pub fn auth_sasl(out: &mut BytesMut, mechanism: &str) {
    auth_sasl_mechanisms(out, &[mechanism]);
}

/// AuthenticationSASL offering `mechanisms`, in order of preference.
pub fn auth_sasl_mechanisms(out: &mut BytesMut, mechanisms: &[&str]) {
    let mut extra = BytesMut::new();
    for m in mechanisms {
        cstr(&mut extra, m);
    }
    extra.put_u8(0);
    auth_request(out, AUTH_SASL, &extra);
}

pub fn parameter_status(out: &mut BytesMut, name: &str, value: &str) {
    put_header(out, b'S', name.len() + value.len() + 2);
    cstr(out, name);
    cstr(out, value);
}

pub fn backend_key_data(out: &mut BytesMut, process_id: i32, secret_key: i32) {
    put_header(out, b'K', 8);
    out.put_i32(process_id);
    out.put_i32(secret_key);
}

pub fn ready_for_query(out: &mut BytesMut, status: u8) {
    put_header(out, b'Z', 1);
    out.put_u8(status);
}

pub fn parse_complete(out: &mut BytesMut) {
    put_header(out, b'1', 0);
}

pub fn close_complete(out: &mut BytesMut) {
    put_header(out, b'3', 0);
}

pub fn bind_complete(out: &mut BytesMut) {
    put_header(out, b'2', 0);
}

pub fn no_data(out: &mut BytesMut) {
    put_header(out, b'n', 0);
}

/// ParameterDescription of a statement that takes no parameter.
pub fn parameter_description_none(out: &mut BytesMut) {
    put_header(out, b't', 2);
    out.put_u16(0);
}

pub fn command_complete(out: &mut BytesMut, tag: &str) {
    put_header(out, b'C', tag.len() + 1);
    cstr(out, tag);
}

/// A one-column, one-row answer of type `oid` (text format), without its
/// CommandComplete.
pub fn one_row(out: &mut BytesMut, name: &str, oid: i32, value: &str) {
    put_header(out, b'T', 2 + name.len() + 1 + 18);
    out.put_i16(1);
    cstr(out, name);
    out.put_i32(0);
    out.put_i16(0);
    out.put_i32(oid);
    // The type's size: bool 1, int4 4, text (and the rest here) varlena.
    out.put_i16(match oid {
        16 => 1,
        23 => 4,
        _ => -1,
    });
    out.put_i32(-1);
    out.put_i16(0);
    put_header(out, b'D', 2 + 4 + value.len());
    out.put_i16(1);
    out.put_i32(value.len() as i32);
    out.extend_from_slice(value.as_bytes());
}

/// RowDescription of one text column `name`, then one DataRow with `value`
/// (the answer to a `SHOW` Fulcrum gives itself).
pub fn one_text_row(out: &mut BytesMut, name: &str, value: &str) {
    one_row(out, name, 25, value);
}

/// Fields of an ErrorResponse or NoticeResponse body Fulcrum cares about.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ErrorFields {
    pub severity: String,
    pub code: String,
    pub message: String,
}

/// The channel a NotificationResponse body (the bytes after the header:
/// pid, channel, payload) names.
pub fn notification_channel(body: &[u8]) -> Option<&[u8]> {
    let rest = body.get(4..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    let payload = &rest[end + 1..];
    payload.iter().position(|&b| b == 0)?;
    Some(&rest[..end])
}

/// Reads S/V, C and M from an ErrorResponse body (the bytes after the header).
pub fn parse_error_fields(body: &[u8]) -> ErrorFields {
    let mut f = ErrorFields::default();
    let mut rest = body;
    while let Some((&kind, tail)) = rest.split_first() {
        if kind == 0 {
            break;
        }
        let Some(nul) = tail.iter().position(|&b| b == 0) else {
            break;
        };
        let value = String::from_utf8_lossy(&tail[..nul]).into_owned();
        match kind {
            b'V' => f.severity = value,
            b'S' if f.severity.is_empty() => f.severity = value,
            b'C' => f.code = value,
            b'M' => f.message = value,
            _ => {}
        }
        rest = &tail[nul + 1..];
    }
    f
}

/// Splits a ParameterStatus body into name and value.
pub fn parse_parameter_status(body: &[u8]) -> Option<(&str, &str)> {
    let nul = body.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&body[..nul]).ok()?;
    let rest = &body[nul + 1..];
    let nul2 = rest.iter().position(|&b| b == 0)?;
    let value = std::str::from_utf8(&rest[..nul2]).ok()?;
    Some((name, value))
}

/// The columns of a DataRow body: each `None` for SQL NULL. `None` when the
/// body is malformed (lengths past its end).
pub fn parse_data_row(body: &[u8]) -> Option<Vec<Option<&[u8]>>> {
    let count = u16::from_be_bytes(body.get(..2)?.try_into().ok()?) as usize;
    let mut rest = &body[2..];
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let len = i32::from_be_bytes(rest.get(..4)?.try_into().ok()?);
        rest = &rest[4..];
        if len < 0 {
            out.push(None);
        } else {
            let len = len as usize;
            out.push(Some(rest.get(..len)?));
            rest = &rest[len..];
        }
    }
    Some(out)
}

/// The command tag of a CommandComplete body, without its NUL.
pub fn command_tag(body: &[u8]) -> &[u8] {
    body.strip_suffix(b"\0").unwrap_or(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::frame::check_frame;

    #[test]
    fn a_notification_names_its_channel() {
        // pid 7, channel "orders", payload "42".
        let body = b"\0\0\0\x07orders\x0042\0";
        assert_eq!(notification_channel(body), Some(&b"orders"[..]));
        assert_eq!(
            notification_channel(b"\0\0\0\x07orders\0"),
            None,
            "no payload"
        );
        assert_eq!(notification_channel(b"\0\0"), None, "short");
    }

    #[test]
    fn error_response_round_trips() {
        let mut out = BytesMut::new();
        error_response(
            &mut out,
            "FATAL",
            "28P01",
            "password authentication failed for user \"x\"",
        );
        let h = check_frame(&out, 1 << 20).unwrap().unwrap();
        assert_eq!(h.total, out.len());
        let f = parse_error_fields(&out[5..]);
        assert_eq!(f.severity, "FATAL");
        assert_eq!(f.code, "28P01");
        assert!(f.message.contains("password authentication failed"));
    }

    #[test]
    fn fixed_messages_have_exact_bytes() {
        let mut out = BytesMut::new();
        ready_for_query(&mut out, b'I');
        parse_complete(&mut out);
        close_complete(&mut out);
        assert_eq!(&out[..], b"Z\0\0\0\x05I1\0\0\0\x043\0\0\0\x04");
    }

    #[test]
    fn parameter_status_parses_back() {
        let mut out = BytesMut::new();
        parameter_status(&mut out, "TimeZone", "UTC");
        assert_eq!(check_frame(&out, 100).unwrap().unwrap().total, out.len());
        assert_eq!(parse_parameter_status(&out[5..]), Some(("TimeZone", "UTC")));
    }

    #[test]
    fn auth_and_key_data_lengths() {
        let mut out = BytesMut::new();
        auth_sasl(&mut out, "SCRAM-SHA-256");
        assert_eq!(&out[..], b"R\0\0\0\x17\0\0\0\x0aSCRAM-SHA-256\0\0");
        out.clear();
        auth_sasl_mechanisms(&mut out, &["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"]);
        assert_eq!(
            &out[..],
            b"R\0\0\0\x2a\0\0\0\x0aSCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0"
        );
        out.clear();
        backend_key_data(&mut out, 1, 2);
        assert_eq!(&out[..], b"K\0\0\0\x0c\0\0\0\x01\0\0\0\x02");
        out.clear();
        command_complete(&mut out, "SET");
        assert_eq!(command_tag(&out[5..]), b"SET");
    }

    #[test]
    fn data_rows_split_into_columns_with_nulls() {
        let body = [0, 3, 0, 0, 0, 1, b't', 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];
        assert_eq!(
            parse_data_row(&body),
            Some(vec![Some(&b"t"[..]), None, Some(&b""[..])])
        );
        assert_eq!(
            parse_data_row(&[0, 1, 0, 0, 0, 9, b'x']),
            None,
            "length past the end"
        );
        assert_eq!(parse_data_row(&[0]), None);
    }

    #[test]
    fn truncated_error_fields_do_not_panic() {
        let f = parse_error_fields(b"SERROR\0C2");
        assert_eq!(f.severity, "ERROR");
        assert_eq!(f.code, "");
    }
}
