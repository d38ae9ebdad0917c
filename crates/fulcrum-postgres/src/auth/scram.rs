//! Server side of SCRAM-SHA-256 without channel binding, as PostgreSQL runs it.
//! Pure: the nonce comes in from the caller, so RFC 7677's test vector is a unit test.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use thiserror::Error;

pub const MECHANISM: &str = "SCRAM-SHA-256";
pub const ITERATIONS: u32 = 4096;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ScramError {
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    #[error("channel binding is not supported")]
    ChannelBinding,
    #[error("password authentication failed")]
    InvalidProof,
}

/// What a server stores instead of the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Verifier {
    pub salt: Vec<u8>,
    pub iterations: u32,
    pub stored_key: [u8; 32],
    pub server_key: [u8; 32],
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Verifier(<redacted>)")
    }
}

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts any key length");
    m.update(data);
    m.finalize().into_bytes().into()
}

/// PBKDF2-HMAC-SHA-256 with one output block: RFC 5802's Hi().
fn hi(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let mut block = salt.to_vec();
    block.extend_from_slice(&1u32.to_be_bytes());
    let mut u = hmac(password, &block);
    let mut out = u;
    for _ in 1..iterations {
        u = hmac(password, &u);
        out.iter_mut().zip(u.iter()).for_each(|(o, x)| *o ^= x);
    }
    out
}

impl Verifier {
    /// Derives the verifier for `password` (SASLprep'd where possible, like libpq).
    pub fn new(password: &str, salt: &[u8], iterations: u32) -> Verifier {
        let prepared = stringprep::saslprep(password)
            .map(|p| p.into_owned())
            .unwrap_or_else(|_| password.to_owned());
        let salted = hi(prepared.as_bytes(), salt, iterations);
        let client_key = hmac(&salted, b"Client Key");
        Verifier {
            salt: salt.to_vec(),
            iterations,
            stored_key: Sha256::digest(client_key).into(),
            server_key: hmac(&salted, b"Server Key"),
        }
    }

    /// A verifier no password matches, for a login name that does not
    /// exist: its salt is [`stable_salt`], so repeated attempts see the same
    /// salt, as they would for a real user.
    pub fn unmatchable(secret: &[u8], user: &str) -> Verifier {
        Verifier {
            salt: stable_salt(secret, user).to_vec(),
            iterations: ITERATIONS,
            stored_key: rand::random(),
            server_key: rand::random(),
        }
    }
}

/// A salt for `user` that stays the same for one `secret` (a process's
/// random key) and tells nothing about whether the user exists.
pub fn stable_salt(secret: &[u8], user: &str) -> [u8; 16] {
    let digest = Sha256::new()
        .chain_update(secret)
        .chain_update(user.as_bytes())
        .finalize();
    let mut salt = [0u8; 16];
    salt.copy_from_slice(&digest[..16]);
    salt
}

/// One SCRAM exchange, server side.
pub struct ScramServer {
    verifier: Verifier,
    server_nonce: String,
    state: Option<(String, String, String)>, // client-first-bare, server-first, full nonce
}

impl ScramServer {
    pub fn new(verifier: Verifier, server_nonce: String) -> ScramServer {
        ScramServer {
            verifier,
            server_nonce,
            state: None,
        }
    }

    /// Takes client-first-message, returns server-first-message.
    pub fn server_first(&mut self, client_first: &[u8]) -> Result<String, ScramError> {
        let text =
            std::str::from_utf8(client_first).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        // gs2-header: "n,," or "y,," (client could bind but thinks we cannot); "p=" asks for binding.
        let bare = if let Some(rest) = text.strip_prefix("n,").or_else(|| text.strip_prefix("y,")) {
            let comma = rest.find(',').ok_or(ScramError::Malformed("gs2 header"))?;
            &rest[comma + 1..]
        } else if text.starts_with("p=") {
            return Err(ScramError::ChannelBinding);
        } else {
            return Err(ScramError::Malformed("gs2 header"));
        };
        let client_nonce = bare
            .split(',')
            .find_map(|a| a.strip_prefix("r="))
            .filter(|n| !n.is_empty())
            .ok_or(ScramError::Malformed("client nonce"))?;
        let nonce = format!("{client_nonce}{}", self.server_nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&self.verifier.salt),
            self.verifier.iterations
        );
        self.state = Some((bare.to_owned(), server_first.clone(), nonce));
        Ok(server_first)
    }

    /// Takes client-final-message, returns server-final-message (`v=...`) when the proof holds.
    pub fn server_final(&self, client_final: &[u8]) -> Result<String, ScramError> {
        let (bare, server_first, nonce) = self
            .state
            .as_ref()
            .ok_or(ScramError::Malformed("out of order"))?;
        let text =
            std::str::from_utf8(client_final).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        let (without_proof, proof_b64) = text
            .rsplit_once(",p=")
            .ok_or(ScramError::Malformed("client proof"))?;
        let mut attrs = without_proof.split(',');
        let binding = attrs.next().and_then(|a| a.strip_prefix("c="));
        if !matches!(binding, Some("biws") | Some("eSws")) {
            return Err(ScramError::Malformed("channel binding attribute"));
        }
        if attrs.next().and_then(|a| a.strip_prefix("r=")) != Some(nonce.as_str()) {
            return Err(ScramError::Malformed("nonce mismatch"));
        }
        let proof = B64
            .decode(proof_b64)
            .map_err(|_| ScramError::Malformed("proof encoding"))?;
        if proof.len() != 32 {
            return Err(ScramError::Malformed("proof length"));
        }
        let auth_message = format!("{bare},{server_first},{without_proof}");
        let client_signature = hmac(&self.verifier.stored_key, auth_message.as_bytes());
        let mut client_key = [0u8; 32];
        for i in 0..32 {
            client_key[i] = proof[i] ^ client_signature[i];
        }
        let stored: [u8; 32] = Sha256::digest(client_key).into();
        if !constant_time_eq(&stored, &self.verifier.stored_key) {
            return Err(ScramError::InvalidProof);
        }
        let server_signature = hmac(&self.verifier.server_key, auth_message.as_bytes());
        Ok(format!("v={}", B64.encode(server_signature)))
    }
}

/// Equality that does not stop at the first difference.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 7677 section 3.
    const CLIENT_FIRST: &str = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
    const SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
    const SERVER_FIRST: &str =
        "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
    const CLIENT_FINAL: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
    const SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

    fn rfc_server(password: &str) -> ScramServer {
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        ScramServer::new(Verifier::new(password, &salt, 4096), SERVER_NONCE.into())
    }

    #[test]
    fn rfc7677_vector() {
        let mut s = rfc_server("pencil");
        assert_eq!(
            s.server_first(CLIENT_FIRST.as_bytes()).unwrap(),
            SERVER_FIRST
        );
        assert_eq!(
            s.server_final(CLIENT_FINAL.as_bytes()).unwrap(),
            SERVER_FINAL
        );
    }

    #[test]
    fn unknown_users_get_a_stable_salt_and_match_no_password() {
        let secret = [7u8; 16];
        let v = Verifier::unmatchable(&secret, "nobody");
        assert_eq!(v.salt, stable_salt(&secret, "nobody"));
        assert_eq!(
            stable_salt(&secret, "nobody"),
            stable_salt(&secret, "nobody")
        );
        assert_ne!(
            stable_salt(&secret, "nobody"),
            stable_salt(&secret, "other")
        );
        assert_ne!(
            stable_salt(&secret, "nobody"),
            stable_salt(&[8u8; 16], "nobody")
        );
        let real = Verifier::new("pencil", &v.salt, ITERATIONS);
        assert_ne!(v.stored_key, real.stored_key, "not the key of any password");
    }

    #[test]
    fn wrong_password_fails() {
        let mut s = rfc_server("pencil2");
        s.server_first(CLIENT_FIRST.as_bytes()).unwrap();
        assert_eq!(
            s.server_final(CLIENT_FINAL.as_bytes()),
            Err(ScramError::InvalidProof)
        );
    }

    #[test]
    fn malformed_messages_are_errors() {
        let mut s = rfc_server("pencil");
        assert!(
            s.server_final(CLIENT_FINAL.as_bytes()).is_err(),
            "final before first"
        );
        assert_eq!(
            s.server_first(b"p=tls-server-end-point,,n=,r=x"),
            Err(ScramError::ChannelBinding)
        );
        assert!(s.server_first(b"garbage").is_err());
        assert!(s.server_first(b"n,,n=,r=").is_err());
        s.server_first(CLIENT_FIRST.as_bytes()).unwrap();
        assert!(s.server_final(b"c=biws,r=other,p=AAAA").is_err());
        assert!(s.server_final(b"\xff\xfe").is_err());
    }
}
