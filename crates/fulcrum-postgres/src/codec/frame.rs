//! Frame boundaries of regular (tagged) messages: a 1-byte tag then a 4-byte
//! big-endian length that counts itself but not the tag.
//! See <https://www.postgresql.org/docs/15/protocol-overview.html#PROTOCOL-MESSAGE-CONCEPTS>.

use thiserror::Error;

/// What a frame's 5-byte header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub tag: u8,
    /// Whole frame length including the tag byte: `1 + declared length`.
    pub total: usize,
}

impl FrameHeader {
    /// Length of the body (what follows the 5-byte header).
    pub fn body_len(&self) -> usize {
        self.total - 5
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("invalid message length {len} for message type {tag:?}")]
    BadLength { tag: char, len: i64 },
    #[error("message of type {tag:?} is {len} bytes, over the limit of {max} bytes")]
    TooLarge { tag: char, len: u64, max: u64 },
}

/// Reads the header at the start of `buf`.
///
/// Returns `Ok(None)` when fewer than 5 bytes are buffered. Rejects a declared
/// length below 4 (0, negative as i32, or 1..=3) and one whose body exceeds `max`.
/// PostgreSQL's framing for `fulcrum_net::Connection`: a tag byte and a
/// 4-byte length (the startup packet, which has no tag, is read apart).
pub struct PgFrames;

impl fulcrum_net::Framing for PgFrames {
    type Error = FrameError;
    fn frame_len(buf: &[u8], max: u64) -> Result<Option<usize>, FrameError> {
        Ok(check_frame(buf, max)?.map(|h| h.total))
    }
}

pub fn check_frame(buf: &[u8], max: u64) -> Result<Option<FrameHeader>, FrameError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let tag = buf[0];
    let len = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    if len < 4 {
        return Err(FrameError::BadLength {
            tag: tag as char,
            len: len as i64,
        });
    }
    if (len as u64) > max.saturating_add(4) {
        return Err(FrameError::TooLarge {
            tag: tag as char,
            len: len as u64,
            max,
        });
    }
    Ok(Some(FrameHeader {
        tag,
        total: 1 + len as usize,
    }))
}

/// Appends a frame header for a body of `body_len` bytes.
pub fn put_header(out: &mut bytes::BytesMut, tag: u8, body_len: usize) {
    out.extend_from_slice(&[tag]);
    out.extend_from_slice(&((body_len + 4) as i32).to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_five_bytes() {
        assert_eq!(check_frame(b"Q\0\0\0", 100), Ok(None));
    }

    #[test]
    fn reads_tag_and_total() {
        let h = check_frame(b"Q\0\0\0\x09abcd\0", 100).unwrap().unwrap();
        assert_eq!(
            h,
            FrameHeader {
                tag: b'Q',
                total: 10
            }
        );
        assert_eq!(h.body_len(), 5);
    }

    #[test]
    fn rejects_zero_and_negative_and_short_lengths() {
        for len in [0i32, -1, 3, i32::MIN] {
            let mut b = vec![b'Q'];
            b.extend_from_slice(&len.to_be_bytes());
            assert!(
                matches!(check_frame(&b, 100), Err(FrameError::BadLength { .. })),
                "{len}"
            );
        }
    }

    #[test]
    fn rejects_over_limit() {
        let mut b = vec![b'Q'];
        b.extend_from_slice(&(105i32).to_be_bytes());
        assert!(matches!(
            check_frame(&b, 100),
            Err(FrameError::TooLarge { .. })
        ));
        let mut b = vec![b'Q'];
        b.extend_from_slice(&(104i32).to_be_bytes());
        assert!(check_frame(&b, 100).unwrap().is_some());
    }

    #[test]
    fn header_round_trip() {
        let mut out = bytes::BytesMut::new();
        put_header(&mut out, b'Z', 1);
        out.extend_from_slice(b"I");
        assert_eq!(check_frame(&out, 10).unwrap().unwrap().total, 6);
    }
}
