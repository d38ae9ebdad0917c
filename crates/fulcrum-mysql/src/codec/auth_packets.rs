//! Packets of the authentication exchange after the handshake response:
//! AuthSwitchRequest (0xFE: use this plugin with this data), AuthMoreData (0x01:
//! plugin-specific data, e.g. caching_sha2_password's "fast auth success"), and
//! which of those, OK or ERR a server's reply is. mysql_common's
//! `AuthSwitchRequest` and `AuthMoreData` fit these exactly and are used both ways.
//! See <https://dev.mysql.com/doc/dev/mysql-server/latest/page_protocol_connection_phase.html>.

use mysql_common::io::ParseBuf;
use mysql_common::packets::{AuthMoreData, AuthSwitchRequest};
use mysql_common::proto::{MyDeserialize, MySerialize};

use super::wire::DecodeError;

pub const AUTH_MORE_DATA: u8 = 0x01;
pub const AUTH_SWITCH: u8 = 0xFE;

/// What a server answered to a handshake response or auth data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthReply {
    Ok,
    Err,
    /// AuthSwitchRequest (or, when one byte long, the pre-4.1 old-password switch).
    Switch,
    MoreData,
}

pub fn classify_auth_reply(payload: &[u8]) -> Result<AuthReply, DecodeError> {
    match payload.first() {
        None => Err(DecodeError::Truncated("auth reply header")),
        Some(0x00) => Ok(AuthReply::Ok),
        Some(0xFF) => Ok(AuthReply::Err),
        Some(&AUTH_SWITCH) => Ok(AuthReply::Switch),
        Some(&AUTH_MORE_DATA) => Ok(AuthReply::MoreData),
        Some(_) => Err(DecodeError::Malformed(
            "unexpected packet during authentication",
        )),
    }
}

/// Builds an AuthSwitchRequest: 0xFE, the plugin name NUL-terminated, then `data`
/// to the end of the packet.
pub fn build_auth_switch(plugin: &str, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + plugin.len() + data.len());
    AuthSwitchRequest::new(plugin.as_bytes(), data).serialize(&mut out);
    out
}

/// Builds an AuthSwitchRequest carrying a 20-byte scramble followed by a NUL,
/// as MySQL sends it for mysql_native_password and caching_sha2_password.
pub fn build_auth_switch_scramble(plugin: &str, scramble: &[u8; 20]) -> Vec<u8> {
    let mut data = [0u8; 21];
    data[..20].copy_from_slice(scramble);
    build_auth_switch(plugin, &data)
}

/// A server's AuthSwitchRequest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthSwitch {
    pub plugin: String,
    /// The plugin data, without the trailing NUL MySQL adds after the scramble
    /// of the password plugins it knows.
    pub data: Vec<u8>,
}

pub fn parse_auth_switch(payload: &[u8]) -> Result<AuthSwitch, DecodeError> {
    if payload.first() != Some(&AUTH_SWITCH) {
        return Err(DecodeError::Malformed("not an AuthSwitchRequest"));
    }
    let p = AuthSwitchRequest::deserialize((), &mut ParseBuf(payload))
        .map_err(|_| DecodeError::Truncated("auth plugin name"))?;
    let plugin = std::str::from_utf8(p.auth_plugin().as_bytes())
        .map_err(|_| DecodeError::NotUtf8("auth plugin name"))?
        .to_owned();
    Ok(AuthSwitch {
        plugin,
        data: p.plugin_data().to_vec(),
    })
}

/// Builds an AuthMoreData packet: 0x01 then `data`.
pub fn build_auth_more_data(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + data.len());
    AuthMoreData::new(data).serialize(&mut out);
    out
}

/// The data of an AuthMoreData packet.
pub fn parse_auth_more_data(payload: &[u8]) -> Result<&[u8], DecodeError> {
    match payload.split_first() {
        Some((&AUTH_MORE_DATA, data)) => Ok(data),
        Some(_) => Err(DecodeError::Malformed("not an AuthMoreData packet")),
        None => Err(DecodeError::Truncated("AuthMoreData header")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAMBLE: [u8; 20] = *b"abcdefghij0123456789";

    #[test]
    fn auth_switch_exact_bytes_and_round_trip() {
        let out = build_auth_switch_scramble("mysql_native_password", &SCRAMBLE);
        let mut want = vec![0xFE];
        want.extend_from_slice(b"mysql_native_password\0abcdefghij0123456789\0");
        assert_eq!(out, want);
        assert_eq!(classify_auth_reply(&out), Ok(AuthReply::Switch));
        assert_eq!(
            parse_auth_switch(&out),
            Ok(AuthSwitch {
                plugin: "mysql_native_password".into(),
                data: SCRAMBLE.to_vec()
            })
        );
        // Unknown plugins keep their data whole.
        let out = build_auth_switch("client_ed25519", b"\x01\x02\0");
        assert_eq!(parse_auth_switch(&out).unwrap().data, b"\x01\x02\0");
    }

    #[test]
    fn auth_switch_errors() {
        assert_eq!(
            parse_auth_switch(b"\xfemysql_native_password"),
            Err(DecodeError::Truncated("auth plugin name"))
        );
        assert!(parse_auth_switch(b"").is_err());
        assert!(parse_auth_switch(b"\x01x\0").is_err());
        assert_eq!(
            parse_auth_switch(b"\xfe\xff\xfe\0"),
            Err(DecodeError::NotUtf8("auth plugin name"))
        );
    }

    #[test]
    fn auth_more_data_both_ways() {
        let out = build_auth_more_data(&[0x03]);
        assert_eq!(out, [0x01, 0x03]);
        assert_eq!(classify_auth_reply(&out), Ok(AuthReply::MoreData));
        assert_eq!(parse_auth_more_data(&out), Ok(&[0x03][..]));
        assert!(parse_auth_more_data(b"").is_err());
        assert!(parse_auth_more_data(b"\x00").is_err());
    }

    #[test]
    fn classifies_replies() {
        assert_eq!(classify_auth_reply(b"\x00\x00\x00"), Ok(AuthReply::Ok));
        assert_eq!(classify_auth_reply(b"\xff\x15\x04"), Ok(AuthReply::Err));
        assert!(classify_auth_reply(b"").is_err());
        assert!(classify_auth_reply(b"\x05").is_err());
    }
}
