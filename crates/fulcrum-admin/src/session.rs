//! One admin connection: startup (TLS when `[fulcrum]` has a certificate,
//! required with its `tls_mode = "require"`; GSS refused with 'N'), a
//! SCRAM-SHA-256 or md5 login (`admin_auth`) against
//! `[[fulcrum.admin_user]]`, then simple queries, each one command, until
//! Terminate (a `stats_users` login may run SHOW commands only). Any error
//! is an ErrorResponse and the session goes on; only a bad startup or login
//! ends it.

use bytes::BytesMut;
use fulcrum_net::Connection;
use fulcrum_postgres::auth::scram::{stable_salt, Verifier, ITERATIONS};
use fulcrum_postgres::codec::backend_msg::{self, sqlstate};
use fulcrum_postgres::codec::frame::PgFrames;
use fulcrum_postgres::codec::frontend_msg::query_text;
use fulcrum_postgres::codec::startup::{parse_startup, StartupPacket};
use fulcrum_postgres::frontend::error::SessionError;
use fulcrum_postgres::frontend::login::{password_exchange, start_tls};
use fulcrum_tls::ClientStream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::command::parse;
use crate::Admin;

const MAX_MESSAGE: u64 = 1 << 20;

/// A console login must finish within this time (as the data listeners').
pub const LOGIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// Who logged in to the console.
struct Operator {
    name: String,
    /// A `stats_users` login: SHOW only.
    stats_only: bool,
}

/// The startup and password exchange, answered up to ReadyForQuery:
/// the admin user, or `None` when the login ended (refused, a cancel
/// request, the client gone).
async fn login(
    stream: &mut ClientStream,
    buf: &mut BytesMut,
    admin: &Admin,
) -> std::io::Result<Option<Operator>> {
    let tls = admin.console_tls();
    let user = loop {
        match parse_startup(buf) {
            Ok(Some((StartupPacket::Ssl, used))) => {
                let _ = buf.split_to(used);
                match &tls {
                    Some(tls) if !stream.is_tls() && buf.is_empty() => {
                        stream.write_all(b"S").await?;
                        if let Err(e) = start_tls(stream, tls).await {
                            tracing::info!(error = %e, "admin console TLS handshake failed");
                            return Ok(None);
                        }
                    }
                    _ => stream.write_all(b"N").await?,
                }
            }
            Ok(Some((StartupPacket::GssEnc, used))) => {
                let _ = buf.split_to(used);
                stream.write_all(b"N").await?;
            }
            Ok(Some((StartupPacket::Cancel { .. }, _))) => return Ok(None),
            Ok(Some((StartupPacket::Startup { params, .. }, used))) => {
                let _ = buf.split_to(used);
                let required = tls
                    .as_ref()
                    .is_some_and(|t| t.mode == fulcrum_config::TlsMode::Require);
                if required && !stream.is_tls() {
                    return fatal_end(
                        stream,
                        sqlstate::INVALID_AUTHORIZATION,
                        "fulcrum admin: the console requires TLS (tls_mode = \"require\")",
                    )
                    .await;
                }
                break params
                    .into_iter()
                    .find(|(k, _)| k == "user")
                    .map(|(_, v)| v)
                    .unwrap_or_default();
            }
            Ok(None) => {
                if stream.read_buf(buf).await? == 0 {
                    return Ok(None);
                }
            }
            Err(e) => {
                return fatal_end(
                    stream,
                    sqlstate::PROTOCOL_VIOLATION,
                    &format!("fulcrum admin: {e}"),
                )
                .await;
            }
        }
    };
    // The password, by `[fulcrum] admin_auth` (SCRAM-SHA-256 or md5); an
    // unknown user goes through the same exchange and fails at its end.
    // Only this user's entry is copied out of the config, not the whole
    // config with every password in it.
    let (known, admin_auth, stats_only) = admin.login_user(&user);
    let known = known.as_ref();
    let secret = process_secret();
    let salt = stable_salt(secret, &user);
    // A known user's verifier is derived once and kept (verifiers.rs); an
    // unknown name gets one no password matches, with the same salt and
    // iterations, derived from nothing: no startup costs a PBKDF2, known
    // name or not, and the time to the answer tells nothing.
    let verifier = known.map(|u| {
        verifier_cache().get(&user, &u.password, &salt, ITERATIONS, || {
            Verifier::new(&u.password, &salt, ITERATIONS)
        })
    });
    let ok = match password_exchange(
        stream,
        buf,
        admin_auth,
        &user,
        known
            .zip(verifier.as_ref())
            .map(|(u, v)| (u.password.as_str(), v)),
        None,
        || Verifier::unmatchable(secret, &user),
    )
    .await
    {
        Ok(ok) => ok,
        // The client broke the exchange (it was told) or went away.
        Err(SessionError::Io(e)) => return Err(e),
        Err(_) => return Ok(None),
    };
    if !ok {
        tracing::info!(admin = ?user, "admin console login refused");
        let msg = format!("password authentication failed for admin user \"{user}\"");
        return fatal_end(stream, sqlstate::INVALID_PASSWORD, &msg).await;
    }
    let mut out = BytesMut::new();
    backend_msg::auth_request(&mut out, backend_msg::AUTH_OK, &[]);
    for (k, v) in [
        ("server_version", "15.0 (fulcrum admin)"),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("DateStyle", "ISO, MDY"),
        ("integer_datetimes", "on"),
        ("standard_conforming_strings", "on"),
    ] {
        backend_msg::parameter_status(&mut out, k, v);
    }
    backend_msg::backend_key_data(&mut out, 0, 0);
    backend_msg::ready_for_query(&mut out, b'I');
    stream.write_all(&out).await?;
    tracing::info!(admin = ?user, stats_only, tls = stream.is_tls(), "admin console login");
    Ok(Some(Operator {
        name: user,
        stats_only,
    }))
}

/// Serves one console connection; `logged_in` is called once its login
/// succeeded (until then the listener may close it for a newer one).
pub async fn run(
    stream: TcpStream,
    admin: &Admin,
    logged_in: impl FnOnce(),
) -> std::io::Result<()> {
    let mut stream = ClientStream::from(stream);
    let mut buf = BytesMut::with_capacity(4096);
    let user = match tokio::time::timeout(LOGIN_TIMEOUT, login(&mut stream, &mut buf, admin)).await
    {
        Ok(Ok(Some(user))) => {
            logged_in();
            user
        }
        Ok(Ok(None)) => return Ok(()),
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            let msg = format!("fulcrum admin: login not finished within {LOGIN_TIMEOUT:?}");
            return fatal(&mut stream, sqlstate::PROTOCOL_VIOLATION, &msg).await;
        }
    };

    let mut conn = Connection::with_read_buf(stream, buf);
    loop {
        let Some((tag, body)) = read_frame(&mut conn).await? else {
            return Ok(());
        };
        let out = &mut conn.write_buf;
        match tag {
            b'X' => return Ok(()),
            b'Q' => {
                let text = query_text(&body)
                    .and_then(|t| std::str::from_utf8(t).ok())
                    .unwrap_or("");
                if text.trim().is_empty() {
                    out.extend_from_slice(&[b'I', 0, 0, 0, 4]); // EmptyQueryResponse
                } else {
                    match parse(text) {
                        Ok(cmd) if user.stats_only && !cmd.only_reads() => {
                            let msg = format!(
                                "fulcrum admin: permission denied: \"{}\" is a stats user (stats_users): SHOW commands only",
                                user.name
                            );
                            backend_msg::error_response(out, "ERROR", "42501", &msg);
                        }
                        Ok(cmd) => {
                            let user = &user.name;
                            tracing::info!(admin = ?user, command = ?text.trim(), "admin command");
                            if let Err((code, msg)) = admin.execute(cmd, out).await {
                                backend_msg::error_response(out, "ERROR", code, &msg);
                            }
                        }
                        Err(msg) => backend_msg::error_response(
                            out,
                            "ERROR",
                            "42601",
                            &format!("fulcrum admin: {msg}"),
                        ),
                    }
                }
            }
            other => {
                let msg = format!(
                    "fulcrum admin: only simple queries are supported (got message type {:?})",
                    other as char
                );
                backend_msg::error_response(out, "ERROR", sqlstate::FEATURE_NOT_SUPPORTED, &msg);
                if other != b'S' && other != b'H' {
                    // Extended protocol: skip to its Sync.
                    loop {
                        match read_frame(&mut conn).await? {
                            Some((b'S', _)) | None => break,
                            _ => {}
                        }
                    }
                }
            }
        }
        backend_msg::ready_for_query(&mut conn.write_buf, b'I');
        conn.flush().await?;
    }
}

/// Reads one frame: (tag, body). `None` when the client closed.
async fn read_frame(
    conn: &mut Connection<ClientStream>,
) -> std::io::Result<Option<(u8, BytesMut)>> {
    loop {
        match conn.complete_frame::<PgFrames>(MAX_MESSAGE) {
            Ok(Some(total)) => {
                let mut frame = conn.take(total);
                let body = frame.split_off(5);
                return Ok(Some((frame[0], body)));
            }
            Ok(None) => {
                if conn.read_more().await? == 0 {
                    return Ok(None);
                }
            }
            Err(e) => {
                let mut out = BytesMut::new();
                backend_msg::error_response(
                    &mut out,
                    "FATAL",
                    sqlstate::PROTOCOL_VIOLATION,
                    &format!("fulcrum admin: {e}"),
                );
                let _ = conn.send(&out).await;
                return Ok(None);
            }
        }
    }
}

/// `fatal`, for the login: the login ends with no user.
async fn fatal_end<T>(
    stream: &mut ClientStream,
    code: &str,
    msg: &str,
) -> std::io::Result<Option<T>> {
    fatal(stream, code, msg).await.map(|()| None)
}

async fn fatal(stream: &mut ClientStream, code: &str, msg: &str) -> std::io::Result<()> {
    let mut out = BytesMut::new();
    backend_msg::error_response(&mut out, "FATAL", code, msg);
    stream.write_all(&out).await
}

/// The console's derived verifiers, for the process's life.
fn verifier_cache() -> &'static crate::verifiers::Verifiers {
    static CACHE: std::sync::OnceLock<crate::verifiers::Verifiers> = std::sync::OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// A key drawn once per process, from which every console user's SCRAM
/// salt derives ([`stable_salt`]): the same for each login of this process,
/// whether or not the user exists, so the salt tells nothing.
fn process_secret() -> &'static [u8; 16] {
    static SECRET: std::sync::OnceLock<[u8; 16]> = std::sync::OnceLock::new();
    SECRET.get_or_init(rand::random)
}
