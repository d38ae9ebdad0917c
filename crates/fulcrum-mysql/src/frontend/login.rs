//! A client's login: Fulcrum's Initial Handshake (mysql_native_password
//! offered, a fresh scramble), the client's HandshakeResponse41, and the
//! password check against `[[cluster.user]]`: mysql_native_password, or
//! caching_sha2_password's fast path (Fulcrum knows the password, so it can
//! check the scramble and answer "fast auth success"); any other plugin is
//! switched to mysql_native_password. Over TLS (or the Unix socket, which
//! MySQL counts as secure too) a caching_sha2 client whose fast path does
//! not verify is asked for full authentication (the password in clear,
//! inside TLS), as MySQL asks. Unknown users and wrong passwords get
//! the same ERR 1045.

use std::sync::Arc;

use bytes::BytesMut;
use fulcrum_net::Connection;
use fulcrum_tls::ClientStream;
use mysql_common::constants::{CapabilityFlags as C, StatusFlags};

use super::context::MyClusterContext;
use super::error::SessionError;
use super::wire::{read_client_message, send_error};
use crate::auth::{caching_sha2, native};
use crate::codec::auth_packets::build_auth_switch_scramble;
use crate::codec::capabilities::{missing_required, negotiate, offered};
use crate::codec::err::codes;
use crate::codec::handshake::{
    build_initial_handshake, make_scramble, parse_client_hello, ClientHello, InitialHandshake,
};
use crate::codec::packet::{write_packet, HEADER_LEN};
use fulcrum_config::ClientAuth;

/// The version clients see. The `5.5.5-` prefix is what MariaDB itself
/// sends so that old MySQL clients parse the version; drivers look for
/// "MariaDB" in it to enable MariaDB features.
pub const SERVER_VERSION: &str = "5.5.5-10.11.0-MariaDB-fulcrum";
/// utf8mb4_general_ci.
pub const DEFAULT_CHARSET: u8 = 45;

/// A logged-in client.
pub struct Login {
    pub user: Arc<str>,
    pub schema: Option<String>,
    /// Flags in force with this client.
    pub caps: C,
    pub charset: u8,
    pub connection_id: u32,
    /// Sequence id for the packet that completes the login (OK or ERR).
    pub next_seq: u8,
    /// The handshake's scramble (COM_CHANGE_USER answers against it).
    pub scramble: [u8; 20],
}

/// A user not in the config, with `auth_query`: the client's
/// mysql_native_password reply (other plugins are switched to it) is checked
/// against the stored hash, and the SHA1(password) it reveals is kept for the
/// pools' server logins. Unknown users and wrong passwords get the same 1045.
/// Returns the sequence id for the OK.
async fn auth_query_login(
    ctx: &MyClusterContext,
    conn: &mut Connection<ClientStream>,
    hello: &crate::codec::handshake::HandshakeResponse,
    scramble: &[u8; 20],
    mut seq: u8,
    max: usize,
) -> Result<u8, SessionError> {
    let user = hello.username.as_str();
    let peer = conn.stream().peer_ip();
    let looked = match super::auth_query::lookup(ctx, user, peer).await {
        Ok(l) => l,
        Err(e) => {
            // The cause (which may name a server) goes to the log only.
            tracing::warn!(user, error = %e, "auth_query failed");
            let m = "fulcrum: cannot check the password now";
            send_error(conn.stream_mut(), seq, codes::ACCESS_DENIED, m).await;
            return Err(SessionError::Refused(format!("{m}: {e}")));
        }
    };
    if looked.outcome == fulcrum_cluster::AuthOutcome::Limited {
        tracing::warn!(
            user,
            ?peer,
            "auth_query not run: this address found no user too often (auth_failed_lookups_per_minute)"
        );
    }
    let plugin = hello.auth_plugin.as_deref().unwrap_or(native::PLUGIN);
    if plugin == caching_sha2::PLUGIN && conn.stream().is_secure() {
        return caching_sha2_login(ctx, conn, hello, scramble, seq, max, looked).await;
    }
    let response = if plugin == native::PLUGIN {
        hello.auth_response.clone()
    } else {
        // The stored hash checks mysql_native_password replies only.
        let mut out = BytesMut::new();
        write_packet(
            &mut out,
            seq,
            &build_auth_switch_scramble(native::PLUGIN, scramble),
        );
        conn.send(&out).await?;
        let span = read_client_message(conn, max).await?;
        let msg = conn.take(span.total);
        seq = span.last_seq.wrapping_add(1);
        msg[HEADER_LEN..].to_vec()
    };
    let stage1 = looked
        .secret
        .and_then(|stored| native::recover_stage1(&stored, scramble, &response));
    match stage1 {
        Some(stage1) => {
            ctx.auth.remember_proof(user, stage1);
            Ok(seq)
        }
        None => {
            if looked.cached {
                // The password may have changed: fetch again next time.
                ctx.auth.forget(user);
            }
            let m = access_denied(conn.stream(), user, !response.is_empty());
            send_error(conn.stream_mut(), seq, codes::ACCESS_DENIED, &m).await;
            Err(SessionError::Refused(m))
        }
    }
}

/// An `auth_query` user's caching_sha2_password login over TLS, as MySQL
/// runs it: the fast path against the cache a full authentication filled,
/// else full authentication (the password, inside TLS), checked against the
/// stored native hash; it fills the cache and gives SHA1(password) for the
/// server logins.
async fn caching_sha2_login(
    ctx: &MyClusterContext,
    conn: &mut Connection<ClientStream>,
    hello: &crate::codec::handshake::HandshakeResponse,
    scramble: &[u8; 20],
    mut seq: u8,
    max: usize,
    looked: fulcrum_cluster::Looked<[u8; 20]>,
) -> Result<u8, SessionError> {
    let user = hello.username.as_str();
    let cached = looked
        .secret
        .and_then(|stored| ctx.sha2_cache(user, &stored));
    let fast =
        cached.is_some_and(|c| caching_sha2::verify_cached(&c, scramble, &hello.auth_response));
    let proven = if fast {
        let mut out = BytesMut::new();
        seq = write_packet(&mut out, seq, &caching_sha2::fast_auth_success());
        conn.send(&out).await?;
        ctx.auth.proof(user)
    } else {
        let mut out = BytesMut::new();
        write_packet(&mut out, seq, &caching_sha2::perform_full_authentication());
        conn.send(&out).await?;
        let span = read_client_message(conn, max).await?;
        let mut msg = conn.take(span.total);
        seq = span.last_seq.wrapping_add(1);
        let sent = &msg[HEADER_LEN..];
        let password = sent.strip_suffix(&[0]).unwrap_or(sent);
        let stage1 = native::stage1(password);
        let holds = looked
            .secret
            .is_some_and(|stored| crate::auth::constant_time_eq(&native::stage2(&stage1), &stored));
        let proven = holds.then(|| {
            ctx.set_sha2_cache(
                user,
                native::stage2(&stage1),
                caching_sha2::cached_hash(password),
            );
            stage1
        });
        // The password itself (inside TLS): cleared once checked.
        zeroize::Zeroize::zeroize(&mut msg[..]);
        proven
    };
    match proven {
        Some(stage1) => {
            ctx.auth.remember_proof(user, stage1);
            Ok(seq)
        }
        None => {
            if looked.cached {
                ctx.auth.forget(user);
            }
            let m = access_denied(conn.stream(), user, true);
            send_error(conn.stream_mut(), seq, codes::ACCESS_DENIED, &m).await;
            Err(SessionError::Refused(m))
        }
    }
}

/// The server's 1045 text, the same for every failed login (listed user,
/// `auth_query` user, unknown user; any plugin), so it tells nothing but
/// "refused".
fn access_denied(stream: &ClientStream, user: &str, used_password: bool) -> String {
    // A Unix-socket client is `localhost` to MySQL.
    let host = match stream.peer_ip() {
        Some(ip) => ip.to_string(),
        None if stream.is_unix() => "localhost".to_owned(),
        None => String::new(),
    };
    let used = if used_password { "YES" } else { "NO" };
    format!("Access denied for user '{user}'@'{host}' (using password: {used})")
}

/// Whether `response` proves `password` for `plugin` against `scramble`.
pub fn password_ok(plugin: &str, password: &str, scramble: &[u8; 20], response: &[u8]) -> bool {
    if plugin == caching_sha2::PLUGIN {
        caching_sha2::verify(password.as_bytes(), scramble, response)
    } else {
        native::verify(password.as_bytes(), scramble, response)
            || (password.is_empty() && response.is_empty())
    }
}

/// The login, then the schema it names resolved through
/// `[[cluster.database]]` (an alias becomes the server's name; one not
/// listed gets ERR 1049, as the server would answer).
pub async fn login(
    clusters: &[Arc<MyClusterContext>],
    conn: &mut Connection<ClientStream>,
    ticket: &fulcrum_net::PendingTicket,
) -> Result<(Arc<MyClusterContext>, Login), SessionError> {
    let (chosen, mut login) = authenticate_client(clusters, conn, ticket).await?;
    let ctx: &MyClusterContext = &chosen;
    if let Some(schema) = login
        .schema
        .as_ref()
        .filter(|s| fulcrum_cluster::clients::registry().is_database_disabled(s))
    {
        let m = format!(
            "Access denied to database '{schema}': not accepting connections (DISABLE in Fulcrum's console)"
        );
        send_error(
            conn.stream_mut(),
            login.next_seq,
            codes::DBACCESS_DENIED,
            &m,
        )
        .await;
        return Err(SessionError::Refused(m));
    }
    if let Some(schema) = &login.schema {
        match ctx.config.server_database(schema) {
            Some(server) => login.schema = Some(server.to_owned()),
            None => {
                let m = format!("Unknown database '{schema}'");
                send_error(conn.stream_mut(), login.next_seq, codes::BAD_DB, &m).await;
                return Err(SessionError::Refused(m));
            }
        }
    }
    Ok((chosen, login))
}

/// The greeting as the first of `clusters` says (clusters sharing a port
/// have the same client_auth and TLS), then the authentication of the
/// cluster serving the schema the client named (none: the cluster that
/// lists no databases, else the first).
async fn authenticate_client(
    clusters: &[Arc<MyClusterContext>],
    conn: &mut Connection<ClientStream>,
    ticket: &fulcrum_net::PendingTicket,
) -> Result<(Arc<MyClusterContext>, Login), SessionError> {
    let ctx: &MyClusterContext = &clusters[0];
    let connection_id = ctx.connection_id();
    let scramble = make_scramble(rand::random());
    // No TLS over the Unix socket (PgBouncer's rule): the greeting offers
    // none there, and `tls_mode = "require"` is for TCP clients.
    let tls = ctx.config.tls.as_ref().filter(|_| !conn.stream().is_unix());
    let mut ours = offered(tls.is_some());
    if !ctx.config.allow_local_infile {
        ours -= C::CLIENT_LOCAL_FILES;
    }
    let hs = build_initial_handshake(&InitialHandshake {
        server_version: SERVER_VERSION,
        connection_id,
        scramble,
        capabilities: ours,
        charset: DEFAULT_CHARSET,
        status: StatusFlags::SERVER_STATUS_AUTOCOMMIT,
        auth_plugin: match ctx.config.client_auth {
            ClientAuth::CachingSha2Password => caching_sha2::PLUGIN,
            _ => native::PLUGIN,
        },
    });
    let mut out = BytesMut::with_capacity(128);
    write_packet(&mut out, 0, &hs);
    conn.send(&out).await?;

    let max = 1 << 20;
    let span = read_client_message(conn, max).await?;
    ticket.mark_started();
    let mut msg = conn.take(span.total);
    let mut seq = span.last_seq.wrapping_add(1);
    let refuse = |reason: String| SessionError::Refused(reason);
    if let (Ok(ClientHello::SslRequest { .. }), Some(tls)) =
        (parse_client_hello(&msg[HEADER_LEN..]), tls)
    {
        // The client does not wait for an answer: what was read behind the
        // SSL request is the start of its TLS ClientHello, handed to the
        // handshake (anything else fails it).
        let early = conn.take(conn.read_buf.len()).to_vec();
        let acceptor = fulcrum_tls::TlsAcceptor::from(tls.server_config.clone());
        if let Err(e) = conn.stream_mut().upgrade_with(&acceptor, early).await {
            return Err(refuse(format!("TLS handshake failed: {e}")));
        }
        // The full HandshakeResponse follows, over TLS.
        let span = read_client_message(conn, max).await?;
        msg = conn.take(span.total);
        seq = span.last_seq.wrapping_add(1);
    }
    let require = tls.is_some_and(|t| t.mode == fulcrum_config::TlsMode::Require);
    if require && !conn.stream().is_tls() {
        let m = "fulcrum: this listener requires TLS (tls_mode = \"require\"): connect with --ssl";
        send_error(conn.stream_mut(), seq, codes::INSECURE_TRANSPORT, m).await;
        return Err(refuse(m.into()));
    }
    let hello = match parse_client_hello(&msg[HEADER_LEN..]) {
        Ok(ClientHello::Response(r)) => r,
        Ok(ClientHello::SslRequest { .. }) => {
            let m = if conn.stream().is_unix() {
                "fulcrum: TLS is not offered over the Unix socket"
            } else {
                "fulcrum: TLS is not enabled on this listener (tls_mode)"
            };
            send_error(conn.stream_mut(), seq, codes::HANDSHAKE, m).await;
            return Err(refuse(m.into()));
        }
        Err(e) => {
            let m = format!("fulcrum: bad handshake: {e}");
            send_error(conn.stream_mut(), seq, codes::HANDSHAKE, &m).await;
            return Err(refuse(m));
        }
    };
    let missing = missing_required(hello.capabilities);
    if !missing.is_empty() {
        let m = format!("fulcrum: client lacks required capabilities {missing:?}");
        send_error(conn.stream_mut(), seq, codes::NOT_SUPPORTED_AUTH_MODE, &m).await;
        return Err(refuse(m));
    }
    let caps = negotiate(hello.capabilities, ours);
    let chosen = fulcrum_config::cluster_for_database(
        clusters,
        |c| &c.config,
        hello.database.as_deref().unwrap_or(""),
    )
    .expect("a listener has a cluster")
    .clone();
    let ctx: &MyClusterContext = &chosen;
    let password = ctx.passwords.get(&hello.username);
    let auth_query = ctx.config.auth_query.is_some() && ctx.config.client_auth != ClientAuth::Trust;
    if password.is_none() && auth_query {
        seq = auth_query_login(ctx, conn, &hello, &scramble, seq, max).await?;
        return Ok((
            chosen.clone(),
            Login {
                user: hello.username.as_str().into(),
                schema: hello.database.filter(|d| !d.is_empty()),
                caps,
                charset: hello.charset,
                connection_id,
                next_seq: seq,
                scramble,
            },
        ));
    }
    let trust = ctx.config.client_auth == ClientAuth::Trust && password.is_some();
    // Unknown users are checked against a password nobody has: same answer.
    let expected = password.map_or("\u{1}fulcrum-no-such-user", |p| p.as_str());
    let plugin = hello.auth_plugin.as_deref().unwrap_or(native::PLUGIN);
    let ok = if trust {
        true
    } else if plugin == native::PLUGIN {
        native::verify(expected.as_bytes(), &scramble, &hello.auth_response)
            || (expected.is_empty() && hello.auth_response.is_empty())
    } else if plugin == caching_sha2::PLUGIN {
        // Fast-auth success only for a known user: an unknown one must get
        // exactly what a wrong password gets.
        let fast = password.is_some()
            && caching_sha2::verify(expected.as_bytes(), &scramble, &hello.auth_response);
        if fast {
            let mut out = BytesMut::new();
            seq = write_packet(&mut out, seq, &caching_sha2::fast_auth_success());
            conn.send(&out).await?;
            true
        } else if conn.stream().is_secure() {
            // As MySQL does when the fast path fails: full authentication,
            // the password itself, which only travels over TLS or a Unix
            // socket.
            let mut out = BytesMut::new();
            write_packet(&mut out, seq, &caching_sha2::perform_full_authentication());
            conn.send(&out).await?;
            let span = read_client_message(conn, max).await?;
            let mut msg = conn.take(span.total);
            seq = span.last_seq.wrapping_add(1);
            let ok = caching_sha2::verify_cleartext(expected.as_bytes(), &msg[HEADER_LEN..]);
            // The password itself (inside TLS): cleared once checked.
            zeroize::Zeroize::zeroize(&mut msg[..]);
            ok
        } else {
            false
        }
    } else {
        // Another plugin (e.g. client_ed25519): ask for mysql_native_password.
        let mut out = BytesMut::new();
        write_packet(
            &mut out,
            seq,
            &build_auth_switch_scramble(native::PLUGIN, &scramble),
        );
        conn.send(&out).await?;
        let span = read_client_message(conn, max).await?;
        let msg = conn.take(span.total);
        seq = span.last_seq.wrapping_add(1);
        native::verify(expected.as_bytes(), &scramble, &msg[HEADER_LEN..])
    };
    if !ok || password.is_none() {
        let m = access_denied(
            conn.stream(),
            &hello.username,
            !hello.auth_response.is_empty(),
        );
        send_error(conn.stream_mut(), seq, codes::ACCESS_DENIED, &m).await;
        return Err(refuse(m));
    }
    let login = Login {
        user: hello.username.as_str().into(),
        schema: hello.database.filter(|d| !d.is_empty()),
        caps,
        charset: hello.charset,
        connection_id,
        next_seq: seq,
        scramble,
    };
    Ok((chosen.clone(), login))
}
