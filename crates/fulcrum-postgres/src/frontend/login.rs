//! The client's login: startup packet (SSL/GSS refused with 'N', cancel
//! requests forwarded), then trust, md5, SCRAM-SHA-256 (or, from an hba
//! `password` line, a cleartext password) against the
//! configured users. Wrong password and unknown user fail alike (28P01), and
//! an unknown user still goes through a full exchange, so users cannot be
//! enumerated.

use std::sync::Arc;

use base64::Engine;
use bytes::BytesMut;
use fulcrum_config::ClientAuth;
use fulcrum_tls::ClientStream;

use crate::auth::scram_keys::ScramKeys;
use crate::auth::secret::StoredSecret;
use crate::backend::Credential;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::context::ClusterContext;
use super::error::SessionError;
use super::startup_options::{parse_options, startup_param_stmt};
use crate::auth::{md5, scram};
use crate::backend::conn::SessionParams;
use crate::codec::backend_msg::{self, sqlstate};
use crate::codec::frame::check_frame;
use crate::codec::frontend_msg::{password_msg, sasl_initial_msg};
use crate::codec::startup::{parse_startup, StartupError, StartupPacket};

/// Auth messages are small; anything larger is an attack or garbage.
const MAX_AUTH_MESSAGE: u64 = 16 * 1024;

/// Who logged in, and the session parameters the client asked for.
pub struct Login {
    pub user: Arc<str>,
    /// Whose pools serve it: `user`, or the server login its database
    /// forces (`[[cluster.database]]` `server_user`), shared by all.
    pub pool_user: Arc<str>,
    pub database: Arc<str>,
    pub startup: SessionParams,
}

async fn read_more<S: Stream>(stream: &mut S, buf: &mut BytesMut) -> Result<(), SessionError> {
    if stream.read_buf(buf).await? == 0 {
        return Err(SessionError::ClientGone);
    }
    Ok(())
}

/// A client socket: plain TCP, TLS, or whatever the admin console holds.
pub trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin {}
impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> Stream for S {}

/// Writes `bytes` and pushes them out (a TLS stream holds them otherwise).
pub(super) async fn send<S: Stream>(stream: &mut S, bytes: &[u8]) -> std::io::Result<()> {
    stream.write_all(bytes).await?;
    stream.flush().await
}

/// Sends a FATAL error and returns the error that ends the session.
pub async fn fatal<S: Stream>(stream: &mut S, code: &str, message: &str) -> SessionError {
    let mut out = BytesMut::new();
    backend_msg::error_response(&mut out, "FATAL", code, message);
    let _ = send(stream, &out).await;
    SessionError::Refused(message.to_owned())
}

/// The TLS handshake, on a listener with TLS: after an SSLRequest answered
/// `S`, or at once when the client opens with a TLS record (PostgreSQL 17's
/// direct negotiation, `sslnegotiation=direct`).
pub async fn start_tls(
    stream: &mut ClientStream,
    tls: &fulcrum_config::ClientTls,
) -> Result<(), SessionError> {
    let acceptor = fulcrum_tls::TlsAcceptor::from(tls.server_config.clone());
    stream
        .upgrade(&acceptor)
        .await
        .map_err(|e| SessionError::Refused(format!("TLS handshake failed: {e}")))
}

/// Runs the startup phase. `Ok(None)`: the connection was a cancel request.
/// The login on a listener shared by `clusters` (one, or several picked by
/// database name): TLS and the startup packet as the first cluster says
/// (clusters on one port have the same TLS settings), then the
/// authentication of the cluster serving the database asked for. Returns
/// that cluster with the login.
pub async fn login(
    clusters: &[Arc<ClusterContext>],
    stream: &mut ClientStream,
    buf: &mut BytesMut,
    ticket: &fulcrum_net::PendingTicket,
) -> Result<Option<(Arc<ClusterContext>, Login)>, SessionError> {
    let ctx: &ClusterContext = &clusters[0];
    // No TLS over the Unix socket (PgBouncer's rule): an SSLRequest there
    // is answered `N`, and `tls_mode = "require"` is for TCP clients.
    let tls = ctx.config.tls.as_ref().filter(|_| !stream.is_unix());
    if let Some(tls) = tls {
        let mut first = [0u8; 1];
        let direct = match stream.tcp() {
            Some(tcp) if buf.is_empty() => tcp.peek(&mut first).await? == 1 && first[0] == 0x16,
            _ => false,
        };
        if direct {
            start_tls(stream, tls).await?;
            // As PostgreSQL 17: a direct TLS connection must have agreed on
            // `postgresql` by ALPN (so a TLS connection meant for another
            // service cannot be turned against this one).
            if stream.alpn_protocol() != Some(b"postgresql") {
                return Err(fatal(
                    stream,
                    sqlstate::PROTOCOL_VIOLATION,
                    "received direct SSL connection request without ALPN protocol negotiation extension",
                )
                .await);
            }
        }
    }
    let params = loop {
        let parsed = match parse_startup(buf) {
            Ok(p) => p,
            Err(e) => {
                // As PostgreSQL: an unsupported protocol version is 0A000.
                let code = match e {
                    StartupError::UnsupportedProtocol { .. } => sqlstate::FEATURE_NOT_SUPPORTED,
                    _ => sqlstate::PROTOCOL_VIOLATION,
                };
                return Err(fatal(stream, code, &e.to_string()).await);
            }
        };
        match parsed {
            None => read_more(stream, buf).await?,
            Some((packet, used)) => {
                let _ = buf.split_to(used);
                match packet {
                    StartupPacket::Ssl => match tls {
                        Some(tls) if !stream.is_tls() => {
                            if !buf.is_empty() {
                                // Bytes sent before the handshake would be
                                // taken as sent over TLS (CVE-2021-23214).
                                return Err(fatal(
                                    stream,
                                    sqlstate::PROTOCOL_VIOLATION,
                                    "received unencrypted data after SSL request",
                                )
                                .await);
                            }
                            send(stream, b"S").await?;
                            start_tls(stream, tls).await?;
                        }
                        _ => send(stream, b"N").await?,
                    },
                    StartupPacket::GssEnc => send(stream, b"N").await?,
                    StartupPacket::Cancel {
                        process_id,
                        secret_key,
                    } => {
                        super::cancel::answer(clusters, process_id, secret_key).await;
                        return Ok(None);
                    }
                    StartupPacket::Startup { params, .. } => {
                        ticket.mark_started();
                        let require =
                            tls.is_some_and(|t| t.mode == fulcrum_config::TlsMode::Require);
                        if require && !stream.is_tls() {
                            return Err(fatal(
                                stream,
                                sqlstate::INVALID_AUTHORIZATION,
                                "fulcrum: this listener requires TLS (tls_mode = \"require\"); connect with sslmode=require",
                            )
                            .await);
                        }
                        break params;
                    }
                }
            }
        }
    };
    let mut user = None;
    let mut database = None;
    let mut startup = SessionParams::new();
    for (name, value) in params {
        match name.as_str() {
            "user" => user = Some(value),
            "database" => database = Some(value),
            "replication" if value != "false" && value != "0" && value != "off" => {
                return Err(fatal(
                    stream,
                    sqlstate::FEATURE_NOT_SUPPORTED,
                    "fulcrum does not proxy replication connections; connect to the server directly",
                )
                .await)
            }
            "replication" => {}
            "options" => {
                for (k, v) in parse_options(&value) {
                    startup.insert(k.to_ascii_lowercase(), startup_param_stmt(&k, &v));
                }
            }
            _ => {
                startup.insert(name.to_ascii_lowercase(), startup_param_stmt(&name, &value));
            }
        }
    }
    let Some(user) = user.filter(|u| !u.is_empty()) else {
        return Err(fatal(
            stream,
            sqlstate::INVALID_AUTHORIZATION,
            "no PostgreSQL user name specified in startup packet",
        )
        .await);
    };
    let database = database
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| user.clone());
    let chosen = fulcrum_config::cluster_for_database(clusters, |c| &c.config, &database)
        .expect("a listener has a cluster")
        .clone();
    let ctx: &ClusterContext = &chosen;
    authenticate(ctx, stream, buf, &user, &database).await?;
    if fulcrum_cluster::clients::registry().is_database_disabled(&database) {
        // PostgreSQL's own words for a database that takes no connections.
        let message = format!(
            "database \"{database}\" is not currently accepting connections (DISABLE in Fulcrum's console)"
        );
        return Err(fatal(stream, "55000", &message).await);
    }
    // `[[cluster.database]]`: only the databases listed, by their server
    // names; checked after the password, as PostgreSQL does.
    let pool_user: Arc<str> = ctx.config.pool_user(&user, &database).into();
    let Some(database) = ctx.config.server_database(&database).map(str::to_owned) else {
        let message = format!("database \"{database}\" does not exist");
        return Err(fatal(stream, sqlstate::INVALID_CATALOG_NAME, &message).await);
    };
    let login = Login {
        pool_user,
        user: user.into(),
        database: database.into(),
        startup,
    };
    // Before AuthenticationOk's followers: the client's first reads find
    // the database's functions read (function_catalog_wait at most).
    // (As the pool's login: the client's may not exist on the server.)
    ctx.catalog_at_login(&login.pool_user, (0, 0), &login.database)
        .await;
    Ok(Some((chosen, login)))
}

/// Reads one whole 'p' (password/SASL) message body.
pub(super) async fn read_auth_message<S: Stream>(
    stream: &mut S,
    buf: &mut BytesMut,
) -> Result<BytesMut, SessionError> {
    loop {
        let header = match check_frame(buf, MAX_AUTH_MESSAGE) {
            Ok(h) => h,
            Err(e) => return Err(fatal(stream, sqlstate::PROTOCOL_VIOLATION, &e.to_string()).await),
        };
        if let Some(h) = header {
            if h.tag != b'p' {
                let msg = format!(
                    "expected password response, got message type {:?}",
                    h.tag as char
                );
                return Err(fatal(stream, sqlstate::PROTOCOL_VIOLATION, &msg).await);
            }
            if buf.len() >= h.total {
                let mut frame = buf.split_to(h.total);
                let _ = frame.split_to(5);
                return Ok(frame);
            }
        }
        read_more(stream, buf).await?;
    }
}

pub(super) fn auth_failed(user: &str) -> String {
    format!("password authentication failed for user \"{user}\"")
}

async fn authenticate(
    ctx: &ClusterContext,
    stream: &mut ClientStream,
    buf: &mut BytesMut,
    user: &str,
    database: &str,
) -> Result<(), SessionError> {
    let method = super::hba::method(ctx, stream, user, database).await?;
    let known = ctx
        .users
        .get(user)
        .map(|u| (u.password.as_str(), &u.verifier));
    if method == ClientAuth::Cert {
        return certificate_login(ctx, stream, user).await;
    }
    // On TLS, SCRAM-SHA-256-PLUS is offered, bound to the listener's certificate.
    let binding = match (&ctx.config.tls, stream.is_tls()) {
        (Some(tls), true) => tls.end_point_hash.clone(),
        _ => None,
    };
    let binding = binding.as_deref();
    // A password given as the server stores it (SCRAM verifier, md5 hash).
    if let Some(u) = ctx.users.get(user).filter(|u| u.stored.is_some()) {
        return super::stored_login::login(ctx, stream, buf, user, method, u, binding).await;
    }
    // Only a password proves an auth_query user (the server login needs it).
    let proves = matches!(method, ClientAuth::Md5 | ClientAuth::ScramSha256);
    if known.is_none() && ctx.config.auth_query.is_some() && proves {
        return auth_query_login(ctx, stream, buf, (user, method), binding).await;
    }
    let ok = password_exchange(stream, buf, method, user, known, binding, || {
        mock_verifier(ctx, user)
    })
    .await?;
    if !ok {
        tracing::info!(user, "client authentication failed");
        return Err(fatal(stream, sqlstate::INVALID_PASSWORD, &auth_failed(user)).await);
    }
    Ok(())
}

/// A user not in the config, with `auth_query`: checked against the
/// secret the server stores; what the client proved is kept for the
/// pools' server logins. Unknown users go through the same exchange
/// against a mock verifier and get the same 28P01.
async fn auth_query_login(
    ctx: &ClusterContext,
    stream: &mut ClientStream,
    buf: &mut BytesMut,
    (user, method): (&str, ClientAuth),
    binding: Option<&[u8]>,
) -> Result<(), SessionError> {
    let looked = match super::auth_query::lookup(ctx, user, stream.peer_ip()).await {
        Ok(l) => l,
        Err(e) => {
            // The cause (which may name a server) goes to the log only.
            tracing::warn!(user, error = %e, "auth_query failed");
            let message = "fulcrum: cannot check the password now";
            return Err(fatal(stream, sqlstate::INVALID_AUTHORIZATION, message).await);
        }
    };
    if looked.outcome == fulcrum_cluster::AuthOutcome::Limited {
        tracing::warn!(
            user,
            peer = ?stream.peer_ip(),
            "auth_query not run: this address found no user too often (auth_failed_lookups_per_minute)"
        );
    }
    // The method offered depends on client_auth (or the hba line) alone, never on what the
    // server stores: a secret the method cannot check fails like an
    // unknown user (the same exchange, the same 28P01), and the log says why.
    let usable = match (&looked.secret, method) {
        (Some(StoredSecret::Md5(_)), ClientAuth::ScramSha256) => {
            tracing::warn!(user, "the password is stored as md5, which SCRAM cannot check: set client_auth = \"md5\" or store it as SCRAM");
            None
        }
        (Some(StoredSecret::Scram(_)), ClientAuth::Md5) => {
            tracing::warn!(user, "the password is stored as SCRAM, which md5 cannot check: set client_auth = \"scram-sha-256\"");
            None
        }
        (secret, _) => secret.clone(),
    };
    let proof = match usable {
        Some(StoredSecret::Scram(verifier)) => {
            let keys = (
                verifier.server_key,
                verifier.salt.clone(),
                verifier.iterations,
            );
            scram_exchange(stream, buf, verifier, true, binding)
                .await?
                .map(|client_key| {
                    Credential::Scram(ScramKeys {
                        client_key,
                        server_key: keys.0,
                        salt: keys.1,
                        iterations: keys.2,
                    })
                })
        }
        Some(StoredSecret::Md5(hash)) => {
            let mut out = BytesMut::new();
            let salt: [u8; 4] = rand::random();
            backend_msg::auth_request(&mut out, backend_msg::AUTH_MD5, &salt);
            send(stream, &out).await?;
            let body = read_auth_message(stream, buf).await?;
            let response = password_msg(&body).unwrap_or_default();
            md5::verify_hash(&hash, salt, response).then_some(Credential::Md5(hash))
        }
        Some(StoredSecret::Plain(password)) => {
            let verifier =
                scram::Verifier::new(&password, &rand::random::<[u8; 16]>(), scram::ITERATIONS);
            let ok = password_exchange(
                stream,
                buf,
                method,
                user,
                Some((&password, &verifier)),
                binding,
                || mock_verifier(ctx, user),
            )
            .await?;
            ok.then_some(Credential::Password(password))
        }
        None => {
            // The same exchange as for a real user, failing at its end.
            let _ = password_exchange(stream, buf, method, user, None, binding, || {
                mock_verifier(ctx, user)
            })
            .await?;
            None
        }
    };
    match proof {
        Some(credential) => {
            ctx.auth.remember_proof(user, credential);
            Ok(())
        }
        None => {
            if looked.cached {
                // The password may have changed: fetch again next time.
                ctx.auth.forget(user);
            }
            tracing::info!(user, "client authentication failed (auth_query)");
            Err(fatal(stream, sqlstate::INVALID_PASSWORD, &auth_failed(user)).await)
        }
    }
}

/// `client_auth = "cert"`: the TLS client certificate (already checked
/// against `tls_client_ca` in the handshake) must name the user as its CN,
/// and the user must be listed (its server password is in the config).
async fn certificate_login(
    ctx: &ClusterContext,
    stream: &mut ClientStream,
    user: &str,
) -> Result<(), SessionError> {
    let Some(cert) = stream.client_certificate() else {
        return Err(fatal(
            stream,
            sqlstate::INVALID_AUTHORIZATION,
            "connection requires a valid client certificate",
        )
        .await);
    };
    let name = fulcrum_tls::common_name(cert);
    if name.as_deref() == Some(user) && ctx.users.contains_key(user) {
        return Ok(());
    }
    tracing::info!(user, certificate_cn = ?name, "client certificate authentication failed");
    let message = format!("certificate authentication failed for user \"{user}\"");
    Err(fatal(stream, sqlstate::INVALID_AUTHORIZATION, &message).await)
}

/// The password part of a login (after the startup packet, before
/// AuthenticationOk): asks for the password by `method` and checks the
/// answer against `known` (the user's password and SCRAM verifier; `None`
/// for an unknown user, who then goes through the same exchange against
/// `unknown()`, a verifier no password matches, and fails only at the end).
/// `Ok(false)`: wrong password or unknown user (the caller answers 28P01);
/// `Err`: the client broke the protocol (already answered) or went away.
/// `binding`: on a TLS connection, the listener certificate's
/// `tls-server-end-point` hash; SCRAM-SHA-256-PLUS is then offered first.
/// Shared by client logins and the admin console.
pub async fn password_exchange<S: Stream>(
    stream: &mut S,
    buf: &mut BytesMut,
    method: ClientAuth,
    user: &str,
    known: Option<(&str, &scram::Verifier)>,
    binding: Option<&[u8]>,
    unknown: impl FnOnce() -> scram::Verifier,
) -> Result<bool, SessionError> {
    let mut out = BytesMut::new();
    let ok = match method {
        ClientAuth::Trust => known.is_some(),
        // Decided by the TLS certificate before any password exchange.
        ClientAuth::Cert => false,
        // Resolved to a line's method before (`super::hba::method`).
        ClientAuth::Hba => false,
        // An hba `password` line: the password in clear text.
        ClientAuth::Password => {
            backend_msg::auth_request(&mut out, backend_msg::AUTH_CLEARTEXT, &[]);
            send(stream, &out).await?;
            let body = read_auth_message(stream, buf).await?;
            let response = password_msg(&body).unwrap_or_default();
            known
                .is_some_and(|(password, _)| scram::constant_time_eq(password.as_bytes(), response))
        }
        // MySQL's methods: refused for PostgreSQL clusters by the config.
        ClientAuth::MysqlNativePassword | ClientAuth::CachingSha2Password => false,
        ClientAuth::Md5 => {
            let salt: [u8; 4] = rand::random();
            backend_msg::auth_request(&mut out, backend_msg::AUTH_MD5, &salt);
            send(stream, &out).await?;
            let body = read_auth_message(stream, buf).await?;
            let response = password_msg(&body).unwrap_or_default();
            known.is_some_and(|(password, _)| md5::verify(user, password, salt, response))
        }
        ClientAuth::ScramSha256 => {
            let verifier = match known {
                Some((_, v)) => v.clone(),
                None => unknown(),
            };
            scram_exchange(stream, buf, verifier, known.is_some(), binding)
                .await?
                .is_some()
        }
    };
    Ok(ok)
}

/// A SCRAM exchange against `verifier` (SCRAM-SHA-256-PLUS offered too
/// when `binding` is the listener certificate's hash). `Ok(Some(client_key))`
/// when the client proved it and `accept` (a real user, not a mock
/// verifier's); `Ok(None)`: wrong password or unknown user.
pub async fn scram_exchange<S: Stream>(
    stream: &mut S,
    buf: &mut BytesMut,
    verifier: scram::Verifier,
    accept: bool,
    binding: Option<&[u8]>,
) -> Result<Option<[u8; 32]>, SessionError> {
    let mut out = BytesMut::new();
    match binding {
        Some(_) => {
            backend_msg::auth_sasl_mechanisms(&mut out, &[scram::MECHANISM_PLUS, scram::MECHANISM])
        }
        None => backend_msg::auth_sasl(&mut out, scram::MECHANISM),
    }
    send(stream, &out).await?;
    let body = read_auth_message(stream, buf).await?;
    let Some((mechanism, first)) = sasl_initial_msg(&body) else {
        return Err(fatal(
            stream,
            sqlstate::PROTOCOL_VIOLATION,
            "malformed SASL initial response",
        )
        .await);
    };
    let plus = binding.is_some() && mechanism == scram::MECHANISM_PLUS.as_bytes();
    if mechanism != scram::MECHANISM.as_bytes() && !plus {
        return Err(fatal(
            stream,
            sqlstate::PROTOCOL_VIOLATION,
            "client selected an invalid SASL authentication mechanism",
        )
        .await);
    }
    let nonce: [u8; 18] = rand::random();
    let nonce = base64::engine::general_purpose::STANDARD.encode(nonce);
    let mut server = scram::ScramServer::new(verifier, nonce)
        .with_channel_binding(binding.map(<[u8]>::to_vec), plus);
    let server_first = match server.server_first(first) {
        Ok(s) => s,
        Err(e) => return Err(fatal(stream, sqlstate::PROTOCOL_VIOLATION, &e.to_string()).await),
    };
    out.clear();
    backend_msg::auth_request(
        &mut out,
        backend_msg::AUTH_SASL_CONTINUE,
        server_first.as_bytes(),
    );
    send(stream, &out).await?;
    let body = read_auth_message(stream, buf).await?;
    match server.server_final(&body) {
        Ok(server_final) if accept => {
            out.clear();
            backend_msg::auth_request(
                &mut out,
                backend_msg::AUTH_SASL_FINAL,
                server_final.as_bytes(),
            );
            send(stream, &out).await?;
            Ok(server.client_key())
        }
        Ok(_) | Err(scram::ScramError::InvalidProof) => Ok(None),
        Err(e) => Err(fatal(stream, sqlstate::PROTOCOL_VIOLATION, &e.to_string()).await),
    }
}

/// A verifier no password matches, stable per user name, so an unknown user
/// sees the same salt every time, as a known one does.
pub(super) fn mock_verifier(ctx: &ClusterContext, user: &str) -> scram::Verifier {
    scram::Verifier::unmatchable(&ctx.mock_secret, user)
}
