//! `[[cluster.user]]`s whose password is given as PostgreSQL stores it
//! (PgBouncer's auth file with SCRAM secrets or md5 hashes): the client is
//! checked against the verifier (SCRAM) or the hash (md5), and what it
//! proved logs in to the servers as that user, the way `auth_query` users
//! do. The ClientKey a SCRAM client proves is the same for every client of
//! one verifier, so the first one is kept for every later server login.

use bytes::BytesMut;
use fulcrum_config::ClientAuth;
use fulcrum_tls::ClientStream;

use super::context::{ClusterContext, UserAuth};
use super::error::SessionError;
use super::login::{
    auth_failed, fatal, mock_verifier, password_exchange, read_auth_message, scram_exchange, send,
};
use crate::auth::md5;
use crate::auth::scram_keys::ScramKeys;
use crate::auth::secret::StoredSecret;
use crate::backend::Credential;
use crate::codec::backend_msg::{self, sqlstate};
use crate::codec::frontend_msg::password_msg;

/// The password part of the login of `user` (`u`, whose config password
/// is a hash) by `method`. A method that cannot check it (the config
/// refuses those pairs, but a method chosen per connection could meet
/// one) runs the exchange an unknown user would and fails alike (28P01),
/// the log saying why.
pub(super) async fn login(
    ctx: &ClusterContext,
    stream: &mut ClientStream,
    buf: &mut BytesMut,
    user: &str,
    method: ClientAuth,
    u: &UserAuth,
    binding: Option<&[u8]>,
) -> Result<(), SessionError> {
    let ok = match (method, &u.stored) {
        // The config allows trust only where nothing needs proving.
        (ClientAuth::Trust, _) => true,
        (ClientAuth::ScramSha256, Some(StoredSecret::Scram(verifier))) => {
            match scram_exchange(stream, buf, verifier.clone(), true, binding).await? {
                Some(client_key) => {
                    // Every client of this verifier proves the same key.
                    let _ = u.proven.set(client_key);
                    true
                }
                None => false,
            }
        }
        (ClientAuth::Md5, Some(StoredSecret::Md5(hash))) => {
            let mut out = BytesMut::new();
            let salt: [u8; 4] = rand::random();
            backend_msg::auth_request(&mut out, backend_msg::AUTH_MD5, &salt);
            send(stream, &out).await?;
            let body = read_auth_message(stream, buf).await?;
            md5::verify_hash(hash, salt, password_msg(&body).unwrap_or_default())
        }
        (method, _) => {
            tracing::warn!(
                user,
                method = method.name(),
                "this user's password is given as a hash this method cannot check (a SCRAM verifier needs scram-sha-256, an md5 hash md5)"
            );
            let _ = password_exchange(stream, buf, method, user, None, binding, || {
                mock_verifier(ctx, user)
            })
            .await?;
            false
        }
    };
    if !ok {
        tracing::info!(user, "client authentication failed");
        return Err(fatal(stream, sqlstate::INVALID_PASSWORD, &auth_failed(user)).await);
    }
    Ok(())
}

/// What logs `user` in to the servers: its server password, or, when its
/// config password is a hash and its server login its own, the md5 hash
/// or the SCRAM keys a client of it proved. `Err`: a SCRAM verifier no
/// client has proved yet (since the config was loaded).
pub(super) fn server_credential(u: &UserAuth, user: &str) -> Result<Credential, String> {
    let password = || Credential::Password(u.server_password.clone());
    if !u.passes_through {
        return Ok(password());
    }
    match &u.stored {
        Some(StoredSecret::Md5(hash)) => Ok(Credential::Md5(hash.clone())),
        Some(StoredSecret::Scram(v)) => match u.proven.get() {
            Some(client_key) => Ok(Credential::Scram(ScramKeys {
                client_key: *client_key,
                server_key: v.server_key,
                salt: v.salt.clone(),
                iterations: v.iterations,
            })),
            None => Err(format!(
                "user {user:?} has only a SCRAM verifier in the config: Fulcrum logs in to the servers with the keys a client proves, and no client of {user:?} has logged in since the config was loaded"
            )),
        },
        Some(StoredSecret::Plain(_)) | None => Ok(password()),
    }
}
