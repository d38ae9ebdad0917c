//! md5 password authentication: the client sends `md5` + md5(md5(password + user) + salt).
//! The inner hash (`md5` + md5(password + user)) is what PostgreSQL stores,
//! so with it alone (from `auth_query`) a client can be checked and a server
//! logged in to.

use md5::{Digest, Md5};

/// The response to `salt` from a stored hash (`md5` + 32 hex digits).
pub fn response_from_hash(stored: &str, salt: [u8; 4]) -> String {
    let inner = stored.strip_prefix("md5").unwrap_or(stored);
    let digest = Md5::new()
        .chain_update(inner.as_bytes())
        .chain_update(salt)
        .finalize();
    format!("md5{}", hex(&digest))
}

/// Lower-case hex digits of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks a client's response against a stored hash, in constant time.
pub fn verify_hash(stored: &str, salt: [u8; 4], response: &[u8]) -> bool {
    super::scram::constant_time_eq(response_from_hash(stored, salt).as_bytes(), response)
}

/// The response a client holding `password` must send for `user` and `salt`.
pub fn expected_response(user: &str, password: &str, salt: [u8; 4]) -> String {
    postgres_protocol::authentication::md5_hash(user.as_bytes(), password.as_bytes(), salt)
}

/// Compares a client's response in constant time with the expected one.
pub fn verify(user: &str, password: &str, salt: [u8; 4], response: &[u8]) -> bool {
    super::scram::constant_time_eq(expected_response(user, password, salt).as_bytes(), response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        // md5(md5("secret" + "app") + salt) computed by libpq's algorithm.
        let r = expected_response("app", "secret", [1, 2, 3, 4]);
        assert!(r.starts_with("md5") && r.len() == 35);
        assert!(verify("app", "secret", [1, 2, 3, 4], r.as_bytes()));
        assert!(!verify("app", "wrong", [1, 2, 3, 4], r.as_bytes()));
        assert!(!verify("app", "secret", [1, 2, 3, 5], r.as_bytes()));
    }

    #[test]
    fn the_stored_hash_gives_the_same_response_as_the_password() {
        // What PostgreSQL stores for password "secret", user "app".
        let stored = format!("md5{}", hex(&Md5::digest(b"secretapp")));
        let salt = [9, 8, 7, 6];
        assert_eq!(
            response_from_hash(&stored, salt),
            expected_response("app", "secret", salt)
        );
        assert!(verify_hash(
            &stored,
            salt,
            expected_response("app", "secret", salt).as_bytes()
        ));
        assert!(!verify_hash(
            &stored,
            salt,
            expected_response("app", "other", salt).as_bytes()
        ));
    }
}
