//! COM_CHANGE_USER's body: user, auth response, schema, character set and
//! auth plugin, as a protocol-41 client with secure connection sends them.
//! Pure.

use mysql_common::constants::CapabilityFlags as C;

use super::wire::{DecodeError, Reader};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeUser {
    pub user: String,
    pub auth_response: Vec<u8>,
    pub schema: Option<String>,
    pub charset: Option<u8>,
    pub auth_plugin: Option<String>,
}

/// Parses a COM_CHANGE_USER payload (its first byte is 0x11). `caps` are the
/// flags in force with the client.
pub fn parse_change_user(payload: &[u8], caps: C) -> Result<ChangeUser, DecodeError> {
    let mut r = Reader::new(payload);
    if r.u8("command")? != 0x11 {
        return Err(DecodeError::Malformed("not COM_CHANGE_USER"));
    }
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let user = text(r.null_str("user")?);
    let auth_response = if caps.contains(C::CLIENT_SECURE_CONNECTION) {
        let n = usize::from(r.u8("auth response length")?);
        r.bytes(n, "auth response")?.to_vec()
    } else {
        r.null_str("auth response")?.to_vec()
    };
    let schema = Some(text(r.null_str("schema")?)).filter(|s| !s.is_empty());
    let mut charset = None;
    let mut auth_plugin = None;
    if !r.is_empty() {
        charset = Some(r.u16("charset")? as u8);
        if caps.contains(C::CLIENT_PLUGIN_AUTH) && !r.is_empty() {
            auth_plugin = Some(text(r.null_str("auth plugin")?));
        }
    }
    Ok(ChangeUser {
        user,
        auth_response,
        schema,
        charset,
        auth_plugin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: C = C::CLIENT_PROTOCOL_41
        .union(C::CLIENT_SECURE_CONNECTION)
        .union(C::CLIENT_PLUGIN_AUTH);

    #[test]
    fn a_change_user_body_parses() {
        let mut p = vec![0x11];
        p.extend_from_slice(b"bob\0");
        p.push(3);
        p.extend_from_slice(&[1, 2, 3]);
        p.extend_from_slice(b"app\0");
        p.extend_from_slice(&45u16.to_le_bytes());
        p.extend_from_slice(b"mysql_native_password\0");
        let c = parse_change_user(&p, CAPS).unwrap();
        assert_eq!(c.user, "bob");
        assert_eq!(c.auth_response, vec![1, 2, 3]);
        assert_eq!(c.schema.as_deref(), Some("app"));
        assert_eq!(c.charset, Some(45));
        assert_eq!(c.auth_plugin.as_deref(), Some("mysql_native_password"));
    }

    #[test]
    fn truncated_bodies_are_errors() {
        assert!(parse_change_user(&[0x11], CAPS).is_err());
        assert!(parse_change_user(&[0x11, b'b', 0, 9, 1], CAPS).is_err());
        assert!(parse_change_user(&[0x03], CAPS).is_err());
    }
}
