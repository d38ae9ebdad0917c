//! Client authentication as a server does it, plus the responses Fulcrum sends
//! when it is the client: mysql_native_password and caching_sha2_password's
//! fast path. Pure: the scramble comes in from the caller, and every check
//! compares in constant time. The packets they travel in are `codec::auth_packets`.

pub mod caching_sha2;
pub mod native;

/// Compares two byte strings in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn xor<const N: usize>(a: &[u8; N], b: &[u8; N]) -> [u8; N] {
    std::array::from_fn(|i| a[i] ^ b[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_lengths_and_bytes() {
        assert!(constant_time_eq(b"", b""));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert_eq!(xor(&[0b1100], &[0b1010]), [0b0110]);
    }
}
