//! `client_auth = "hba"`: which of the login methods applies to this
//! connection, by the first line of the cluster's `auth_hba_file` that
//! matches (the rules and the matcher are `fulcrum_config::hba`, pure); a
//! `reject` line or no line is answered as PostgreSQL answers it (28000).
//! A `peer` line (a Unix-socket client) compares the connecting process's
//! operating-system user, from the kernel (`SO_PEERCRED`) and the system's
//! user list, with the requested user, as PostgreSQL's `peer` does.

use fulcrum_config::hba::{refusal, Conn, HbaMethod, Verdict};
use fulcrum_config::ClientAuth;
use fulcrum_tls::ClientStream;

use super::context::ClusterContext;
use super::error::SessionError;
use super::login::fatal;
use crate::codec::backend_msg::sqlstate;

/// How `stream` is connected, for the rules: a Unix-socket client is
/// local, with its process's uid when the kernel tells it; a stream with
/// no IP address otherwise is local, its peer unknown.
pub fn connection(stream: &ClientStream) -> Conn {
    if let ClientStream::Unix(s) = stream {
        return Conn::Local {
            peer_uid: s.peer_cred().ok().map(|c| c.uid()),
        };
    }
    match stream.peer_ip() {
        Some(addr) => Conn::Host {
            addr,
            tls: stream.is_tls(),
        },
        None => Conn::Local { peer_uid: None },
    }
}

/// The name of the system user `uid` in `passwd` (`/etc/passwd`'s format).
fn user_name_of(uid: u32, passwd: &str) -> Option<&str> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id = fields.nth(1)?.parse::<u32>().ok()?;
        (id == uid && !name.is_empty()).then_some(name)
    })
}

/// `peer`: the connecting process's system user is the requested user.
fn peer_matches(conn: &Conn, user: &str) -> bool {
    let Conn::Local {
        peer_uid: Some(uid),
    } = conn
    else {
        return false;
    };
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .is_some_and(|passwd| user_name_of(*uid, &passwd) == Some(user))
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
        HbaMethod::Peer if peer_matches(&conn, user) => ClientAuth::Trust,
        HbaMethod::Peer => {
            tracing::info!(user, ?conn, "peer authentication failed");
            let message = format!("Peer authentication failed for user \"{user}\"");
            return Err(fatal(stream, sqlstate::INVALID_AUTHORIZATION, &message).await);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uid_is_named_by_the_user_list() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\n# a comment\npostgres:x:104:110::/var/lib/postgresql:/bin/bash\nbroken\n";
        assert_eq!(user_name_of(0, passwd), Some("root"));
        assert_eq!(user_name_of(104, passwd), Some("postgres"));
        assert_eq!(user_name_of(7, passwd), None);
        assert!(!peer_matches(&Conn::Local { peer_uid: None }, "root"));
        let tcp = Conn::Host {
            addr: "127.0.0.1".parse().unwrap(),
            tls: false,
        };
        assert!(!peer_matches(&tcp, "root"));
    }
}
