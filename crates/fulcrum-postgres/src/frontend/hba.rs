//! `client_auth = "hba"`: which of the login methods applies to this
//! connection, by the first line of the cluster's `auth_hba_file` that
//! matches (the rules and the matcher are `fulcrum_config::hba`, pure); a
//! `reject` line or no line is answered as PostgreSQL answers it (28000).

use fulcrum_config::hba::{refusal, Conn, HbaMethod, Verdict};
use fulcrum_config::ClientAuth;
use fulcrum_tls::ClientStream;

use super::context::ClusterContext;
use super::error::SessionError;
use super::login::fatal;
use crate::codec::backend_msg::sqlstate;

/// How `stream` is connected, for the rules. A stream with no IP address
/// (not TCP) is taken as local, its peer unknown.
pub fn connection(stream: &ClientStream) -> Conn {
    match stream.peer_ip() {
        Some(addr) => Conn::Host {
            addr,
            tls: stream.is_tls(),
        },
        None => Conn::Local { peer_uid: None },
    }
}

/// The method this login goes through: `client_auth` itself, or with
/// `"hba"` the method of the first line that applies to the connection,
/// `user` and `database` (the name the client asked for). Refused logins
/// are answered here.
pub async fn method(
    ctx: &ClusterContext,
    stream: &mut ClientStream,
    user: &str,
    database: &str,
) -> Result<ClientAuth, SessionError> {
    let Some(hba) = ctx.config.hba.as_ref() else {
        return Ok(ctx.config.client_auth);
    };
    let conn = connection(stream);
    let verdict = hba.decide(&conn, database, user);
    let (method, line) = match verdict {
        Verdict::Use { method, line } => (method, line),
        Verdict::Rejected { .. } | Verdict::NoEntry => {
            let message = refusal(verdict, &conn, database, user).unwrap_or_default();
            tracing::info!(user, database, ?verdict, file = %hba.path.display(), "client refused by the hba rules");
            return Err(fatal(stream, sqlstate::INVALID_AUTHORIZATION, &message).await);
        }
    };
    tracing::debug!(
        user,
        database,
        line,
        method = method.name(),
        "hba line applies"
    );
    Ok(match method {
        HbaMethod::Trust => ClientAuth::Trust,
        HbaMethod::Md5 => ClientAuth::Md5,
        HbaMethod::ScramSha256 => ClientAuth::ScramSha256,
        HbaMethod::Password => ClientAuth::Password,
        HbaMethod::Cert => ClientAuth::Cert,
        HbaMethod::Reject => unreachable!("a reject line is Verdict::Rejected"),
        HbaMethod::Peer => {
            // `peer` lines are `local` only, and this listener is TCP: the
            // peer's uid comes with the Unix-socket listener.
            let message = format!("peer authentication failed for user \"{user}\"");
            return Err(fatal(stream, sqlstate::INVALID_AUTHORIZATION, &message).await);
        }
    })
}
