//! The streaming replication protocol's messages a logical change stream
//! reads and writes (inside CopyData, after `START_REPLICATION`): XLogData
//! (`w`) and the primary's keepalive (`k`) in, the standby status update
//! (`r`) out; and the tables named by a `test_decoding` change line. Pure
//! functions over bytes.
//! See <https://www.postgresql.org/docs/15/protocol-replication.html>.

use bytes::{BufMut, BytesMut};

/// One message of the stream (the body of a CopyData frame).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamMessage<'a> {
    /// `w`: WAL data; for logical decoding, one line of the output plugin.
    XLogData {
        /// Where the data starts in the WAL.
        start: u64,
        /// The server's WAL end when it sent this.
        end: u64,
        data: &'a [u8],
    },
    /// `k`: the primary's keepalive; `reply`: it wants a status update now.
    Keepalive { end: u64, reply: bool },
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Reads a CopyData body of the replication stream; `None` for a message
/// too short or of a kind a logical stream does not read.
pub fn parse_stream_message(body: &[u8]) -> Option<StreamMessage<'_>> {
    match body.first()? {
        // w, dataStart, walEnd, sendTime, data
        b'w' => Some(StreamMessage::XLogData {
            start: u64_at(body, 1)?,
            end: u64_at(body, 9)?,
            data: body.get(25..)?,
        }),
        // k, walEnd, sendTime, replyRequested
        b'k' => Some(StreamMessage::Keepalive {
            end: u64_at(body, 1)?,
            reply: *body.get(17)? != 0,
        }),
        _ => None,
    }
}

/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;

/// Now, as the replication protocol counts time (microseconds since
/// 2000-01-01 UTC).
pub fn pg_now_micros() -> i64 {
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    unix - PG_EPOCH_OFFSET_MICROS
}

/// Appends a CopyData frame with a standby status update: `lsn` written,
/// flushed and applied (the slot may advance to it), at `now` (see
/// [`pg_now_micros`]), asking no reply.
pub fn put_standby_status(out: &mut BytesMut, lsn: u64, now: i64) {
    out.put_u8(b'd');
    out.put_i32(4 + 1 + 8 * 4 + 1);
    out.put_u8(b'r');
    out.put_u64(lsn);
    out.put_u64(lsn);
    out.put_u64(lsn);
    out.put_i64(now);
    out.put_u8(0);
}

/// The tables (schema, name), as written, that a `test_decoding` line
/// changes: `table s.t: INSERT: ...`, `UPDATE`, `DELETE`, and `table s.a,
/// s.b: TRUNCATE: ...` (several at once). Names quoted by the plugin
/// (`"odd name"`, `""` for a quote inside) come back unquoted. Empty for
/// other lines (`BEGIN n`, `COMMIT n`, `message: ...`) and for a line that
/// does not parse.
pub fn decoded_tables(line: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(mut rest) = line.strip_prefix(b"table ") else {
        return out;
    };
    loop {
        let Some((schema, after)) = identifier(rest) else {
            return Vec::new();
        };
        let Some(after) = after.strip_prefix(b".") else {
            return Vec::new();
        };
        let Some((name, after)) = identifier(after) else {
            return Vec::new();
        };
        out.push((schema, name));
        if let Some(more) = after.strip_prefix(b", ") {
            rest = more;
        } else if after.starts_with(b":") {
            return out;
        } else {
            return Vec::new();
        }
    }
}

/// One identifier as `quote_identifier` writes it, and what follows it.
fn identifier(b: &[u8]) -> Option<(String, &[u8])> {
    if let Some(mut rest) = b.strip_prefix(b"\"") {
        let mut name = Vec::new();
        loop {
            let at = memchr::memchr(b'"', rest)?;
            name.extend_from_slice(&rest[..at]);
            rest = &rest[at + 1..];
            match rest.strip_prefix(b"\"") {
                Some(after) => {
                    name.push(b'"');
                    rest = after;
                }
                None => return Some((String::from_utf8(name).ok()?, rest)),
            }
        }
    }
    let end = b
        .iter()
        .position(|c| matches!(c, b'.' | b':' | b',' | b' '))
        .unwrap_or(b.len());
    if end == 0 {
        return None;
    }
    Some((std::str::from_utf8(&b[..end]).ok()?.to_owned(), &b[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str, n: &str) -> (String, String) {
        (s.to_owned(), n.to_owned())
    }

    #[test]
    fn xlogdata_and_keepalive_parse() {
        let mut w = vec![b'w'];
        w.extend_from_slice(&0x0100_0028u64.to_be_bytes());
        w.extend_from_slice(&0x0100_0030u64.to_be_bytes());
        w.extend_from_slice(&7i64.to_be_bytes());
        w.extend_from_slice(b"BEGIN 734");
        assert_eq!(
            parse_stream_message(&w),
            Some(StreamMessage::XLogData {
                start: 0x0100_0028,
                end: 0x0100_0030,
                data: b"BEGIN 734"
            })
        );
        let mut k = vec![b'k'];
        k.extend_from_slice(&42u64.to_be_bytes());
        k.extend_from_slice(&9i64.to_be_bytes());
        k.push(1);
        assert_eq!(
            parse_stream_message(&k),
            Some(StreamMessage::Keepalive {
                end: 42,
                reply: true
            })
        );
        k[17] = 0;
        assert_eq!(
            parse_stream_message(&k),
            Some(StreamMessage::Keepalive {
                end: 42,
                reply: false
            })
        );
        // Short or unknown: nothing.
        assert_eq!(parse_stream_message(&k[..17]), None);
        assert_eq!(parse_stream_message(&w[..24]), None);
        assert_eq!(parse_stream_message(b"x"), None);
        assert_eq!(parse_stream_message(b""), None);
    }

    #[test]
    fn the_status_update_is_a_copydata_frame_of_34_bytes() {
        let mut out = BytesMut::new();
        put_standby_status(&mut out, 0x0A0B, 5);
        assert_eq!(out.len(), 1 + 4 + 34);
        assert_eq!(out[0], b'd');
        assert_eq!(i32::from_be_bytes(out[1..5].try_into().unwrap()), 38);
        assert_eq!(out[5], b'r');
        for at in [6, 14, 22] {
            assert_eq!(
                u64::from_be_bytes(out[at..at + 8].try_into().unwrap()),
                0x0A0B
            );
        }
        assert_eq!(i64::from_be_bytes(out[30..38].try_into().unwrap()), 5);
        assert_eq!(out[38], 0);
    }

    #[test]
    fn pg_time_counts_from_2000() {
        // 2026 is more than 26 years after 2000.
        assert!(pg_now_micros() > 26 * 365 * 86_400 * 1_000_000);
    }

    #[test]
    fn change_lines_name_their_tables() {
        assert_eq!(
            decoded_tables(b"table public.t: INSERT: id[integer]:1 v[text]:'a'"),
            vec![t("public", "t")]
        );
        assert_eq!(
            decoded_tables(b"table s.t: UPDATE: id[integer]:1"),
            vec![t("s", "t")]
        );
        assert_eq!(
            decoded_tables(b"table public.t: DELETE: id[integer]:1"),
            vec![t("public", "t")]
        );
        assert_eq!(
            decoded_tables(b"table public.t: TRUNCATE: (no-flags)"),
            vec![t("public", "t")]
        );
        assert_eq!(
            decoded_tables(b"table public.a, s.b: TRUNCATE: restart_seqs"),
            vec![t("public", "a"), t("s", "b")]
        );
    }

    #[test]
    fn quoted_names_are_unquoted() {
        assert_eq!(
            decoded_tables(b"table public.\"odd name\": INSERT: x[int]:1"),
            vec![t("public", "odd name")]
        );
        assert_eq!(
            decoded_tables(b"table \"My Schema\".\"a.b: \"\"c\"\"\": DELETE: (no-tuple-data)"),
            vec![t("My Schema", "a.b: \"c\"")]
        );
        assert_eq!(
            decoded_tables(b"table \"S\".\"T\", public.u: TRUNCATE: (no-flags)"),
            vec![t("S", "T"), t("public", "u")]
        );
    }

    #[test]
    fn other_lines_name_nothing() {
        for line in [
            &b"BEGIN 734"[..],
            b"COMMIT 734",
            b"message: transactional: 1 prefix: p, sz: 1 content:x",
            b"table : INSERT",
            b"table public: INSERT: x",
            b"table public.\"unterminated: INSERT",
            b"table public.t",
            b"",
        ] {
            assert!(decoded_tables(line).is_empty(), "{line:?}");
        }
    }
}
