//! Opening a server connection: TCP connect, TLS when `server_tls` says
//! (SSLRequest, then the handshake), StartupMessage, whatever authentication
//! the server asks (trust, cleartext, md5, SCRAM-SHA-256 and, on TLS,
//! SCRAM-SHA-256-PLUS, via postgres-protocol's client implementations), then
//! ParameterStatus and BackendKeyData up to the first ReadyForQuery.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use fulcrum_config::{ChannelBinding as BindingMode, ServerTls, ServerTlsMode};
use fulcrum_tls::rustls::ClientConfig;
use postgres_protocol::authentication::sasl::{
    ChannelBinding, ScramSha256, SCRAM_SHA_256, SCRAM_SHA_256_PLUS,
};
use postgres_protocol::message::{backend, frontend};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::conn::{CancelKey, ServerConn};
use super::stream::ServerStream;
use crate::auth::scram_keys::{Binding, KeysClient, ScramKeys};
use fulcrum_net::Connection;

/// Server connections read in larger chunks: results stream through them.
const SERVER_READ_CHUNK: usize = 16 * 1024;
use crate::codec::backend_msg::{parse_error_fields, ErrorFields};
use crate::codec::frame::check_frame;

/// Where and as whom to connect.
#[derive(Debug, Clone)]
pub struct ServerTarget {
    pub address: Arc<str>,
    pub user: String,
    pub credential: Credential,
    pub database: String,
    /// Whether the password may go in clear text when the server asks
    /// (`server_cleartext`).
    pub allow_cleartext: bool,
    /// TLS to the server; `None`: plain text (`server_tls = "disable"`).
    pub tls: Option<ServerTlsTarget>,
}

/// What proves the user to the server.
#[derive(Clone)]
pub enum Credential {
    /// The password (from the config).
    Password(String),
    /// A SCRAM ClientKey and ServerKey (an `auth_query` user, or one whose
    /// config password is a SCRAM verifier, whose client proved its key to
    /// Fulcrum): SCRAM only.
    Scram(ScramKeys),
    /// The stored md5 hash (an `auth_query` user with an md5 password, or a
    /// config password given as its md5 hash): md5 only.
    Md5(String),
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Credential::Password(_) => "Password(<redacted>)",
            Credential::Scram(_) => "Scram(<redacted>)",
            Credential::Md5(_) => "Md5(<redacted>)",
        })
    }
}

/// A SCRAM exchange in progress, from the password or from keys.
enum Scram {
    Password(ScramSha256),
    Keys(KeysClient),
}

/// How a connection uses TLS, from the backend's `server_tls` settings.
#[derive(Debug, Clone)]
pub struct ServerTlsTarget {
    pub config: Arc<ClientConfig>,
    /// A server that answers `N` to the SSLRequest is refused (every mode
    /// but `prefer`).
    pub required: bool,
    pub channel_binding: BindingMode,
    /// The server's certificate is checked (`verify-ca`, `verify-full`).
    pub verified: bool,
}

impl ServerTlsTarget {
    /// `None` when the backend's TLS is disabled.
    pub fn from_config(tls: &ServerTls) -> Option<ServerTlsTarget> {
        Some(ServerTlsTarget {
            config: tls.client_config.clone()?,
            required: tls.mode != ServerTlsMode::Prefer,
            channel_binding: tls.channel_binding,
            verified: tls.mode.verifies(),
        })
    }
}

/// The SSLRequest code (1234 5679).
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// Asks a server on `stream` for TLS and runs the handshake when it agrees.
/// Unix sockets stay plain (PostgreSQL has no TLS there).
async fn negotiate_tls(
    stream: ServerStream,
    tls: &ServerTlsTarget,
    address: &str,
) -> Result<ServerStream, TlsFailure> {
    let ServerStream::Tcp(mut tcp) = stream else {
        return Ok(stream);
    };
    // The server closing or resetting the socket here is a server going
    // away (a shutdown under way), not a TLS problem: the caller treats it
    // as down and waits for a primary.
    tcp.write_all(&SSL_REQUEST).await.map_err(TlsFailure::Io)?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer).await.map_err(TlsFailure::Io)?;
    match answer[0] {
        b'S' => {}
        b'N' if !tls.required => return Ok(ServerStream::Tcp(tcp)),
        b'N' => {
            return Err(TlsFailure::Refused(
                "the server does not accept TLS (ssl = off) and server_tls requires it".into(),
            ))
        }
        other => {
            return Err(TlsFailure::Refused(format!(
                "unexpected answer {other:#04x} to SSLRequest"
            )))
        }
    }
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
    let name = fulcrum_tls::server_name(host).map_err(|e| TlsFailure::Refused(e.to_string()))?;
    let tls_stream = fulcrum_tls::connect(tls.config.clone(), name, tcp)
        .await
        .map_err(|e| TlsFailure::Refused(format!("TLS handshake failed: {e}")))?;
    Ok(ServerStream::Tls(Box::new(tls_stream)))
}

/// Why TLS with a server could not be set up.
enum TlsFailure {
    /// The socket failed before TLS began (the server went away).
    Io(std::io::Error),
    /// The server or its certificate refused it.
    Refused(String),
}

#[derive(Debug, Error)]
pub enum ConnectError {
    #[error("cannot connect to {address}: {source}")]
    Io {
        address: Arc<str>,
        source: std::io::Error,
    },
    #[error("timed out after {timeout:?} connecting to {address}")]
    Timeout {
        address: Arc<str>,
        timeout: Duration,
    },
    /// The server refused the login of `user` (the server login) with an
    /// ErrorResponse; `frame` is it, whole, to pass on.
    #[error("{address} refused the login of user \"{user}\": {} ({})", fields.message, fields.code)]
    Server {
        address: Arc<str>,
        user: String,
        fields: ErrorFields,
        frame: BytesMut,
    },
    #[error("authentication with {address} failed: {reason}")]
    Auth { address: Arc<str>, reason: String },
    #[error("protocol error from {address}: {reason}")]
    Protocol { address: Arc<str>, reason: String },
    #[error("TLS with {address}: {reason}")]
    Tls { address: Arc<str>, reason: String },
    /// Logged in, but `connect_query` failed: the connection is dropped.
    #[error("connect_query failed on {address}: {reason}")]
    ConnectQuery { address: Arc<str>, reason: String },
}

impl ConnectError {
    /// True when the backend itself is unreachable (not a refusal of this login).
    pub fn is_backend_down(&self) -> bool {
        matches!(self, ConnectError::Io { .. } | ConnectError::Timeout { .. })
    }
}

/// Opens and authenticates a connection within `timeout`.
pub async fn connect(target: &ServerTarget, timeout: Duration) -> Result<ServerConn, ConnectError> {
    connect_with(target, &[], timeout).await
}

/// [`connect`] with more startup parameters (a change stream's `replication=database`).
pub async fn connect_with(
    target: &ServerTarget,
    extra: &[(&str, &str)],
    timeout: Duration,
) -> Result<ServerConn, ConnectError> {
    let timed_out = |timeout| ConnectError::Timeout {
        address: target.address.clone(),
        timeout,
    };
    fulcrum_net::within(timeout, connect_inner(target, extra), timed_out).await
}

async fn connect_inner(
    target: &ServerTarget,
    extra: &[(&str, &str)],
) -> Result<ServerConn, ConnectError> {
    let address = target.address.clone();
    let io = |source| ConnectError::Io {
        address: address.clone(),
        source,
    };
    let protocol = |reason: &str| ConnectError::Protocol {
        address: address.clone(),
        reason: reason.to_owned(),
    };
    let auth = |reason: String| ConnectError::Auth {
        address: address.clone(),
        reason,
    };
    let mut stream = super::stream::connect(&target.address).await.map_err(io)?;
    if let Some(tls) = &target.tls {
        stream = negotiate_tls(stream, tls, &target.address)
            .await
            .map_err(|f| match f {
                TlsFailure::Io(source) => ConnectError::Io {
                    address: address.clone(),
                    source,
                },
                TlsFailure::Refused(reason) => ConnectError::Tls {
                    address: address.clone(),
                    reason,
                },
            })?;
    }
    // The server certificate's hash, for SCRAM-SHA-256-PLUS.
    let binding_hash = stream
        .tls()
        .and_then(fulcrum_tls::peer_certificate)
        .and_then(fulcrum_tls::certificate_hash);
    let binding_mode = target
        .tls
        .as_ref()
        .map_or(BindingMode::Disable, |t| t.channel_binding);
    let mut out = BytesMut::new();
    frontend::startup_message(
        // Nothing else (`extra`: connections no client uses): the server's
        // defaults are what `RESET ALL` returns to between clients; each
        // client's own startup parameters are replayed on top (frontend::session).
        [
            ("user", target.user.as_str()),
            ("database", target.database.as_str()),
        ]
        .into_iter()
        .chain(extra.iter().copied()),
        &mut out,
    )
    .map_err(io)?;
    stream.write_all(&out).await.map_err(io)?;

    let mut buf = BytesMut::with_capacity(8192);
    let mut scram: Option<Scram> = None;
    // SCRAM proves both sides: AuthenticationOk counts only after the
    // server's own signature was checked.
    let mut scram_verified = false;
    // The login went through SCRAM-SHA-256-PLUS.
    let mut bound = false;
    let mut reported = BTreeMap::new();
    let mut key = None;
    loop {
        // Read one whole message.
        let header = loop {
            if let Some(h) = check_frame(&buf, 1 << 20).map_err(|e| protocol(&e.to_string()))? {
                if buf.len() >= h.total {
                    break h;
                }
            }
            if stream.read_buf(&mut buf).await.map_err(io)? == 0 {
                return Err(protocol("server closed the connection during login"));
            }
        };
        if header.tag == b'E' {
            let frame = buf.split_to(header.total);
            return Err(ConnectError::Server {
                address: address.clone(),
                user: target.user.clone(),
                fields: parse_error_fields(&frame[5..]),
                frame,
            });
        }
        let mut one = buf.split_to(header.total);
        let msg = backend::Message::parse(&mut one)
            .map_err(|e| protocol(&e.to_string()))?
            .ok_or_else(|| protocol("incomplete message"))?;
        out.clear();
        match msg {
            backend::Message::AuthenticationOk => {
                if scram.is_some() && !scram_verified {
                    return Err(auth(
                        "the server accepted the login without its SCRAM signature (it did not prove it knows the password): refused".into(),
                    ));
                }
                if binding_mode == BindingMode::Require && !bound {
                    return Err(auth("server_channel_binding = \"require\", but the server authenticated Fulcrum without channel binding (it must use scram-sha-256 over TLS)".into()));
                }
            }
            backend::Message::AuthenticationCleartextPassword => {
                let Credential::Password(password) = &target.credential else {
                    return Err(auth(format!("the server asks for the password in clear text, which Fulcrum does not know for user {:?} (it holds only the user's stored SCRAM verifier or md5 hash, from auth_query or the config): use scram-sha-256 (or md5) for this user in the server's pg_hba.conf", target.user)));
                };
                if !target.allow_cleartext {
                    return Err(auth("the server asks for the password in clear text and server_cleartext = false: use scram-sha-256 on the server (or set server_cleartext = true)".into()));
                }
                let verified =
                    stream.tls().is_some() && target.tls.as_ref().is_some_and(|t| t.verified);
                if !fulcrum_config::may_send_password(&target.address, verified) {
                    return Err(auth("the server asks for the password in clear text over a link whose other end is not verified (not a Unix socket or loopback, and server_tls below verify-ca): a man in the middle could be asking; use scram-sha-256 on the server, or server_tls = \"verify-ca\" / \"verify-full\"".into()));
                }
                if stream.tls().is_none() {
                    tracing::warn!(server = %address, user = ?target.user, "sending the password in clear text on a local link (the server asks for password authentication): use scram-sha-256 on the server, or set server_cleartext = false to refuse");
                }
                frontend::password_message(password.as_bytes(), &mut out).map_err(io)?;
            }
            backend::Message::AuthenticationMd5Password(body) => {
                let hash = match &target.credential {
                    Credential::Password(password) => postgres_protocol::authentication::md5_hash(
                        target.user.as_bytes(),
                        password.as_bytes(),
                        body.salt(),
                    ),
                    Credential::Md5(stored) => {
                        crate::auth::md5::response_from_hash(stored, body.salt())
                    }
                    Credential::Scram(_) => return Err(auth(format!("the server asks for md5, but Fulcrum holds only a SCRAM verifier for user {:?} (from auth_query or the config), which cannot answer md5: use scram-sha-256 for this user in the server's pg_hba.conf", target.user))),
                };
                frontend::password_message(hash.as_bytes(), &mut out).map_err(io)?;
            }
            backend::Message::AuthenticationSasl(body) => {
                let mut mechanisms = body.mechanisms();
                let (mut plain, mut plus) = (false, false);
                while let Some(m) = fallible_next(&mut mechanisms).map_err(io)? {
                    plain |= m == SCRAM_SHA_256;
                    plus |= m == SCRAM_SHA_256_PLUS;
                }
                // Bind when both sides can, unless told not to; say "y"
                // (could, but not offered) so a stripped PLUS is detected.
                let (mechanism, binding) = match (&binding_hash, binding_mode) {
                    (Some(hash), BindingMode::Prefer | BindingMode::Require) if plus => {
                        bound = true;
                        (
                            SCRAM_SHA_256_PLUS,
                            ChannelBinding::tls_server_end_point(hash.clone()),
                        )
                    }
                    (_, BindingMode::Require) => {
                        return Err(auth("server_channel_binding = \"require\", but the server does not offer SCRAM-SHA-256-PLUS on this connection".into()));
                    }
                    (Some(_), BindingMode::Prefer) if plain => {
                        (SCRAM_SHA_256, ChannelBinding::unrequested())
                    }
                    _ if plain => (SCRAM_SHA_256, ChannelBinding::unsupported()),
                    _ => return Err(auth("server offers no supported SASL mechanism".into())),
                };
                let s = match &target.credential {
                    Credential::Password(password) => {
                        let s = ScramSha256::new(password.as_bytes(), binding);
                        frontend::sasl_initial_response(mechanism, s.message(), &mut out)
                            .map_err(io)?;
                        Scram::Password(s)
                    }
                    Credential::Scram(keys) => {
                        let binding = match (mechanism == SCRAM_SHA_256_PLUS, &binding_hash) {
                            (true, Some(hash)) => Binding::EndPoint(hash.clone()),
                            _ if binding_hash.is_some() => Binding::Unrequested,
                            _ => Binding::None,
                        };
                        let nonce: [u8; 18] = rand::random();
                        let nonce = base64::Engine::encode(
                            &base64::engine::general_purpose::STANDARD,
                            nonce,
                        );
                        let s = KeysClient::new(keys.clone(), &nonce, binding);
                        frontend::sasl_initial_response(
                            mechanism,
                            s.client_first().as_bytes(),
                            &mut out,
                        )
                        .map_err(io)?;
                        Scram::Keys(s)
                    }
                    Credential::Md5(_) => return Err(auth(format!("the server asks for SCRAM, but Fulcrum holds only an md5 hash for user {:?} (from auth_query or the config; SCRAM needs the password): store the password as SCRAM (password_encryption = scram-sha-256) or use md5 for this user in the server's pg_hba.conf", target.user))),
                };
                scram = Some(s);
            }
            backend::Message::AuthenticationSaslContinue(body) => {
                let s = scram
                    .as_mut()
                    .ok_or_else(|| protocol("SASL continue without SASL start"))?;
                match s {
                    Scram::Password(s) => {
                        s.update(body.data()).map_err(|e| auth(e.to_string()))?;
                        frontend::sasl_response(s.message(), &mut out).map_err(io)?;
                    }
                    Scram::Keys(s) => {
                        let message = s
                            .client_final(body.data())
                            .map_err(|e| auth(format!("user {:?}: {e}", target.user)))?;
                        frontend::sasl_response(message.as_bytes(), &mut out).map_err(io)?;
                    }
                }
            }
            backend::Message::AuthenticationSaslFinal(body) => {
                let s = scram
                    .as_mut()
                    .ok_or_else(|| protocol("SASL final without SASL start"))?;
                match s {
                    Scram::Password(s) => s.finish(body.data()).map_err(|e| e.to_string()),
                    Scram::Keys(s) => s.verify_final(body.data()).map_err(|e| e.to_string()),
                }
                .map_err(|e| auth(format!("the server's SCRAM signature: {e}")))?;
                scram_verified = true;
            }
            backend::Message::ParameterStatus(body) => {
                let name = body.name().map_err(io)?.to_owned();
                let value = body.value().map_err(io)?.to_owned();
                reported.insert(name, value);
            }
            backend::Message::BackendKeyData(body) => {
                key = Some(CancelKey {
                    address: address.clone(),
                    process_id: body.process_id(),
                    secret_key: body.secret_key(),
                    tls: target.tls.clone().filter(|_| stream.tls().is_some()),
                });
            }
            backend::Message::NoticeResponse(_) => {}
            backend::Message::ReadyForQuery(_) => {
                let cancel =
                    key.ok_or_else(|| protocol("no BackendKeyData before ReadyForQuery"))?;
                return Ok(ServerConn {
                    io: Connection::with_read_buf(stream, buf).with_chunk(SERVER_READ_CHUNK),
                    cancel: Arc::new(cancel),
                    lexes_apart: super::conn::lexes_apart(&reported),
                    reported,
                    applied: Default::default(),
                    prepared: Default::default(),
                    reset_due: false,
                });
            }
            backend::Message::AuthenticationKerberosV5
            | backend::Message::AuthenticationScmCredential
            | backend::Message::AuthenticationGss
            | backend::Message::AuthenticationSspi => {
                return Err(auth("the server asks for an unsupported authentication method; use trust, password, md5 or scram-sha-256 for Fulcrum's user".into()));
            }
            _ => return Err(protocol("unexpected message during login")),
        }
        if !out.is_empty() {
            let sent = stream.write_all(&out).await.map_err(io);
            // It may have held the password (cleartext authentication).
            zeroize::Zeroize::zeroize(&mut out[..]);
            sent?;
        }
        let _ = one.remaining();
    }
}

fn fallible_next<'a>(
    it: &mut postgres_protocol::message::backend::SaslMechanisms<'a>,
) -> std::io::Result<Option<&'a str>> {
    use fallible_iterator::FallibleIterator;
    it.next()
}

/// Sends a CancelRequest for `key` on a fresh connection.
pub async fn send_cancel(key: &CancelKey, timeout: Duration) -> std::io::Result<()> {
    let fut = async {
        let mut stream = super::stream::connect(&key.address).await?;
        if let Some(tls) = &key.tls {
            stream = negotiate_tls(stream, tls, &key.address)
                .await
                .map_err(|f| match f {
                    TlsFailure::Io(e) => e,
                    TlsFailure::Refused(reason) => std::io::Error::other(reason),
                })?;
        }
        let mut out = BytesMut::new();
        frontend::cancel_request(key.process_id, key.secret_key, &mut out);
        stream.write_all(&out).await?;
        // The server closes the connection when it has read the request.
        let mut sink = [0u8; 16];
        let _ = stream.read(&mut sink).await;
        Ok(())
    };
    tokio::time::timeout(timeout, fut).await.map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::TimedOut, "cancel request timed out")
    })?
}

#[cfg(test)]
mod tests {
    //! Logins against a scripted server on loopback: what a hostile or
    //! misconfigured server may send, byte for byte.

    use super::*;
    use crate::codec::backend_msg;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A server that reads the startup packet, then for each step sends
    /// the step's bytes after reading one client message; returns what the
    /// client sent after the startup.
    async fn scripted(steps: Vec<Vec<u8>>) -> (String, tokio::task::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut len = [0u8; 4];
            s.read_exact(&mut len).await.unwrap();
            let mut rest = vec![0u8; u32::from_be_bytes(len) as usize - 4];
            s.read_exact(&mut rest).await.unwrap();
            let mut seen = Vec::new();
            for (i, step) in steps.iter().enumerate() {
                if i > 0 {
                    let mut head = [0u8; 5];
                    if s.read_exact(&mut head).await.is_err() {
                        break;
                    }
                    let mut body =
                        vec![0u8; u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize - 4];
                    s.read_exact(&mut body).await.unwrap();
                    seen.extend_from_slice(&head);
                    seen.extend_from_slice(&body);
                }
                if s.write_all(step).await.is_err() {
                    break;
                }
            }
            let mut tail = Vec::new();
            let _ =
                tokio::time::timeout(Duration::from_millis(200), s.read_to_end(&mut tail)).await;
            seen.extend_from_slice(&tail);
            seen
        });
        (address, task)
    }

    fn target(address: String, allow_cleartext: bool) -> ServerTarget {
        ServerTarget {
            address: address.into(),
            user: "app".into(),
            credential: Credential::Password("s3cret".into()),
            database: "app".into(),
            allow_cleartext,
            tls: None,
        }
    }

    fn auth(kind: i32, extra: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        backend_msg::auth_request(&mut out, kind, extra);
        out.to_vec()
    }

    #[tokio::test]
    async fn an_ok_without_the_scram_signature_is_refused() {
        let sasl = auth(backend_msg::AUTH_SASL, b"SCRAM-SHA-256\0\0");
        // After the client-first message: AuthenticationOk at once.
        let (address, server) = scripted(vec![sasl, auth(backend_msg::AUTH_OK, &[])]).await;
        let e = connect(&target(address, true), Duration::from_secs(5))
            .await
            .err()
            .expect("refused");
        assert!(e.to_string().contains("SCRAM signature"), "{e}");
        server.abort();
    }

    #[tokio::test]
    async fn cleartext_is_sent_only_when_allowed() {
        let ask = auth(backend_msg::AUTH_CLEARTEXT, &[]);
        let (address, server) = scripted(vec![ask.clone()]).await;
        let e = connect(&target(address, false), Duration::from_secs(5))
            .await
            .err()
            .expect("refused");
        assert!(e.to_string().contains("server_cleartext = false"), "{e}");
        let sent = server.await.unwrap();
        assert!(
            !sent.windows(6).any(|w| w == b"s3cret"),
            "the password must not be sent: {sent:?}"
        );
        // Allowed: the password goes (the scripted server then hangs up).
        let (address, server) = scripted(vec![ask, Vec::new()]).await;
        let _ = connect(&target(address, true), Duration::from_secs(2)).await;
        let sent = server.await.unwrap();
        assert!(sent.windows(6).any(|w| w == b"s3cret"), "{sent:?}");
    }
}
