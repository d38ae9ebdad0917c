//! The client side of SCRAM-SHA-256 from keys instead of a password
//! (PgBouncer's method for `auth_query` users and auth-file SCRAM secrets):
//! a client authenticated by Fulcrum with a verifier (from the server, or
//! the config's password) proved its ClientKey (recovered
//! by `ScramServer::client_key`); with it and the verifier's ServerKey,
//! Fulcrum answers the server's own SCRAM exchange and checks the server's
//! signature, never knowing the password. Pure: nonces come in.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use sha2::{Digest, Sha256};

use super::scram::hmac;

/// What logs in without the password.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramKeys {
    pub client_key: [u8; 32],
    pub server_key: [u8; 32],
    /// The verifier's salt and iterations: a server that sends others holds
    /// another verifier (the password changed).
    pub salt: Vec<u8>,
    pub iterations: u32,
}

impl std::fmt::Debug for ScramKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScramKeys(<redacted>)")
    }
}

/// The channel binding the client offers: `n` (none), `y` (could, not
/// offered), or `tls-server-end-point` data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    None,
    Unrequested,
    EndPoint(Vec<u8>),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeysError {
    #[error("malformed SCRAM message from the server: {0}")]
    Malformed(&'static str),
    #[error("the server's SCRAM salt or iteration count differs from the verifier Fulcrum holds for this user (auth_query's, or the config's password): the password changed, or the config holds another verifier than the server's")]
    OtherVerifier,
    #[error("the server's SCRAM signature does not match")]
    BadSignature,
}

/// One exchange.
pub struct KeysClient {
    keys: ScramKeys,
    gs2: String,
    cbind_data: Vec<u8>,
    client_first_bare: String,
    expected_signature: Option<[u8; 32]>,
}

impl KeysClient {
    pub fn new(keys: ScramKeys, nonce: &str, binding: Binding) -> KeysClient {
        let (gs2, cbind_data) = match binding {
            Binding::None => ("n,,".to_owned(), Vec::new()),
            Binding::Unrequested => ("y,,".to_owned(), Vec::new()),
            Binding::EndPoint(hash) => ("p=tls-server-end-point,,".to_owned(), hash),
        };
        KeysClient {
            keys,
            gs2,
            cbind_data,
            client_first_bare: format!("n=,r={nonce}"),
            expected_signature: None,
        }
    }

    /// client-first-message.
    pub fn client_first(&self) -> String {
        format!("{}{}", self.gs2, self.client_first_bare)
    }

    /// client-final-message for the server's `server_first`.
    pub fn client_final(&mut self, server_first: &[u8]) -> Result<String, KeysError> {
        let text =
            std::str::from_utf8(server_first).map_err(|_| KeysError::Malformed("not UTF-8"))?;
        let attr = |name: &str| {
            text.split(',')
                .find_map(|a| a.strip_prefix(name))
                .ok_or(KeysError::Malformed("missing attribute"))
        };
        let nonce = attr("r=")?;
        let our_nonce = &self.client_first_bare["n=,r=".len()..];
        if !nonce.starts_with(our_nonce) || nonce.len() == our_nonce.len() {
            return Err(KeysError::Malformed("nonce"));
        }
        let salt = B64
            .decode(attr("s=")?)
            .map_err(|_| KeysError::Malformed("salt"))?;
        let iterations: u32 = attr("i=")?
            .parse()
            .map_err(|_| KeysError::Malformed("iterations"))?;
        if salt != self.keys.salt || iterations != self.keys.iterations {
            return Err(KeysError::OtherVerifier);
        }
        let mut cbind = self.gs2.as_bytes().to_vec();
        cbind.extend_from_slice(&self.cbind_data);
        let without_proof = format!("c={},r={nonce}", B64.encode(cbind));
        let auth_message = format!("{},{text},{without_proof}", self.client_first_bare);
        let stored_key: [u8; 32] = Sha256::digest(self.keys.client_key).into();
        let signature = hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = self
            .keys
            .client_key
            .iter()
            .zip(signature)
            .map(|(k, s)| k ^ s)
            .collect();
        self.expected_signature = Some(hmac(&self.keys.server_key, auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", B64.encode(proof)))
    }

    /// Checks server-final-message (`v=...`).
    pub fn verify_final(&self, server_final: &[u8]) -> Result<(), KeysError> {
        let text =
            std::str::from_utf8(server_final).map_err(|_| KeysError::Malformed("not UTF-8"))?;
        let v = text
            .strip_prefix("v=")
            .ok_or(KeysError::Malformed("server final"))?;
        let got = B64
            .decode(v)
            .map_err(|_| KeysError::Malformed("signature"))?;
        match self.expected_signature {
            Some(want) if super::scram::constant_time_eq(&got, &want) => Ok(()),
            _ => Err(KeysError::BadSignature),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::scram::{ScramServer, Verifier, ITERATIONS};

    /// The keys a client of `verifier` proves, as Fulcrum recovers them.
    fn recovered(password: &str, verifier: &Verifier) -> ScramKeys {
        let salted =
            crate::auth::scram::hi(password.as_bytes(), &verifier.salt, verifier.iterations);
        ScramKeys {
            client_key: hmac(&salted, b"Client Key"),
            server_key: verifier.server_key,
            salt: verifier.salt.clone(),
            iterations: verifier.iterations,
        }
    }

    fn exchange(
        keys: ScramKeys,
        server_verifier: Verifier,
        binding: Binding,
    ) -> Result<(), String> {
        let offered = match &binding {
            Binding::EndPoint(h) => Some(h.clone()),
            _ => None,
        };
        let plus = offered.is_some();
        let mut server = ScramServer::new(server_verifier, "srvnonce".into())
            .with_channel_binding(offered, plus);
        let mut client = KeysClient::new(keys, "clinonce", binding);
        let first = server
            .server_first(client.client_first().as_bytes())
            .map_err(|e| e.to_string())?;
        let fin = client
            .client_final(first.as_bytes())
            .map_err(|e| e.to_string())?;
        let v = server
            .server_final(fin.as_bytes())
            .map_err(|e| e.to_string())?;
        client.verify_final(v.as_bytes()).map_err(|e| e.to_string())
    }

    #[test]
    fn keys_log_in_where_the_password_would() {
        let v = Verifier::new("pencil", b"salt-salt-salt!!", ITERATIONS);
        exchange(recovered("pencil", &v), v.clone(), Binding::None).unwrap();
        exchange(
            recovered("pencil", &v),
            v.clone(),
            Binding::EndPoint(vec![5; 32]),
        )
        .unwrap();
        // The ClientKey a server recovers from a real client's proof is the same.
        let mut server = ScramServer::new(v.clone(), "x".into());
        let mut client = KeysClient::new(recovered("pencil", &v), "n1", Binding::None);
        let first = server
            .server_first(client.client_first().as_bytes())
            .unwrap();
        let fin = client.client_final(first.as_bytes()).unwrap();
        server.server_final(fin.as_bytes()).unwrap();
        assert_eq!(
            server.client_key(),
            Some(recovered("pencil", &v).client_key)
        );
    }

    #[test]
    fn another_verifier_or_a_forged_server_is_refused() {
        let v = Verifier::new("pencil", b"salt-salt-salt!!", ITERATIONS);
        // The password changed on the server: new salt.
        let changed = Verifier::new("pencil2", b"other-salt-here!", ITERATIONS);
        let e = exchange(recovered("pencil", &v), changed, Binding::None).unwrap_err();
        assert!(e.contains("differs"), "{e}");
        // A server that does not hold the ServerKey cannot sign.
        let mut client = KeysClient::new(recovered("pencil", &v), "n", Binding::None);
        let first = format!("r=nserver,s={},i={}", B64.encode(&v.salt), v.iterations);
        client.client_final(first.as_bytes()).unwrap();
        assert_eq!(
            client.verify_final(format!("v={}", B64.encode([0u8; 32])).as_bytes()),
            Err(KeysError::BadSignature)
        );
        // A server nonce that does not extend ours.
        let mut client = KeysClient::new(recovered("pencil", &v), "n", Binding::None);
        assert!(client.client_final(b"r=zzz,s=AAAA,i=4096").is_err());
    }
}
