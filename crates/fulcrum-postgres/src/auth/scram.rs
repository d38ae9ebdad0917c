//! Server side of SCRAM-SHA-256, and of SCRAM-SHA-256-PLUS with the
//! `tls-server-end-point` channel binding (RFC 5929) on TLS connections, as
//! PostgreSQL runs them. Pure: the nonce and the certificate hash come in
//! from the caller, so RFC 7677's test vector is a unit test.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use thiserror::Error;

pub const MECHANISM: &str = "SCRAM-SHA-256";
pub const MECHANISM_PLUS: &str = "SCRAM-SHA-256-PLUS";
/// The one channel binding type PostgreSQL (and Fulcrum) supports.
pub const END_POINT: &str = "tls-server-end-point";
pub const ITERATIONS: u32 = 4096;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ScramError {
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    #[error("channel binding is not supported")]
    ChannelBinding,
    #[error("unsupported SCRAM channel-binding type \"{0}\"")]
    ChannelBindingType(String),
    #[error("SCRAM channel binding negotiation error: the client supports channel binding but thinks the server does not; this server does (a man in the middle may have removed SCRAM-SHA-256-PLUS)")]
    Downgrade,
    #[error("SCRAM channel binding check failed")]
    BindingMismatch,
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

pub(crate) fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts any key length");
    m.update(data);
    m.finalize().into_bytes().into()
}

/// PBKDF2-HMAC-SHA-256 with one output block: RFC 5802's Hi().
pub(crate) fn hi(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
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
    /// The certificate hash when SCRAM-SHA-256-PLUS was offered (TLS).
    offered: Option<Vec<u8>>,
    /// The client chose SCRAM-SHA-256-PLUS.
    plus: bool,
    state: Option<State>,
    /// The client's ClientKey, recovered from its proof once it held.
    client_key: Option<[u8; 32]>,
}

struct State {
    client_first_bare: String,
    server_first: String,
    nonce: String,
    /// What the client's `c=` attribute must be: base64 of the gs2 header
    /// and, with binding, the certificate hash.
    expected_binding: String,
}

impl ScramServer {
    pub fn new(verifier: Verifier, server_nonce: String) -> ScramServer {
        ScramServer {
            verifier,
            server_nonce,
            offered: None,
            plus: false,
            state: None,
            client_key: None,
        }
    }

    /// On a TLS connection: SCRAM-SHA-256-PLUS was offered with this
    /// certificate hash (`offered`), and `plus` says whether the client chose it.
    pub fn with_channel_binding(mut self, offered: Option<Vec<u8>>, plus: bool) -> ScramServer {
        self.offered = offered;
        self.plus = plus;
        self
    }

    /// Takes client-first-message, returns server-first-message.
    pub fn server_first(&mut self, client_first: &[u8]) -> Result<String, ScramError> {
        let text =
            std::str::from_utf8(client_first).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        // gs2-header: "n,," (no binding), "y,," (the client could bind but
        // thinks we cannot), "p=<type>,," (binding); an authzid may sit
        // between the commas.
        let first_comma = text.find(',').ok_or(ScramError::Malformed("gs2 header"))?;
        let second_comma = text[first_comma + 1..]
            .find(',')
            .map(|i| first_comma + 1 + i)
            .ok_or(ScramError::Malformed("gs2 header"))?;
        let (flag, gs2, bare) = (
            &text[..first_comma],
            &text[..=second_comma],
            &text[second_comma + 1..],
        );
        let mut binding_input = gs2.as_bytes().to_vec();
        match flag {
            "n" | "y" if self.plus => {
                return Err(ScramError::Malformed(
                    "SCRAM-SHA-256-PLUS selected without channel binding data",
                ))
            }
            "n" => {}
            "y" if self.offered.is_some() => return Err(ScramError::Downgrade),
            "y" => {}
            _ => match flag.strip_prefix("p=") {
                Some(kind) if !self.plus => {
                    let _ = kind;
                    return Err(ScramError::ChannelBinding);
                }
                Some(END_POINT) => match &self.offered {
                    Some(hash) => binding_input.extend_from_slice(hash),
                    None => return Err(ScramError::ChannelBinding),
                },
                Some(other) => return Err(ScramError::ChannelBindingType(other.to_owned())),
                None => return Err(ScramError::Malformed("gs2 header")),
            },
        }
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
        self.state = Some(State {
            client_first_bare: bare.to_owned(),
            server_first: server_first.clone(),
            nonce,
            expected_binding: B64.encode(binding_input),
        });
        Ok(server_first)
    }

    /// Takes client-final-message, returns server-final-message (`v=...`) when the proof holds.
    pub fn server_final(&mut self, client_final: &[u8]) -> Result<String, ScramError> {
        let state = self
            .state
            .as_ref()
            .ok_or(ScramError::Malformed("out of order"))?;
        let (bare, server_first, nonce) =
            (&state.client_first_bare, &state.server_first, &state.nonce);
        let text =
            std::str::from_utf8(client_final).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        let (without_proof, proof_b64) = text
            .rsplit_once(",p=")
            .ok_or(ScramError::Malformed("client proof"))?;
        let mut attrs = without_proof.split(',');
        let binding = attrs
            .next()
            .and_then(|a| a.strip_prefix("c="))
            .ok_or(ScramError::Malformed("channel binding attribute"))?;
        if !constant_time_eq(binding.as_bytes(), state.expected_binding.as_bytes()) {
            return Err(ScramError::BindingMismatch);
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
        self.client_key = Some(client_key);
        let server_signature = hmac(&self.verifier.server_key, auth_message.as_bytes());
        Ok(format!("v={}", B64.encode(server_signature)))
    }
}

impl ScramServer {
    /// The ClientKey the client proved it holds (proof XOR ClientSignature),
    /// after a successful `server_final`: with the verifier's ServerKey it
    /// is enough to log in to a server that stores the same verifier.
    pub fn client_key(&self) -> Option<[u8; 32]> {
        self.client_key
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
        // Binding asked for on a plain connection (SCRAM-SHA-256 chosen).
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

    /// A client's full SCRAM-SHA-256-PLUS exchange, computed here from the
    /// password the way libpq does, against `server`.
    fn plus_client(
        server: &mut ScramServer,
        password: &str,
        gs2: &str,
        cert_hash: &[u8],
    ) -> Result<String, ScramError> {
        let first = format!("{gs2}n=,r=clientnonce");
        let server_first = server.server_first(first.as_bytes())?;
        let mut attrs = server_first.split(',');
        let nonce = attrs.next().unwrap().strip_prefix("r=").unwrap().to_owned();
        let salt = B64
            .decode(attrs.next().unwrap().strip_prefix("s=").unwrap())
            .unwrap();
        let salted = hi(password.as_bytes(), &salt, ITERATIONS);
        let client_key = hmac(&salted, b"Client Key");
        let stored: [u8; 32] = Sha256::digest(client_key).into();
        let mut cbind = gs2.as_bytes().to_vec();
        cbind.extend_from_slice(cert_hash);
        let without_proof = format!("c={},r={nonce}", B64.encode(cbind));
        let auth = format!("n=,r=clientnonce,{server_first},{without_proof}");
        let signature = hmac(&stored, auth.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(signature)
            .map(|(k, s)| k ^ s)
            .collect();
        server.server_final(format!("{without_proof},p={}", B64.encode(proof)).as_bytes())
    }

    fn plus_server(offered: Option<&[u8]>, plus: bool) -> ScramServer {
        ScramServer::new(
            Verifier::new("pencil", b"salt-of-16-bytes", ITERATIONS),
            "srv".into(),
        )
        .with_channel_binding(offered.map(|h| h.to_vec()), plus)
    }

    #[test]
    fn channel_binding_checks_the_certificate_hash() {
        let hash = [9u8; 32];
        let gs2 = "p=tls-server-end-point,,";
        let mut s = plus_server(Some(&hash), true);
        assert!(plus_client(&mut s, "pencil", gs2, &hash)
            .unwrap()
            .starts_with("v="));
        // Another certificate's hash (a man in the middle terminating TLS).
        let mut s = plus_server(Some(&hash), true);
        assert_eq!(
            plus_client(&mut s, "pencil", gs2, &[8u8; 32]),
            Err(ScramError::BindingMismatch)
        );
        // Wrong password with the right binding.
        let mut s = plus_server(Some(&hash), true);
        assert_eq!(
            plus_client(&mut s, "pencil2", gs2, &hash),
            Err(ScramError::InvalidProof)
        );
        // Without binding, on TLS where it was offered: "n" is fine, "y" a downgrade.
        let mut s = plus_server(Some(&hash), false);
        assert!(plus_client(&mut s, "pencil", "n,,", &[]).is_ok());
        let mut s = plus_server(Some(&hash), false);
        assert_eq!(
            plus_client(&mut s, "pencil", "y,,", &[]),
            Err(ScramError::Downgrade)
        );
        // "y" where nothing was offered (plain connection): fine.
        let mut s = plus_server(None, false);
        assert!(plus_client(&mut s, "pencil", "y,,", &[]).is_ok());
        // The c= attribute must match the gs2 header the client sent.
        let mut s = plus_server(None, false);
        s.server_first(b"n,,n=,r=abc").unwrap();
        assert_eq!(
            s.server_final(b"c=eSws,r=abcsrv,p=AAAA"),
            Err(ScramError::BindingMismatch)
        );
        // Another binding type; PLUS chosen without data.
        let mut s = plus_server(Some(&hash), true);
        assert_eq!(
            s.server_first(b"p=tls-unique,,n=,r=x"),
            Err(ScramError::ChannelBindingType("tls-unique".into()))
        );
        let mut s = plus_server(Some(&hash), true);
        assert!(s.server_first(b"n,,n=,r=x").is_err());
    }
}
