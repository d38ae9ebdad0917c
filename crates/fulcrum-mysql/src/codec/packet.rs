//! Packet framing: the 4-byte header (3-byte little-endian payload length, then
//! a sequence id), writing a payload as one or more packets, and finding and
//! reassembling a message that spans several packets (a payload of 16 MiB - 1
//! or more continues in the next packet, and one that is an exact multiple of
//! 0xFFFFFF ends with an empty packet).
//! See <https://dev.mysql.com/doc/dev/mysql-server/latest/page_protocol_basic_packets.html>.

use std::borrow::Cow;

use bytes::{BufMut, BytesMut};
use thiserror::Error;

/// Bytes in a packet header.
pub const HEADER_LEN: usize = 4;
/// The largest payload one packet carries (`mysql_common::constants::MAX_PAYLOAD_LEN`);
/// a packet this full says the message continues in the next one.
pub const MAX_PAYLOAD: usize = 0xFF_FFFF;

/// What a packet header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Payload length, not counting the header.
    pub len: usize,
    pub seq: u8,
}

impl Header {
    /// Header plus payload.
    pub fn total(&self) -> usize {
        HEADER_LEN + self.len
    }

    /// A full packet: the message continues in the next packet.
    pub fn continues(&self) -> bool {
        self.len == MAX_PAYLOAD
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PacketError {
    #[error("message of {len} bytes is over the limit of {max} bytes")]
    TooLarge { len: u64, max: u64 },
    #[error("packet out of order: expected sequence id {expected}, got {got}")]
    OutOfOrder { expected: u8, got: u8 },
}

/// Reads the header at the start of `buf`. `Ok(None)`: fewer than 4 bytes are
/// buffered. A declared payload length over `max` is rejected before any of
/// the payload is waited for.
pub fn check_packet(buf: &[u8], max: usize) -> Result<Option<Header>, PacketError> {
    let Some(&[a, b, c, seq]) = buf.first_chunk::<HEADER_LEN>() else {
        return Ok(None);
    };
    let len = u32::from_le_bytes([a, b, c, 0]) as usize;
    if len > max {
        return Err(PacketError::TooLarge {
            len: len as u64,
            max: max as u64,
        });
    }
    Ok(Some(Header { len, seq }))
}

/// Appends a header for a packet of `len` payload bytes (at most [`MAX_PAYLOAD`]).
pub fn put_header(out: &mut impl BufMut, len: usize, seq: u8) {
    debug_assert!(len <= MAX_PAYLOAD);
    out.put_slice(&(len as u32).to_le_bytes()[..3]);
    out.put_u8(seq);
}

/// Writes `payload` as packets starting at sequence id `seq`, splitting it at
/// [`MAX_PAYLOAD`] bytes and adding the empty terminating packet when it is an
/// exact multiple of that. Returns the sequence id the next packet takes.
pub fn write_packet(out: &mut impl BufMut, seq: u8, payload: &[u8]) -> u8 {
    let mut seq = seq;
    let mut rest = payload;
    loop {
        let n = rest.len().min(MAX_PAYLOAD);
        put_header(out, n, seq);
        out.put_slice(&rest[..n]);
        seq = seq.wrapping_add(1);
        rest = &rest[n..];
        if n < MAX_PAYLOAD {
            return seq;
        }
    }
}

/// Packets [`write_packet`] uses for a payload of `len` bytes.
pub fn packet_count(len: usize) -> usize {
    len / MAX_PAYLOAD + 1
}

/// The payload of the last packet of `packets`, whole packets back to
/// back (a stored answer); `None` when they do not end on a packet's end.
pub fn last_packet_payload(packets: &[u8]) -> Option<std::ops::Range<usize>> {
    let (mut p, mut last) = (0usize, None);
    while p < packets.len() {
        let h = packets.get(p..p + HEADER_LEN)?;
        let len = u32::from_le_bytes([h[0], h[1], h[2], 0]) as usize;
        let end = p + HEADER_LEN + len;
        if end > packets.len() {
            return None;
        }
        last = Some(p + HEADER_LEN..end);
        p = end;
    }
    last
}

/// Where a whole (possibly multi-packet) message lies at the start of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageSpan {
    /// Bytes of the buffer the message takes, headers included.
    pub total: usize,
    /// Payload bytes once the headers are removed.
    pub payload_len: usize,
    pub packets: usize,
    pub first_seq: u8,
    pub last_seq: u8,
}

/// Finds the message at the start of `buf` without copying it. `Ok(None)`: not
/// all of it is buffered yet. Rejects a message whose payload would exceed
/// `max` (checked packet by packet, so a client cannot make Fulcrum wait for
/// an oversized message) and sequence ids that are not consecutive.
pub fn scan_message(buf: &[u8], max: usize) -> Result<Option<MessageSpan>, PacketError> {
    let mut at = 0;
    let mut payload_len = 0usize;
    let mut packets = 0;
    let mut first_seq = 0;
    let mut expected = None;
    loop {
        let Some(h) = check_packet(&buf[at..], MAX_PAYLOAD)? else {
            return Ok(None);
        };
        if let Some(expected) = expected {
            if h.seq != expected {
                return Err(PacketError::OutOfOrder {
                    expected,
                    got: h.seq,
                });
            }
        } else {
            first_seq = h.seq;
        }
        payload_len += h.len;
        if payload_len > max {
            return Err(PacketError::TooLarge {
                len: payload_len as u64,
                max: max as u64,
            });
        }
        if buf.len() - at < h.total() {
            return Ok(None);
        }
        at += h.total();
        packets += 1;
        if !h.continues() {
            return Ok(Some(MessageSpan {
                total: at,
                payload_len,
                packets,
                first_seq,
                last_seq: h.seq,
            }));
        }
        expected = Some(h.seq.wrapping_add(1));
    }
}

/// The whole messages at the start of a buffer, in order, each split off
/// as its own buffer without a copy (a transaction's logged commands, sent
/// again); ends at the first message not whole or not valid (see
/// [`scan_message`]).
pub struct Messages {
    buf: BytesMut,
    max: usize,
}

impl Messages {
    pub fn new(buf: BytesMut, max: usize) -> Messages {
        Messages { buf, max }
    }
}

impl Iterator for Messages {
    type Item = (BytesMut, MessageSpan);

    fn next(&mut self) -> Option<(BytesMut, MessageSpan)> {
        let span = scan_message(&self.buf, self.max).ok()??;
        Some((self.buf.split_to(span.total), span))
    }
}

/// A reassembled message: borrowed when it fits one packet, copied otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message<'a> {
    pub payload: Cow<'a, [u8]>,
    pub span: MessageSpan,
}

/// Reassembles the message at the start of `buf` (see [`scan_message`]).
pub fn reassemble(buf: &[u8], max: usize) -> Result<Option<Message<'_>>, PacketError> {
    let Some(span) = scan_message(buf, max)? else {
        return Ok(None);
    };
    let payload = if span.packets == 1 {
        Cow::Borrowed(&buf[HEADER_LEN..span.total])
    } else {
        let mut out = Vec::with_capacity(span.payload_len);
        let mut at = 0;
        while at < span.total {
            let len = u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], 0]) as usize;
            out.extend_from_slice(&buf[at + HEADER_LEN..at + HEADER_LEN + len]);
            at += HEADER_LEN + len;
        }
        Cow::Owned(out)
    };
    Ok(Some(Message { payload, span }))
}

/// The payload of a whole client message (its packets joined; borrowed
/// when it is one packet, the usual case).
pub fn payload_of<'a>(msg: &'a [u8], span: &MessageSpan) -> std::borrow::Cow<'a, [u8]> {
    match reassemble(msg, usize::MAX) {
        Ok(Some(m)) => m.payload,
        _ => std::borrow::Cow::Borrowed(
            &msg[HEADER_LEN..HEADER_LEN + span.payload_len.min(msg.len() - HEADER_LEN)],
        ),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn messages_are_split_off_in_order_until_one_is_not_whole() {
        use super::{write_packet, Messages};
        let mut buf = bytes::BytesMut::new();
        write_packet(&mut buf, 0, b"\x03BEGIN");
        write_packet(&mut buf, 0, b"\x03SELECT 1");
        buf.extend_from_slice(&[9, 0, 0, 0, 3]);
        let got: Vec<_> = Messages::new(buf, 1024).collect();
        assert_eq!(got.len(), 2);
        assert_eq!(&got[0].0[4..], b"\x03BEGIN");
        assert_eq!(&got[1].0[4..], b"\x03SELECT 1");
        assert_eq!((got[1].1.total, got[1].1.last_seq), (13, 0));
    }

    #[test]
    fn the_last_packet_of_whole_packets_is_found() {
        use super::last_packet_payload as last;
        let two = [1, 0, 0, 1, 0xAA, 2, 0, 0, 2, 0xBB, 0xCC];
        assert_eq!(last(&two), Some(9..11));
        assert_eq!(last(&two[..5]), Some(4..5));
        assert_eq!(last(&two[..10]), None, "a cut packet");
        assert_eq!(last(&two[..7]), None, "a cut header");
        assert_eq!(last(&[]), None);
    }

    use super::*;

    const BIG: usize = 64 << 20;

    fn framed(seq: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_packet(&mut out, seq, payload);
        out
    }

    #[test]
    fn header_needs_four_bytes_and_reads_length_and_seq() {
        assert_eq!(check_packet(&[1, 0, 0], 100), Ok(None));
        assert_eq!(
            check_packet(&[0x03, 0x01, 0x00, 7, 0xAA], 1000),
            Ok(Some(Header { len: 259, seq: 7 }))
        );
        assert_eq!(Header { len: 259, seq: 7 }.total(), 263);
    }

    #[test]
    fn header_over_limit_is_rejected_before_the_payload_arrives() {
        assert_eq!(
            check_packet(&[0xFF, 0xFF, 0xFF, 0], 1 << 20),
            Err(PacketError::TooLarge {
                len: 0xFF_FFFF,
                max: 1 << 20
            })
        );
        assert!(check_packet(&[0x10, 0, 0, 0], 0x10).unwrap().is_some());
    }

    #[test]
    fn small_and_empty_payloads() {
        assert_eq!(framed(0, b"\x0e"), [1, 0, 0, 0, 0x0e]);
        assert_eq!(framed(3, b""), [0, 0, 0, 3]);
        let mut out = bytes::BytesMut::new();
        assert_eq!(write_packet(&mut out, 255, b"ab"), 0, "sequence id wraps");
        assert_eq!(&out[..], &[2, 0, 0, 255, b'a', b'b']);
    }

    #[test]
    fn exactly_max_payload_ends_with_an_empty_packet() {
        let payload = vec![7u8; MAX_PAYLOAD];
        let out = framed(0, &payload);
        assert_eq!(out.len(), MAX_PAYLOAD + 8);
        assert_eq!(&out[..4], &[0xFF, 0xFF, 0xFF, 0]);
        assert_eq!(&out[out.len() - 4..], &[0, 0, 0, 1]);
        assert_eq!(packet_count(MAX_PAYLOAD), 2);
        let m = reassemble(&out, BIG).unwrap().unwrap();
        assert_eq!(m.payload.len(), MAX_PAYLOAD);
        assert_eq!(m.payload, &payload[..]);
        assert_eq!(
            (
                m.span.packets,
                m.span.total,
                m.span.first_seq,
                m.span.last_seq
            ),
            (2, out.len(), 0, 1)
        );
    }

    #[test]
    fn max_payload_plus_one_splits_into_full_and_one_byte_packets() {
        let mut payload = vec![1u8; MAX_PAYLOAD + 1];
        payload[MAX_PAYLOAD] = 9;
        let out = framed(5, &payload);
        assert_eq!(out.len(), MAX_PAYLOAD + 1 + 8);
        assert_eq!(&out[MAX_PAYLOAD + 4..], &[1, 0, 0, 6, 9]);
        let m = reassemble(&out, BIG).unwrap().unwrap();
        assert_eq!(m.payload, &payload[..]);
        assert_eq!((m.span.first_seq, m.span.last_seq), (5, 6));
        // Every strict prefix waits for more; the limit counts all packets.
        assert_eq!(scan_message(&out[..out.len() - 1], BIG), Ok(None));
        assert_eq!(scan_message(&out[..MAX_PAYLOAD + 4], BIG), Ok(None));
        assert!(matches!(
            scan_message(&out, MAX_PAYLOAD),
            Err(PacketError::TooLarge { .. })
        ));
    }

    #[test]
    fn single_packet_is_borrowed_and_trailing_bytes_left_alone() {
        let mut buf = framed(0, b"\x03SELECT 1");
        buf.extend_from_slice(&[1, 0, 0]);
        let m = reassemble(&buf, 100).unwrap().unwrap();
        assert!(matches!(m.payload, Cow::Borrowed(b"\x03SELECT 1")));
        assert_eq!(m.span.total, 13);
    }

    #[test]
    fn out_of_order_continuation_is_rejected() {
        let mut buf = vec![0xFF, 0xFF, 0xFF, 0];
        buf.resize(4 + MAX_PAYLOAD, 0);
        buf.extend_from_slice(&[0, 0, 0, 2]);
        assert_eq!(
            scan_message(&buf, BIG),
            Err(PacketError::OutOfOrder {
                expected: 1,
                got: 2
            })
        );
    }
}
