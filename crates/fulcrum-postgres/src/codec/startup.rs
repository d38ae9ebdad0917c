//! The untagged first packet a client sends: StartupMessage, SSLRequest,
//! GSSENCRequest or CancelRequest. Pure parsing with every length checked.
//! See <https://www.postgresql.org/docs/15/protocol-message-formats.html>.

use thiserror::Error;

pub const PROTOCOL_3_0: i32 = 196_608;
pub const SSL_REQUEST: i32 = 80_877_103;
pub const GSSENC_REQUEST: i32 = 80_877_104;
pub const CANCEL_REQUEST: i32 = 80_877_102;
/// PostgreSQL itself refuses startup packets over 10,000 bytes.
pub const MAX_STARTUP_LEN: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupPacket {
    Ssl,
    GssEnc,
    Cancel {
        process_id: i32,
        secret_key: i32,
    },
    Startup {
        /// Minor protocol version asked for (major is always 3 here).
        minor: u16,
        params: Vec<(String, String)>,
    },
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum StartupError {
    #[error("invalid length of startup packet ({0})")]
    BadLength(i64),
    #[error("unsupported frontend protocol {major}.{minor}: server supports 3.0")]
    UnsupportedProtocol { major: u16, minor: u16 },
    #[error("invalid startup packet layout: {0}")]
    Malformed(&'static str),
}

/// Parses one startup-phase packet at the start of `buf`.
/// `Ok(None)`: not all of it is buffered yet. `Ok(Some((packet, used)))` otherwise.
pub fn parse_startup(buf: &[u8]) -> Result<Option<(StartupPacket, usize)>, StartupError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if !(8..=MAX_STARTUP_LEN as i32).contains(&len) {
        return Err(StartupError::BadLength(len as i64));
    }
    let len = len as usize;
    if buf.len() < len {
        return Ok(None);
    }
    let code = i32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let body = &buf[8..len];
    let packet = match code {
        SSL_REQUEST if len == 8 => StartupPacket::Ssl,
        GSSENC_REQUEST if len == 8 => StartupPacket::GssEnc,
        CANCEL_REQUEST if len == 16 => StartupPacket::Cancel {
            process_id: i32::from_be_bytes([body[0], body[1], body[2], body[3]]),
            secret_key: i32::from_be_bytes([body[4], body[5], body[6], body[7]]),
        },
        SSL_REQUEST | GSSENC_REQUEST | CANCEL_REQUEST => {
            return Err(StartupError::BadLength(len as i64))
        }
        _ => {
            let major = (code >> 16) as u16;
            let minor = (code & 0xffff) as u16;
            if major != 3 {
                return Err(StartupError::UnsupportedProtocol { major, minor });
            }
            StartupPacket::Startup {
                minor,
                params: parse_params(body)?,
            }
        }
    };
    Ok(Some((packet, len)))
}

/// Name/value C-string pairs ending with one extra NUL.
fn parse_params(mut body: &[u8]) -> Result<Vec<(String, String)>, StartupError> {
    let mut params = Vec::new();
    loop {
        let name = take_cstr(&mut body).ok_or(StartupError::Malformed("unterminated name"))?;
        if name.is_empty() {
            if !body.is_empty() {
                return Err(StartupError::Malformed("bytes after the terminator"));
            }
            return Ok(params);
        }
        let value = take_cstr(&mut body).ok_or(StartupError::Malformed("unterminated value"))?;
        let name = String::from_utf8(name.to_vec())
            .map_err(|_| StartupError::Malformed("parameter name is not UTF-8"))?;
        let value = String::from_utf8(value.to_vec())
            .map_err(|_| StartupError::Malformed("parameter value is not UTF-8"))?;
        params.push((name, value));
    }
}

fn take_cstr<'a>(body: &mut &'a [u8]) -> Option<&'a [u8]> {
    let nul = body.iter().position(|&b| b == 0)?;
    let s = &body[..nul];
    *body = &body[nul + 1..];
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(code: i32, body: &[u8]) -> Vec<u8> {
        let mut v = ((body.len() + 8) as i32).to_be_bytes().to_vec();
        v.extend_from_slice(&code.to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn parses_startup_params() {
        let p = packet(PROTOCOL_3_0, b"user\0app\0database\0db\0\0");
        let (sp, used) = parse_startup(&p).unwrap().unwrap();
        assert_eq!(used, p.len());
        assert_eq!(
            sp,
            StartupPacket::Startup {
                minor: 0,
                params: vec![
                    ("user".into(), "app".into()),
                    ("database".into(), "db".into())
                ]
            }
        );
    }

    #[test]
    fn partial_packet_waits() {
        let p = packet(PROTOCOL_3_0, b"user\0app\0\0");
        assert_eq!(parse_startup(&p[..p.len() - 1]), Ok(None));
        assert_eq!(parse_startup(&p[..3]), Ok(None));
    }

    #[test]
    fn ssl_gss_and_cancel() {
        assert_eq!(
            parse_startup(&packet(SSL_REQUEST, b"")).unwrap().unwrap().0,
            StartupPacket::Ssl
        );
        assert_eq!(
            parse_startup(&packet(GSSENC_REQUEST, b""))
                .unwrap()
                .unwrap()
                .0,
            StartupPacket::GssEnc
        );
        let mut body = 7i32.to_be_bytes().to_vec();
        body.extend_from_slice(&(-9i32).to_be_bytes());
        assert_eq!(
            parse_startup(&packet(CANCEL_REQUEST, &body))
                .unwrap()
                .unwrap()
                .0,
            StartupPacket::Cancel {
                process_id: 7,
                secret_key: -9
            }
        );
    }

    #[test]
    fn garbage_is_rejected() {
        // An HTTP request read as a length is far too large.
        assert!(matches!(
            parse_startup(b"GET / HTTP/1.1\r\n"),
            Err(StartupError::BadLength(_))
        ));
        assert!(matches!(
            parse_startup(&[0, 0, 0, 0]),
            Err(StartupError::BadLength(0))
        ));
        assert!(matches!(
            parse_startup(&[0xff, 0xff, 0xff, 0xff]),
            Err(StartupError::BadLength(-1))
        ));
        assert!(matches!(
            parse_startup(&packet(2 << 16, b"\0")),
            Err(StartupError::UnsupportedProtocol { major: 2, .. })
        ));
        assert!(matches!(
            parse_startup(&packet(PROTOCOL_3_0, b"user\0app")),
            Err(StartupError::Malformed(_))
        ));
        assert!(matches!(
            parse_startup(&packet(CANCEL_REQUEST, b"1234")),
            Err(StartupError::BadLength(_))
        ));
    }
}
