//! caching_sha2_password. Fast path: the client sends
//! `SHA256(password) XOR SHA256(SHA256(SHA256(password)) + scramble)`, the
//! outer hash taken over the double hash followed by the scramble (what
//! mysql_common's `scramble_sha256` computes, pinned by a test below); a server
//! holding `SHA256(SHA256(password))` undoes the XOR and checks the SHA256 of
//! the result, then answers AuthMoreData 0x03 ("fast auth success") and OK.
//!
//! Full authentication (the server's 0x04) sends the password itself, so it
//! needs TLS or the server's RSA key. Towards clients Fulcrum asks for it
//! ([`perform_full_authentication`], checked by [`verify_cleartext`]) only
//! over TLS, when the fast path did not verify, as MySQL does; without TLS
//! that client gets ERR 1045 (Fulcrum does not do the RSA exchange). As a client of a server that asks for full
//! authentication, Fulcrum sends [`full_auth_cleartext`] over TLS or
//! [`full_auth_rsa`] with the key the server sends after [`REQUEST_PUBLIC_KEY`].

use mysql_common::auth::plugins::caching_sha2_password::scramble_sha256;
use sha2::{Digest, Sha256};

use super::{constant_time_eq, native, xor};
use crate::codec::auth_packets::{build_auth_more_data, build_auth_switch_scramble};

pub const PLUGIN: &str = "caching_sha2_password";
/// Client to server, after 0x04 without TLS: send me your RSA public key.
pub const REQUEST_PUBLIC_KEY: u8 = 0x02;
/// Server to client, in AuthMoreData: the fast-path response verified.
pub const FAST_AUTH_SUCCESS: u8 = 0x03;
/// Server to client, in AuthMoreData: no cached entry, send the password.
pub const PERFORM_FULL_AUTHENTICATION: u8 = 0x04;

fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    parts.iter().for_each(|p| h.update(p));
    h.finalize().into()
}

/// `SHA256(SHA256(password))`, what a server caches after a full authentication.
pub fn cached_hash(password: &[u8]) -> [u8; 32] {
    sha256(&[&sha256(&[password])])
}

/// Checks a client's 32-byte fast-path response against a cached hash.
pub fn verify_cached(cached: &[u8; 32], scramble: &[u8; 20], response: &[u8]) -> bool {
    let Ok(response) = <&[u8; 32]>::try_from(response) else {
        return false;
    };
    let stage1 = xor(response, &sha256(&[cached, scramble]));
    constant_time_eq(&sha256(&[&stage1]), cached)
}

/// Checks a client's fast-path response for `password` (an empty password is
/// answered with an empty response).
pub fn verify(password: &[u8], scramble: &[u8; 20], response: &[u8]) -> bool {
    if password.is_empty() {
        return response.is_empty();
    }
    verify_cached(&cached_hash(password), scramble, response)
}

/// The fast-path response Fulcrum sends a server (empty for an empty password).
pub fn client_response(password: &[u8], scramble: &[u8; 20]) -> Vec<u8> {
    scramble_sha256(scramble, password).map_or_else(Vec::new, |r| r.to_vec())
}

/// AuthMoreData "fast auth success" (`01 03`), sent before the OK.
pub fn fast_auth_success() -> Vec<u8> {
    build_auth_more_data(&[FAST_AUTH_SUCCESS])
}

/// AuthMoreData 0x04: "send the password" (full authentication, over TLS).
pub fn perform_full_authentication() -> Vec<u8> {
    build_auth_more_data(&[PERFORM_FULL_AUTHENTICATION])
}

/// Checks the password a client sent in full authentication (NUL-terminated
/// cleartext) against `password`, in constant time.
pub fn verify_cleartext(password: &[u8], sent: &[u8]) -> bool {
    let sent = sent.strip_suffix(&[0]).unwrap_or(sent);
    constant_time_eq(sent, password)
}

/// AuthSwitchRequest to mysql_native_password with a fresh scramble: Fulcrum's
/// answer whenever full authentication would be needed.
pub fn switch_to_native(scramble: &[u8; 20]) -> Vec<u8> {
    build_auth_switch_scramble(native::PLUGIN, scramble)
}

/// Full authentication over TLS: the password, NUL-terminated.
pub fn full_auth_cleartext(password: &[u8]) -> Vec<u8> {
    let mut out = password.to_vec();
    out.push(0);
    out
}

/// Full authentication without TLS: the NUL-terminated password XORed with
/// the scramble, encrypted with the server's PEM public key (RSA-OAEP, MySQL
/// 8.0.5 and later), through mysql_common's `crypto::encrypt`.
pub fn full_auth_rsa(
    password: &[u8],
    scramble: &[u8; 20],
    public_key_pem: &[u8],
) -> Result<Vec<u8>, mysql_common::crypto::Error> {
    let mut plain = full_auth_cleartext(password);
    plain
        .iter_mut()
        .zip(scramble.iter().cycle())
        .for_each(|(p, s)| *p ^= s);
    mysql_common::crypto::encrypt(&plain, public_key_pem)
}

#[cfg(test)]
mod tests;
