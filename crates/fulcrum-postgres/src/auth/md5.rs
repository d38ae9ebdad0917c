//! md5 password authentication: the client sends `md5` + md5(md5(password + user) + salt).

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
}
