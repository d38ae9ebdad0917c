//! Small helpers the session uses to talk to its client: reading one whole
//! command, and writing OK/ERR packets with the right sequence id.

use bytes::BytesMut;
use fulcrum_net::Connection;
use fulcrum_tls::ClientStream;
use mysql_common::constants::{CapabilityFlags as C, StatusFlags};
use tokio::io::AsyncWriteExt;

use super::error::SessionError;
use crate::codec::err::{build_err, build_error, ErrorCode};
use crate::codec::packet::{scan_message, write_packet, MessageSpan, PacketError};
use crate::codec::response::{build_ok, OkPacket};

/// Polls until the client's buffer holds one whole message: its span, or
/// the scan's error (for [`refuse_message`]), or the client gone. Between
/// commands the client holds no read buffer while it sends nothing
/// (`poll_read_idle`).
pub fn poll_client_message(
    client: &mut Connection<ClientStream>,
    cx: &mut std::task::Context<'_>,
    max: usize,
) -> std::task::Poll<Result<Result<MessageSpan, PacketError>, SessionError>> {
    use std::task::Poll::{Pending, Ready};
    loop {
        match scan_message(&client.read_buf, max) {
            Ok(Some(span)) => return Ready(Ok(Ok(span))),
            Ok(None) => match client.poll_read_idle(cx) {
                Ready(Ok(0)) => return Ready(Err(SessionError::ClientGone)),
                Ready(Ok(_)) => {}
                Ready(Err(e)) => return Ready(Err(e.into())),
                Pending => return Pending,
            },
            Err(e) => return Ready(Ok(Err(e))),
        }
    }
}

/// A message the scan refused: ERR 1153 (over `max_message_size`) or 1043
/// (malformed) goes to the client, and the session ends.
pub async fn refuse_message(client: &mut Connection<ClientStream>, e: PacketError) -> SessionError {
    let seq = client.read_buf.get(3).copied().unwrap_or(0).wrapping_add(1);
    let (code, msg) = match e {
        PacketError::TooLarge { .. } => (
            crate::codec::err::codes::NET_PACKET_TOO_LARGE,
            format!("fulcrum: {e} (max_message_size)"),
        ),
        _ => (crate::codec::err::codes::HANDSHAKE, format!("fulcrum: {e}")),
    };
    send_error(client.stream_mut(), seq, code, &msg).await;
    SessionError::Refused(msg)
}

/// Reads until `buf` holds one whole client message; returns its span.
/// An oversized or malformed message gets ERR 1153 / 1043.
pub async fn read_client_message(
    client: &mut Connection<ClientStream>,
    max: usize,
) -> Result<MessageSpan, SessionError> {
    match std::future::poll_fn(|cx| poll_client_message(client, cx, max)).await? {
        Ok(span) => Ok(span),
        Err(e) => Err(refuse_message(client, e).await),
    }
}

/// Appends an OK packet.
pub fn put_ok(out: &mut BytesMut, seq: u8, caps: C, status: StatusFlags) {
    let ok = build_ok(
        &OkPacket {
            affected_rows: 0,
            last_insert_id: 0,
            status,
            warnings: 0,
            info: b"",
            session_state: b"",
        },
        caps,
    );
    write_packet(out, seq, &ok);
}

/// Appends an ERR packet.
pub fn put_error(out: &mut BytesMut, seq: u8, code: ErrorCode, message: &str) {
    write_packet(out, seq, &build_error(code, message));
}

/// Appends an ERR packet with any code and state.
pub fn put_err(out: &mut BytesMut, seq: u8, code: u16, state: [u8; 5], message: &str) {
    write_packet(out, seq, &build_err(code, state, message));
}

/// Sends an ERR packet now, ignoring write errors (the client may be gone).
pub async fn send_error(client: &mut ClientStream, seq: u8, code: ErrorCode, message: &str) {
    let mut out = BytesMut::new();
    put_error(&mut out, seq, code, message);
    let _ = client.write_all(&out).await;
    let _ = client.flush().await;
}

/// A column's type in a result set Fulcrum answers itself.
#[derive(Debug, Clone, Copy)]
pub struct ColumnType {
    pub code: u8,
    pub charset: u16,
    pub length: u32,
    pub flags: u16,
}

impl ColumnType {
    /// VAR_STRING in utf8_general_ci.
    pub const TEXT: ColumnType = ColumnType {
        code: 0xfd,
        charset: 33,
        length: 1024,
        flags: 0,
    };
    /// BIGINT UNSIGNED NOT NULL, as the server types `CONNECTION_ID()`.
    pub const UNSIGNED_BIGINT: ColumnType = ColumnType {
        code: 0x08,
        charset: 63,
        length: 10,
        flags: 0x0001 | 0x0020 | 0x0080,
    };
}

/// A text result set of one column `name` and one row `value` (Fulcrum's
/// own answers to `SELECT @@fulcrum_position`, `SHOW fulcrum.consistency`).
pub fn put_one_row(
    out: &mut BytesMut,
    seq: u8,
    caps: C,
    status: StatusFlags,
    name: &str,
    value: &str,
) {
    put_one_row_of(out, (seq, caps, status), (name, ColumnType::TEXT), value)
}

/// `put_one_row` with the column's type.
pub fn put_one_row_of(
    out: &mut BytesMut,
    (seq, caps, status): (u8, C, StatusFlags),
    (name, ty): (&str, ColumnType),
    value: &str,
) {
    use crate::codec::response::{build_eof, build_ok_as_eof};
    use crate::codec::wire::{write_lenenc_int, write_lenenc_str};
    let mut seq = seq;
    let mut next = || {
        let s = seq;
        seq = seq.wrapping_add(1);
        s
    };
    write_packet(out, next(), &[1]);
    let mut def = Vec::new();
    for part in ["def", "", "", "", name, name] {
        write_lenenc_str(&mut def, part.as_bytes());
    }
    write_lenenc_int(&mut def, 0x0c);
    def.extend_from_slice(&ty.charset.to_le_bytes());
    def.extend_from_slice(&ty.length.to_le_bytes());
    def.push(ty.code);
    def.extend_from_slice(&ty.flags.to_le_bytes());
    def.push(0);
    def.extend_from_slice(&[0, 0]);
    write_packet(out, next(), &def);
    let deprecate_eof = caps.contains(C::CLIENT_DEPRECATE_EOF);
    if !deprecate_eof {
        write_packet(out, next(), &build_eof(0, status));
    }
    let mut row = Vec::new();
    write_lenenc_str(&mut row, value.as_bytes());
    write_packet(out, next(), &row);
    if deprecate_eof {
        let ok = build_ok_as_eof(
            &OkPacket {
                status,
                ..Default::default()
            },
            caps,
        );
        write_packet(out, next(), &ok);
    } else {
        write_packet(out, next(), &build_eof(0, status));
    }
}
