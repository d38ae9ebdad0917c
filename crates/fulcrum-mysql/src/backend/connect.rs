//! Opening a server connection: TCP connect, the server's handshake, TLS when
//! `server_tls` says and the server offers it (the SSL request, then the
//! handshake), Fulcrum's HandshakeResponse41 as the client's user with the
//! configured password (mysql_native_password, or caching_sha2_password's
//! fast path, and its full authentication over TLS; following an
//! AuthSwitchRequest if the server asks for another plugin), up to the OK.

use std::time::Duration;

use bytes::BytesMut;
use fulcrum_net::Connection;
use mysql_common::constants::CapabilityFlags as C;
use thiserror::Error;

use super::conn::{InternalError, ServerConn};
use crate::auth::{caching_sha2, native};
use crate::codec::auth_packets::{classify_auth_reply, parse_auth_switch, AuthReply};
use crate::codec::capabilities::for_server;
use crate::codec::err::parse_err;
use crate::codec::handshake::{
    build_handshake_response, build_ssl_request, parse_server_handshake, HandshakeResponse,
};
use crate::codec::packet::{write_packet, HEADER_LEN};
use fulcrum_tls::ServerStream;

/// Where and as whom to connect, and the wire format the pool needs.
#[derive(Debug, Clone)]
pub struct ServerTarget {
    pub address: String,
    pub user: String,
    pub password: String,
    /// `DEPRECATE_EOF` / `SESSION_TRACK` as the clients of this pool have them.
    pub wire_format: C,
    pub charset: u8,
    /// Let the server ask for local files (`allow_local_infile`).
    pub local_infile: bool,
    /// Track `last_gtid` (consistency other than `eventual`, and clients
    /// that take session-state information).
    pub track_gtid: bool,
    /// TLS to the server (`server_tls`); `None`: plain text.
    pub tls: Option<ServerTls>,
    /// SHA1(password) of an `auth_query` user (the password itself is not
    /// known): answers mysql_native_password only.
    pub native_stage1: Option<[u8; 20]>,
}

/// How a connection uses TLS, from the backend's `server_tls`.
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub config: std::sync::Arc<fulcrum_tls::rustls::ClientConfig>,
    /// A server that does not offer SSL is refused (every mode but `prefer`).
    pub required: bool,
    /// The server's certificate is checked (`verify-ca`, `verify-full`).
    pub verified: bool,
}

impl ServerTls {
    /// `None` when the backend's TLS is disabled.
    pub fn from_config(tls: &fulcrum_config::ServerTls) -> Option<ServerTls> {
        Some(ServerTls {
            config: tls.client_config.clone()?,
            required: tls.mode != fulcrum_config::ServerTlsMode::Prefer,
            verified: tls.mode.verifies(),
        })
    }
}

#[derive(Debug, Error)]
pub enum ConnectError {
    #[error("cannot connect to {address}: {source}")]
    Io {
        address: String,
        source: std::io::Error,
    },
    #[error("timed out after {timeout:?} connecting to {address}")]
    Timeout { address: String, timeout: Duration },
    /// The server refused with ERR the login of `user` (the server
    /// login); `payload` is it, to pass on.
    #[error("{address} refused the login of user '{user}': {message} ({code})")]
    Server {
        address: String,
        user: String,
        code: u16,
        message: String,
        payload: Vec<u8>,
    },
    #[error("protocol error from {address}: {reason}")]
    Protocol { address: String, reason: String },
    #[error("TLS with {address}: {reason}")]
    Tls { address: String, reason: String },
    /// Logged in, but `connect_query` failed: the connection is dropped.
    #[error("connect_query failed on {address}: {reason}")]
    ConnectQuery { address: String, reason: String },
}

impl ConnectError {
    /// True when the backend itself is unreachable (not a refusal of this login).
    pub fn is_backend_down(&self) -> bool {
        matches!(self, ConnectError::Io { .. } | ConnectError::Timeout { .. })
    }
}

/// Opens and authenticates a connection within `timeout`.
pub async fn connect(target: &ServerTarget, timeout: Duration) -> Result<ServerConn, ConnectError> {
    let timed_out = |timeout| ConnectError::Timeout {
        address: target.address.clone(),
        timeout,
    };
    fulcrum_net::within(timeout, connect_inner(target), timed_out).await
}

async fn connect_inner(target: &ServerTarget) -> Result<ServerConn, ConnectError> {
    let address = target.address.clone();
    let protocol = |reason: String| ConnectError::Protocol {
        address: address.clone(),
        reason,
    };
    let io_failed = |source| ConnectError::Io {
        address: address.clone(),
        source,
    };
    let stream = fulcrum_net::dns::connect(target.address.as_str())
        .await
        .map_err(&io_failed)?;
    let _ = stream.set_nodelay(true);
    let mut conn = new_conn(
        Connection::with_read_buf(
            ServerStream::Tcp(stream),
            BytesMut::with_capacity(16 * 1024),
        ),
        target,
    );
    let io = |e: InternalError| match e {
        InternalError::Io(source) => ConnectError::Io {
            address: address.clone(),
            source,
        },
        other => ConnectError::Protocol {
            address: address.clone(),
            reason: other.to_string(),
        },
    };
    let total = conn.read_message(1 << 20).await.map_err(io)?;
    let msg = conn.io.read_buf.split_to(total);
    let payload = &msg[HEADER_LEN..];
    if payload.first() == Some(&0xFF) {
        return Err(server_refusal(&address, &target.user, payload));
    }
    let hs = parse_server_handshake(payload).map_err(|e| protocol(e.to_string()))?;
    conn.connection_id = hs.connection_id;
    // Fulcrum's flags: what the pool's clients use for the wire format, no
    // LOCAL INFILE (refused by the server unless enabled), no schema at login.
    let mut caps = for_server(hs.capabilities) - C::CLIENT_CONNECT_WITH_DB;
    if !target.local_infile {
        caps -= C::CLIENT_LOCAL_FILES;
    }
    caps.set(
        C::CLIENT_DEPRECATE_EOF,
        target.wire_format.contains(C::CLIENT_DEPRECATE_EOF)
            && hs.capabilities.contains(C::CLIENT_DEPRECATE_EOF),
    );
    caps.set(
        C::CLIENT_SESSION_TRACK,
        target.wire_format.contains(C::CLIENT_SESSION_TRACK)
            && hs.capabilities.contains(C::CLIENT_SESSION_TRACK),
    );
    if caps & crate::codec::capabilities::WIRE_FORMAT != target.wire_format {
        return Err(protocol(format!(
            "server does not support the client's wire format {:?}",
            target.wire_format
        )));
    }
    let mut seq = hs_seq_after(&msg);
    let mut on_tls = false;
    if let Some(tls) = &target.tls {
        let tls_error = |reason: String| ConnectError::Tls {
            address: address.clone(),
            reason,
        };
        if hs.capabilities.contains(C::CLIENT_SSL) {
            // The same flags as the full response that follows (a server
            // may compare them): plugin auth on, no schema, no attributes.
            let final_caps = (caps | C::CLIENT_PLUGIN_AUTH)
                - C::CLIENT_CONNECT_WITH_DB
                - C::CLIENT_CONNECT_ATTRS;
            let request = build_ssl_request(final_caps, 1 << 30, target.charset);
            send_packet(&mut conn, seq, &request)
                .await
                .map_err(&io_failed)?;
            seq = seq.wrapping_add(1);
            let host = target
                .address
                .rsplit_once(':')
                .map_or(target.address.as_str(), |(h, _)| h);
            let name = fulcrum_tls::server_name(host).map_err(|e| tls_error(e.to_string()))?;
            let ServerConn { io, .. } = conn;
            let (stream, rest) = io.into_parts();
            if !rest.is_empty() {
                return Err(protocol(
                    "the server sent data before the TLS handshake".into(),
                ));
            }
            let stream = stream
                .start_tls(tls.config.clone(), name)
                .await
                .map_err(|e| tls_error(format!("TLS handshake failed: {e}")))?;
            conn = new_conn(Connection::with_read_buf(stream, rest), target);
            conn.connection_id = hs.connection_id;
            caps |= C::CLIENT_SSL;
            on_tls = true;
        } else if tls.required {
            return Err(tls_error(
                "the server does not offer SSL (no ssl_cert/ssl_key) and server_tls requires it"
                    .into(),
            ));
        }
    }
    conn.caps = caps;
    let plugin = hs.auth_plugin.as_deref().unwrap_or(native::PLUGIN);
    let (plugin, response) = auth_response(plugin, target, &hs.scramble);
    let reply = build_handshake_response(&HandshakeResponse {
        capabilities: caps,
        max_packet: 1 << 30,
        charset: target.charset,
        username: target.user.clone(),
        auth_response: response,
        database: None,
        auth_plugin: Some(plugin.to_owned()),
        connect_attrs: None,
        mariadb_capabilities: 0,
    });
    send_packet(&mut conn, seq, &reply)
        .await
        .map_err(&io_failed)?;
    loop {
        let total = conn.read_message(1 << 20).await.map_err(io)?;
        let msg = conn.io.read_buf.split_to(total);
        let seq = msg[3].wrapping_add(1);
        let payload = &msg[HEADER_LEN..];
        match classify_auth_reply(payload).map_err(|e| protocol(e.to_string()))? {
            AuthReply::Ok => {
                if target.track_gtid && conn.caps.contains(C::CLIENT_SESSION_TRACK) {
                    conn.run_simple(
                        crate::codec::command::Command::Query,
                        super::conn::TRACK_GTID_SQL.as_bytes(),
                    )
                    .await
                    .map_err(|e| protocol(format!("enabling last_gtid tracking: {e}")))?;
                    conn.track_gtid = true;
                }
                return Ok(conn);
            }
            AuthReply::Err => return Err(server_refusal(&address, &target.user, payload)),
            AuthReply::Switch => {
                let switch = parse_auth_switch(payload).map_err(|e| protocol(e.to_string()))?;
                let mut scramble = [0u8; 20];
                let n = switch.data.len().min(20);
                scramble[..n].copy_from_slice(&switch.data[..n]);
                let (_, response) = auth_response(&switch.plugin, target, &scramble);
                send_packet(&mut conn, seq, &response)
                    .await
                    .map_err(&io_failed)?;
            }
            AuthReply::MoreData => {
                // caching_sha2_password: 0x03 = fast auth done, an OK follows.
                // 0x04 = full authentication: the password itself, which
                // only goes over TLS (RSA key exchange is not done).
                if payload.get(1) == Some(&caching_sha2::PERFORM_FULL_AUTHENTICATION) {
                    if !on_tls {
                        return Err(protocol(
                            "the server wants caching_sha2_password full authentication, which needs TLS: set server_tls (or give the user a mysql_native_password login)".into(),
                        ));
                    }
                    let verified = target.tls.as_ref().is_some_and(|t| t.verified);
                    if !fulcrum_config::may_send_password(&target.address, verified) {
                        return Err(protocol(
                            "the server wants caching_sha2_password full authentication (the password itself) over TLS whose certificate is not verified: a man in the middle could be asking; set server_tls = \"verify-ca\" or \"verify-full\" (or give the user a mysql_native_password login)".into(),
                        ));
                    }
                    let mut password = zeroize::Zeroizing::new(target.password.as_bytes().to_vec());
                    password.push(0);
                    send_packet(&mut conn, seq, &password)
                        .await
                        .map_err(&io_failed)?;
                }
            }
        }
    }
}

/// Sends one packet of the login, `payload` with sequence id `seq`.
async fn send_packet(conn: &mut ServerConn, seq: u8, payload: &[u8]) -> std::io::Result<()> {
    let mut out = BytesMut::new();
    write_packet(&mut out, seq, payload);
    let sent = conn.io.send(&out).await;
    // A login packet may hold the password (caching_sha2 full authentication).
    zeroize::Zeroize::zeroize(&mut out[..]);
    sent
}

/// A connection before login: nothing set on it yet.
fn new_conn(io: Connection<ServerStream>, target: &ServerTarget) -> ServerConn {
    ServerConn {
        io: io.with_chunk(16 * 1024),
        address: target.address.clone(),
        caps: C::empty(),
        charset: target.charset,
        connection_id: 0,
        schema: None,
        applied: Vec::new(),
        prepared: Default::default(),
        track_gtid: false,
        connect_query: None,
        stmt_clock: 0,
    }
}

/// The sequence id after the server's handshake packet.
fn hs_seq_after(msg: &[u8]) -> u8 {
    msg.get(3).copied().unwrap_or(0).wrapping_add(1)
}

/// The plugin and scrambled password for `plugin` (native for anything
/// unknown, and always native for an `auth_query` user, whose password
/// Fulcrum does not know).
fn auth_response(
    plugin: &str,
    target: &ServerTarget,
    scramble: &[u8; 20],
) -> (&'static str, Vec<u8>) {
    if let Some(stage1) = &target.native_stage1 {
        return (
            native::PLUGIN,
            native::response_from_stage1(stage1, scramble),
        );
    }
    let password = target.password.as_str();
    if password.is_empty() {
        return (native::PLUGIN, Vec::new());
    }
    if plugin == caching_sha2::PLUGIN {
        (
            caching_sha2::PLUGIN,
            caching_sha2::client_response(password.as_bytes(), scramble),
        )
    } else {
        (
            native::PLUGIN,
            native::client_response(password.as_bytes(), scramble),
        )
    }
}

fn server_refusal(address: &str, user: &str, payload: &[u8]) -> ConnectError {
    match parse_err(payload) {
        Ok(err) => ConnectError::Server {
            address: address.to_owned(),
            user: user.to_owned(),
            code: err.code,
            message: String::from_utf8_lossy(err.message).into_owned(),
            payload: payload.to_vec(),
        },
        Err(e) => ConnectError::Protocol {
            address: address.to_owned(),
            reason: e.to_string(),
        },
    }
}
