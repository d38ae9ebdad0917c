//! mysql_native_password. The client proves it knows the password with
//! `SHA1(password) XOR SHA1(scramble + SHA1(SHA1(password)))`; a server holding
//! only `SHA1(SHA1(password))` (what `mysql.user` stores as `*` and 40 hex
//! digits) undoes the XOR and checks that the SHA1 of the result is the stored hash.
//! Fulcrum's own response to a server is mysql_common's `scramble_native`.

use mysql_common::auth::plugins::mysql_native_password::scramble_native;
use sha1::{Digest, Sha1};

use super::{constant_time_eq, xor};

pub const PLUGIN: &str = "mysql_native_password";

fn sha1(parts: &[&[u8]]) -> [u8; 20] {
    let mut h = Sha1::new();
    parts.iter().for_each(|p| h.update(p));
    h.finalize().into()
}

/// `SHA1(password)`: what answers a native challenge.
pub fn stage1(password: &[u8]) -> [u8; 20] {
    sha1(&[password])
}

/// `SHA1(stage1)`: the hash a server stores.
pub fn stage2(stage1: &[u8; 20]) -> [u8; 20] {
    sha1(&[stage1])
}

/// `SHA1(SHA1(password))`, the hash a server stores.
pub fn stored_hash(password: &[u8]) -> [u8; 20] {
    sha1(&[&sha1(&[password])])
}

/// Reads a stored hash in MySQL's text form: `*` then 40 hex digits.
pub fn parse_stored_hash(text: &str) -> Option<[u8; 20]> {
    let hex = text.strip_prefix('*')?.as_bytes();
    if hex.len() != 40 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; 20];
    for (o, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        *o = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// Checks a client's 20-byte response against a stored hash.
pub fn verify_hash(stored: &[u8; 20], scramble: &[u8; 20], response: &[u8]) -> bool {
    let Ok(response) = <&[u8; 20]>::try_from(response) else {
        return false;
    };
    let stage1 = xor(response, &sha1(&[scramble, stored]));
    constant_time_eq(&sha1(&[&stage1]), stored)
}

/// The client's `SHA1(password)` when its response proves it against the
/// stored hash (ProxySQL's method for users it knows only by their hash):
/// with it Fulcrum answers a server's mysql_native_password challenge as
/// that user without knowing the password.
pub fn recover_stage1(stored: &[u8; 20], scramble: &[u8; 20], response: &[u8]) -> Option<[u8; 20]> {
    let response = <&[u8; 20]>::try_from(response).ok()?;
    let stage1 = xor(response, &sha1(&[scramble, stored]));
    constant_time_eq(&sha1(&[&stage1]), stored).then_some(stage1)
}

/// The response to `scramble` from `SHA1(password)` alone.
pub fn response_from_stage1(stage1: &[u8; 20], scramble: &[u8; 20]) -> Vec<u8> {
    let stage2 = sha1(&[stage1]);
    xor(stage1, &sha1(&[scramble, &stage2])).to_vec()
}

/// Checks a client's response for `password`. An empty password is answered
/// with an empty response, as clients send for it.
pub fn verify(password: &[u8], scramble: &[u8; 20], response: &[u8]) -> bool {
    if password.is_empty() {
        return response.is_empty();
    }
    verify_hash(&stored_hash(password), scramble, response)
}

/// The response Fulcrum sends a server that asked for this plugin (empty for
/// an empty password).
pub fn client_response(password: &[u8], scramble: &[u8; 20]) -> Vec<u8> {
    scramble_native(scramble, password).map_or_else(Vec::new, |r| r.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stored_hash_recovers_what_logs_in_to_a_server() {
        let scramble = [7u8; 20];
        let stored = stored_hash(b"s3cret");
        let response = client_response(b"s3cret", &scramble);
        let stage1 = recover_stage1(&stored, &scramble, &response).expect("proof holds");
        assert_eq!(stage1, sha1(&[b"s3cret"]));
        // What Fulcrum then sends a server with another scramble is what
        // the password would give.
        let other = [9u8; 20];
        assert_eq!(
            response_from_stage1(&stage1, &other),
            client_response(b"s3cret", &other)
        );
        assert_eq!(
            recover_stage1(&stored, &scramble, &client_response(b"nope", &scramble)),
            None
        );
        assert_eq!(recover_stage1(&stored, &scramble, b"short"), None);
    }

    const SCRAMBLE: [u8; 20] = *b"abcdefghij0123456789";

    #[test]
    fn stored_hash_matches_mysqls_password_function() {
        // SELECT PASSWORD('password') on MySQL 5.7.
        let want = parse_stored_hash("*2470C0C06DEE42FD1618BB99005ADCA2EC9D1E19").unwrap();
        assert_eq!(stored_hash(b"password"), want);
        assert_eq!(
            parse_stored_hash("*2470c0c06dee42fd1618bb99005adca2ec9d1e19"),
            Some(want)
        );
        for bad in [
            "2470C0C06DEE42FD1618BB99005ADCA2EC9D1E19",
            "*2470",
            "*2470C0C06DEE42FD1618BB99005ADCA2EC9D1EZZ",
            "",
        ] {
            assert_eq!(parse_stored_hash(bad), None, "{bad}");
        }
    }

    #[test]
    fn mysql_commons_response_verifies() {
        let r = client_response(b"secret", &SCRAMBLE);
        assert_eq!(r.len(), 20);
        assert!(verify(b"secret", &SCRAMBLE, &r));
        assert!(verify_hash(&stored_hash(b"secret"), &SCRAMBLE, &r));
        assert!(!verify(b"Secret", &SCRAMBLE, &r));
        assert!(!verify(b"secret", b"abcdefghij012345678X", &r));
        assert!(!verify(b"secret", &SCRAMBLE, &r[..19]));
        assert!(!verify(b"secret", &SCRAMBLE, b""));
        let mut flipped = r.clone();
        flipped[0] ^= 1;
        assert!(!verify(b"secret", &SCRAMBLE, &flipped));
    }

    #[test]
    fn known_vector_from_mysql_common() {
        // mysql_common's own test vector for scramble_native.
        let scramble = [
            0x4e, 0x52, 0x33, 0x48, 0x50, 0x3a, 0x71, 0x49, 0x59, 0x61, 0x5f, 0x39, 0x3d, 0x64,
            0x62, 0x3f, 0x53, 0x64, 0x7b, 0x60,
        ];
        let response = [
            0x09, 0xcf, 0xf8, 0x85, 0x5e, 0x9e, 0x70, 0x53, 0x40, 0xff, 0x22, 0x70, 0xd8, 0xfb,
            0x9f, 0xad, 0xba, 0x90, 0x6b, 0x70,
        ];
        assert!(verify(b"G!ider27", &scramble, &response));
    }

    #[test]
    fn empty_password() {
        assert!(client_response(b"", &SCRAMBLE).is_empty());
        assert!(verify(b"", &SCRAMBLE, b""));
        assert!(!verify(b"", &SCRAMBLE, &client_response(b"x", &SCRAMBLE)));
    }
}
