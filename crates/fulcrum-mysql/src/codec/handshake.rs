//! The connection phase's first packets, in both directions: the Initial
//! Handshake v10 (Fulcrum builds it for clients and parses a server's), the
//! HandshakeResponse41 (Fulcrum parses a client's and builds its own for a
//! server) and the SSLRequest a client sends before TLS.
//! See <https://dev.mysql.com/doc/dev/mysql-server/latest/page_protocol_connection_phase_packets.html>.
//!
//! Fulcrum's Initial Handshake is built with mysql_common's `HandshakePacket`,
//! whose fields map one to one. Everything else is hand-written and tested
//! against mysql_common's types both ways: a server's handshake, because
//! `HandshakePacket`'s parser overflows (a panic with overflow checks on) on an
//! auth-plugin-data length of 0x80 to 0x87; a client's response, because it is
//! untrusted input to check field by field with its connection attributes
//! skipped unread (mysql_common decodes them all into a map); and Fulcrum's
//! response, because it must carry the character set Fulcrum chooses
//! (mysql_common picks it from the server version).

use mysql_common::constants::{CapabilityFlags as C, StatusFlags};
use mysql_common::packets::HandshakePacket;
use mysql_common::proto::MySerialize;

use super::wire::{write_lenenc_str, write_null_str, DecodeError, Reader};

/// Length of the scramble (auth-plugin-data) in the Initial Handshake.
pub const SCRAMBLE_LEN: usize = 20;
/// Length of an SSLRequest payload (and of the fixed part of HandshakeResponse41).
pub const SSL_REQUEST_LEN: usize = 32;

/// The Initial Handshake Fulcrum sends a client. The scramble's second part and
/// the plugin name are always written, so `capabilities` should include
/// `SECURE_CONNECTION` and `PLUGIN_AUTH` (as `capabilities::OFFERED` does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialHandshake<'a> {
    /// Sent as a NUL-terminated string; must not contain NUL.
    pub server_version: &'a str,
    pub connection_id: u32,
    /// From [`make_scramble`]: no NUL bytes, which clients would cut at.
    pub scramble: [u8; SCRAMBLE_LEN],
    pub capabilities: C,
    /// Collation id of the server's default character set (45 = utf8mb4_general_ci).
    pub charset: u8,
    pub status: StatusFlags,
    pub auth_plugin: &'a str,
}

/// Builds the Initial Handshake v10 payload: protocol 10, version, connection
/// id, the scramble split 8 + 12 (the second part NUL-terminated, as MySQL
/// sends it, so auth-plugin-data-len is 21), capabilities lower then upper
/// half, charset, status flags and the auth plugin name.
pub fn build_initial_handshake(h: &InitialHandshake<'_>) -> Vec<u8> {
    let (part1, part2) = h.scramble.split_at(8);
    let mut part2 = part2.to_vec();
    part2.push(0);
    let packet = HandshakePacket::new(
        10,
        h.server_version.as_bytes(),
        h.connection_id,
        part1.try_into().expect("8 bytes"),
        Some(part2),
        h.capabilities,
        h.charset,
        h.status,
        Some(h.auth_plugin.as_bytes()),
    );
    let mut out = Vec::with_capacity(64 + h.server_version.len());
    packet.serialize(&mut out);
    out
}

/// Turns 20 random bytes into a scramble as MySQL makes them (7-bit, never NUL
/// or `$`), so clients that treat it as a C string read all of it.
pub fn make_scramble(random: [u8; SCRAMBLE_LEN]) -> [u8; SCRAMBLE_LEN] {
    random.map(|b| match b & 0x7F {
        0 | b'$' => (b & 0x7F) + 1,
        x => x,
    })
}

/// What Fulcrum reads from a server's Initial Handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerHandshake {
    pub server_version: String,
    pub connection_id: u32,
    pub scramble: [u8; SCRAMBLE_LEN],
    pub capabilities: C,
    pub charset: u8,
    pub status: StatusFlags,
    pub auth_plugin: Option<String>,
    /// MariaDB's extended capabilities (0 from MySQL).
    pub mariadb_capabilities: u32,
}

impl ServerHandshake {
    pub fn is_mariadb(&self) -> bool {
        self.server_version.contains("MariaDB")
    }
}

/// Parses a server's Initial Handshake v10. A server that refuses the
/// connection sends an ERR packet (first byte 0xFF) instead: check for that first.
pub fn parse_server_handshake(payload: &[u8]) -> Result<ServerHandshake, DecodeError> {
    let mut r = Reader::new(payload);
    if r.u8("protocol version")? != 10 {
        return Err(DecodeError::Malformed("not an Initial Handshake v10"));
    }
    let server_version = String::from_utf8_lossy(r.null_str("server version")?).into_owned();
    let connection_id = r.u32("connection id")?;
    let part1 = r.bytes(8, "auth-plugin-data part 1")?;
    r.u8("filler")?;
    let caps_lower = r.u16("capability flags")? as u32;
    let charset = r.u8("character set")?;
    let status = StatusFlags::from_bits_retain(r.u16("status flags")?);
    let caps_upper = r.u16("capability flags")? as u32;
    let capabilities = C::from_bits_truncate(caps_upper << 16 | caps_lower);
    let data_len = r.u8("auth-plugin-data length")? as usize;
    r.bytes(6, "reserved")?;
    let mariadb_capabilities = r.u32("MariaDB capabilities")?;
    let mut nonce = part1.to_vec();
    if capabilities.contains(C::CLIENT_SECURE_CONNECTION) {
        let part2 = r.bytes(
            data_len.saturating_sub(8).max(13),
            "auth-plugin-data part 2",
        )?;
        nonce.extend_from_slice(part2.strip_suffix(&[0]).unwrap_or(part2));
    }
    let scramble = nonce
        .get(..SCRAMBLE_LEN)
        .and_then(|s| s.try_into().ok())
        .ok_or(DecodeError::Malformed("scramble is shorter than 20 bytes"))?;
    let auth_plugin = match capabilities.contains(C::CLIENT_PLUGIN_AUTH) {
        // MySQL 5.5.x sent the name without its NUL.
        true if !r.rest().contains(&0) => Some(r.take_rest()),
        true => Some(r.null_str("auth plugin name")?),
        false => None,
    };
    Ok(ServerHandshake {
        server_version,
        connection_id,
        scramble,
        capabilities,
        charset,
        status,
        auth_plugin: auth_plugin.map(|p| String::from_utf8_lossy(p).into_owned()),
        mariadb_capabilities,
    })
}

/// A HandshakeResponse41, as a client sends it to Fulcrum or Fulcrum to a server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandshakeResponse {
    pub capabilities: C,
    pub max_packet: u32,
    pub charset: u8,
    pub username: String,
    pub auth_response: Vec<u8>,
    /// Present exactly when `CONNECT_WITH_DB` is set.
    pub database: Option<String>,
    /// Present exactly when `PLUGIN_AUTH` is set.
    pub auth_plugin: Option<String>,
    /// The encoded attribute pairs (without their total-length prefix), kept
    /// whole and never decoded; present when `CONNECT_ATTRS` is set.
    pub connect_attrs: Option<Vec<u8>>,
    /// MariaDB clients put extended capabilities in the last 4 filler bytes.
    pub mariadb_capabilities: u32,
}

/// The first packet a client sends after the Initial Handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientHello {
    /// A 32-byte response with `SSL` set: start TLS, then the full response follows.
    SslRequest {
        capabilities: C,
        max_packet: u32,
        charset: u8,
    },
    Response(HandshakeResponse),
}

fn utf8(bytes: &[u8], what: &'static str) -> Result<String, DecodeError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::NotUtf8(what))
}

/// Parses a client's SSLRequest or HandshakeResponse41. The auth response is
/// LENENC, 1-byte-length or NUL-terminated as the client's capabilities say;
/// connection attributes are checked against the packet's end and skipped.
pub fn parse_client_hello(payload: &[u8]) -> Result<ClientHello, DecodeError> {
    let mut r = Reader::new(payload);
    let capabilities = C::from_bits_truncate(r.u32("capability flags")?);
    if !capabilities.contains(C::CLIENT_PROTOCOL_41) {
        return Err(DecodeError::Malformed("client does not speak protocol 4.1"));
    }
    let max_packet = r.u32("max packet size")?;
    let charset = r.u8("character set")?;
    r.bytes(19, "filler")?;
    let mariadb_capabilities = r.u32("filler")?;
    if capabilities.contains(C::CLIENT_SSL) && r.is_empty() {
        return Ok(ClientHello::SslRequest {
            capabilities,
            max_packet,
            charset,
        });
    }
    let username = utf8(r.null_str("username")?, "username")?;
    let auth_response = if capabilities.contains(C::CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA) {
        r.lenenc_bytes("auth response")?
    } else if capabilities.contains(C::CLIENT_SECURE_CONNECTION) {
        let n = r.u8("auth response length")?;
        r.bytes(n as usize, "auth response")?
    } else {
        r.null_str("auth response")?
    }
    .to_vec();
    let database = match capabilities.contains(C::CLIENT_CONNECT_WITH_DB) {
        true => Some(utf8(r.null_str("database")?, "database")?),
        false => None,
    };
    let auth_plugin = match capabilities.contains(C::CLIENT_PLUGIN_AUTH) {
        // Some clients end the packet without the plugin name's NUL.
        true if !r.rest().contains(&0) => Some(utf8(r.take_rest(), "auth plugin")?),
        true => Some(utf8(r.null_str("auth plugin")?, "auth plugin")?),
        false => None,
    };
    // Clients that set CONNECT_ATTRS may still send none.
    let connect_attrs = match capabilities.contains(C::CLIENT_CONNECT_ATTRS) && !r.is_empty() {
        true => Some(r.lenenc_bytes("connection attributes")?.to_vec()),
        false => None,
    };
    Ok(ClientHello::Response(HandshakeResponse {
        capabilities,
        max_packet,
        charset,
        username,
        auth_response,
        database,
        auth_plugin,
        connect_attrs,
        mariadb_capabilities,
    }))
}

/// Builds a HandshakeResponse41. `CONNECT_WITH_DB`, `PLUGIN_AUTH` and
/// `CONNECT_ATTRS` are set or cleared to match the fields present; the auth
/// response is LENENC when `PLUGIN_AUTH_LENENC_CLIENT_DATA` is set and
/// 1-byte-length otherwise (Fulcrum's are 20 or 32 bytes; longer ones are cut
/// at 255 there).
pub fn build_handshake_response(r: &HandshakeResponse) -> Vec<u8> {
    let mut caps = r.capabilities;
    caps.set(C::CLIENT_CONNECT_WITH_DB, r.database.is_some());
    caps.set(C::CLIENT_PLUGIN_AUTH, r.auth_plugin.is_some());
    caps.set(C::CLIENT_CONNECT_ATTRS, r.connect_attrs.is_some());
    let mut out = Vec::with_capacity(64 + r.username.len() + r.auth_response.len());
    out.extend_from_slice(&caps.bits().to_le_bytes());
    out.extend_from_slice(&r.max_packet.to_le_bytes());
    out.push(r.charset);
    out.extend_from_slice(&[0; 19]);
    out.extend_from_slice(&r.mariadb_capabilities.to_le_bytes());
    write_null_str(&mut out, r.username.as_bytes());
    if caps.contains(C::CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA) {
        write_lenenc_str(&mut out, &r.auth_response);
    } else {
        let auth = &r.auth_response[..r.auth_response.len().min(255)];
        debug_assert_eq!(
            auth.len(),
            r.auth_response.len(),
            "auth response over 255 bytes"
        );
        out.push(auth.len() as u8);
        out.extend_from_slice(auth);
    }
    if let Some(db) = &r.database {
        write_null_str(&mut out, db.as_bytes());
    }
    if let Some(plugin) = &r.auth_plugin {
        write_null_str(&mut out, plugin.as_bytes());
    }
    if let Some(attrs) = &r.connect_attrs {
        write_lenenc_str(&mut out, attrs);
    }
    out
}

/// Encodes connection attributes (name/value pairs) for
/// [`HandshakeResponse::connect_attrs`].
pub fn encode_connect_attrs(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        write_lenenc_str(&mut out, k.as_bytes());
        write_lenenc_str(&mut out, v.as_bytes());
    }
    out
}

/// Builds the 32-byte SSLRequest Fulcrum sends a server before starting TLS.
pub fn build_ssl_request(capabilities: C, max_packet: u32, charset: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(SSL_REQUEST_LEN);
    out.extend_from_slice(&(capabilities | C::CLIENT_SSL).bits().to_le_bytes());
    out.extend_from_slice(&max_packet.to_le_bytes());
    out.push(charset);
    out.extend_from_slice(&[0; 23]);
    out
}

#[cfg(test)]
mod tests;
