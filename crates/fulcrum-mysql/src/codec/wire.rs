//! The protocol's primitive types inside a payload: fixed-width little-endian
//! integers, length-encoded (LENENC) integers and strings, NUL-terminated
//! strings, and the one decoding error every payload parser returns.
//! See <https://dev.mysql.com/doc/dev/mysql-server/latest/page_protocol_basic_data_types.html>.

use thiserror::Error;

/// Why a payload could not be decoded. Parsers never panic on bad input: every
/// length is checked against what remains and reported here.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("{0} runs past the end of the packet")]
    Truncated(&'static str),
    #[error("{0} is not a valid length-encoded integer (first byte 0x{1:02x})")]
    BadLenEnc(&'static str, u8),
    #[error("{0} is NULL where a value is required")]
    UnexpectedNull(&'static str),
    #[error("{0} is not valid UTF-8")]
    NotUtf8(&'static str),
    #[error("malformed packet: {0}")]
    Malformed(&'static str),
}

/// A cursor over a payload. Each read names the field it reads, so an error
/// says which field ran past the end.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { rest: buf }
    }

    /// What has not been read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }

    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    /// Takes everything that remains (a `string<EOF>`).
    pub fn take_rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.rest)
    }

    pub fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if n > self.rest.len() {
            return Err(DecodeError::Truncated(what));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    pub fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N, what)?);
        Ok(out)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    pub fn u24(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let [a, b, c] = self.array(what)?;
        Ok(u32::from_le_bytes([a, b, c, 0]))
    }

    pub fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A LENENC integer; `None` for the 0xFB NULL marker. 0xFF is never a
    /// length (it starts an ERR packet) and is an error.
    pub fn lenenc_int(&mut self, what: &'static str) -> Result<Option<u64>, DecodeError> {
        match self.u8(what)? {
            b @ 0..=0xFA => Ok(Some(b as u64)),
            0xFB => Ok(None),
            0xFC => Ok(Some(self.u16(what)? as u64)),
            0xFD => Ok(Some(self.u24(what)? as u64)),
            0xFE => Ok(Some(self.u64(what)?)),
            0xFF => Err(DecodeError::BadLenEnc(what, 0xFF)),
        }
    }

    /// A LENENC integer that may not be NULL.
    pub fn lenenc_u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        self.lenenc_int(what)?
            .ok_or(DecodeError::UnexpectedNull(what))
    }

    /// A LENENC string; `None` for NULL. A length past the end is an error.
    pub fn lenenc_str(&mut self, what: &'static str) -> Result<Option<&'a [u8]>, DecodeError> {
        match self.lenenc_int(what)? {
            None => Ok(None),
            Some(n) if n > self.rest.len() as u64 => Err(DecodeError::Truncated(what)),
            Some(n) => self.bytes(n as usize, what).map(Some),
        }
    }

    /// A LENENC string that may not be NULL.
    pub fn lenenc_bytes(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        self.lenenc_str(what)?
            .ok_or(DecodeError::UnexpectedNull(what))
    }

    /// A NUL-terminated string, without its NUL.
    pub fn null_str(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let nul = self
            .rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::Truncated(what))?;
        let s = &self.rest[..nul];
        self.rest = &self.rest[nul + 1..];
        Ok(s)
    }
}

/// Reads a LENENC integer at the start of `buf`: the value (`None` for NULL)
/// and how many bytes it took.
pub fn read_lenenc_int(buf: &[u8]) -> Result<(Option<u64>, usize), DecodeError> {
    let mut r = Reader::new(buf);
    let v = r.lenenc_int("length-encoded integer")?;
    Ok((v, buf.len() - r.rest().len()))
}

/// Reads a LENENC string at the start of `buf`: the bytes (`None` for NULL)
/// and how many bytes the prefix and the string took together.
pub fn read_lenenc_str(buf: &[u8]) -> Result<(Option<&[u8]>, usize), DecodeError> {
    let mut r = Reader::new(buf);
    let v = r.lenenc_str("length-encoded string")?;
    Ok((v, buf.len() - r.rest().len()))
}

/// Bytes `write_lenenc_int` writes for `v`.
pub fn lenenc_int_len(v: u64) -> usize {
    match v {
        0..=0xFA => 1,
        0xFB..=0xFFFF => 3,
        0x1_0000..=0xFF_FFFF => 4,
        _ => 9,
    }
}

pub fn write_lenenc_int(out: &mut Vec<u8>, v: u64) {
    match v {
        0..=0xFA => out.push(v as u8),
        0xFB..=0xFFFF => {
            out.push(0xFC);
            out.extend_from_slice(&(v as u16).to_le_bytes());
        }
        0x1_0000..=0xFF_FFFF => {
            out.push(0xFD);
            out.extend_from_slice(&(v as u32).to_le_bytes()[..3]);
        }
        _ => {
            out.push(0xFE);
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

pub fn write_lenenc_str(out: &mut Vec<u8>, s: &[u8]) {
    write_lenenc_int(out, s.len() as u64);
    out.extend_from_slice(s);
}

/// The SQL NULL marker in a text-protocol row.
pub fn write_lenenc_null(out: &mut Vec<u8>) {
    out.push(0xFB);
}

pub fn write_null_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(s);
    out.push(0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use mysql_common::io::ParseBuf;

    fn enc(v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        write_lenenc_int(&mut out, v);
        out
    }

    #[test]
    fn lenenc_int_every_size_class() {
        let cases: [(u64, &[u8]); 9] = [
            (0, &[0x00]),
            (250, &[0xFA]),
            (251, &[0xFC, 0xFB, 0x00]),
            (0xFFFF, &[0xFC, 0xFF, 0xFF]),
            (0x1_0000, &[0xFD, 0x00, 0x00, 0x01]),
            (0xFF_FFFF, &[0xFD, 0xFF, 0xFF, 0xFF]),
            (0x100_0000, &[0xFE, 0, 0, 0, 1, 0, 0, 0, 0]),
            (
                u64::MAX,
                &[0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF],
            ),
            (0x0102_0304_0506_0708, &[0xFE, 8, 7, 6, 5, 4, 3, 2, 1]),
        ];
        for (v, bytes) in cases {
            assert_eq!(enc(v), bytes, "{v:#x}");
            assert_eq!(lenenc_int_len(v), bytes.len());
            assert_eq!(read_lenenc_int(bytes), Ok((Some(v), bytes.len())));
            // mysql_common reads what we write.
            assert_eq!(ParseBuf(bytes).checked_eat_lenenc_int(), Some(v));
        }
    }

    #[test]
    fn lenenc_null_and_err_marker() {
        assert_eq!(read_lenenc_int(&[0xFB, 9]), Ok((None, 1)));
        assert_eq!(read_lenenc_str(&[0xFB]), Ok((None, 1)));
        assert!(matches!(
            read_lenenc_int(&[0xFF]),
            Err(DecodeError::BadLenEnc(_, 0xFF))
        ));
        let mut out = Vec::new();
        write_lenenc_null(&mut out);
        assert_eq!(out, [0xFB]);
        assert_eq!(
            Reader::new(&[0xFB]).lenenc_u64("x"),
            Err(DecodeError::UnexpectedNull("x"))
        );
    }

    #[test]
    fn lenenc_int_truncated_in_every_class() {
        for bytes in [
            &[][..],
            &[0xFC, 1],
            &[0xFD, 1, 2],
            &[0xFE, 1, 2, 3, 4, 5, 6, 7],
        ] {
            assert!(
                matches!(read_lenenc_int(bytes), Err(DecodeError::Truncated(_))),
                "{bytes:?}"
            );
        }
    }

    #[test]
    fn lenenc_str_round_trip_and_bounds() {
        for len in [0usize, 1, 250, 251, 0x1_0000] {
            let s = vec![b'x'; len];
            let mut out = Vec::new();
            write_lenenc_str(&mut out, &s);
            assert_eq!(out.len(), lenenc_int_len(len as u64) + len);
            assert_eq!(read_lenenc_str(&out), Ok((Some(&s[..]), out.len())));
            assert_eq!(ParseBuf(&out).checked_eat_lenenc_str(), Some(&s[..]));
        }
        // A length claiming more than remains, including one past usize on 32-bit.
        assert_eq!(
            read_lenenc_str(&[0x05, b'a', b'b']),
            Err(DecodeError::Truncated("length-encoded string"))
        );
        let huge = [0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, b'a'];
        assert!(matches!(
            read_lenenc_str(&huge),
            Err(DecodeError::Truncated(_))
        ));
    }

    #[test]
    fn fixed_ints_and_null_strings() {
        let mut r = Reader::new(&[1, 2, 3, 4, 5, 6, b'a', 0, b'z']);
        assert_eq!(r.u16("a"), Ok(0x0201));
        assert_eq!(r.u24("b"), Ok(0x05_0403));
        assert_eq!(r.u8("c"), Ok(6));
        assert_eq!(r.null_str("d"), Ok(&b"a"[..]));
        assert_eq!(r.null_str("e"), Err(DecodeError::Truncated("e")));
        assert_eq!(r.u32("f"), Err(DecodeError::Truncated("f")));
        assert_eq!(r.take_rest(), b"z");
        assert!(r.is_empty());
        assert_eq!(r.u64("g"), Err(DecodeError::Truncated("g")));
        let mut out = Vec::new();
        write_null_str(&mut out, b"ab");
        assert_eq!(out, b"ab\0");
    }
}
