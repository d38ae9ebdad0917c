use super::*;
use crate::codec::auth_packets::{parse_auth_more_data, parse_auth_switch};

const SCRAMBLE: [u8; 20] = *b"abcdefghij0123456789";

#[test]
fn a_response_from_scramble_sha256_verifies_and_a_wrong_one_does_not() {
    let r = client_response(b"secret", &SCRAMBLE);
    assert_eq!(r.len(), 32);
    assert!(verify(b"secret", &SCRAMBLE, &r));
    assert!(verify_cached(&cached_hash(b"secret"), &SCRAMBLE, &r));
    assert!(!verify(b"secreT", &SCRAMBLE, &r));
    assert!(!verify(b"secret", b"abcdefghij012345678X", &r));
    let mut flipped = r.clone();
    flipped[31] ^= 0x80;
    assert!(!verify(b"secret", &SCRAMBLE, &flipped));
    assert!(
        !verify(b"secret", &SCRAMBLE, &r[..20]),
        "a native-sized response"
    );
    assert!(!verify(
        b"secret",
        &SCRAMBLE,
        &native::client_response(b"secret", &SCRAMBLE)
    ));
}

#[test]
fn formula_is_sha256_password_xor_sha256_of_double_hash_then_scramble() {
    let pw = b"G!ider27";
    let h1 = sha256(&[pw]);
    let h2 = sha256(&[&h1]);
    assert_eq!(h2, cached_hash(pw));
    let want: Vec<u8> = h1
        .iter()
        .zip(sha256(&[&h2, &SCRAMBLE]))
        .map(|(a, b)| a ^ b)
        .collect();
    assert_eq!(client_response(pw, &SCRAMBLE), want);
    // Neither the scramble first nor a third hash of the password is the formula.
    for wrong_key in [
        sha256(&[&SCRAMBLE, &h2]),
        sha256(&[&sha256(&[&h2]), &SCRAMBLE]),
    ] {
        let wrong: Vec<u8> = h1.iter().zip(wrong_key).map(|(a, b)| a ^ b).collect();
        assert!(!verify(pw, &SCRAMBLE, &wrong));
    }
}

#[test]
fn known_vector_from_mysql_common() {
    let scramble = [
        0x4e, 0x52, 0x33, 0x48, 0x50, 0x3a, 0x71, 0x49, 0x59, 0x61, 0x5f, 0x39, 0x3d, 0x64, 0x62,
        0x3f, 0x53, 0x64, 0x7b, 0x60,
    ];
    let response = [
        0x4f, 0x97, 0xbb, 0xfd, 0x20, 0x24, 0x01, 0xc4, 0x2a, 0x69, 0xde, 0xaa, 0xe5, 0x3b, 0xda,
        0x07, 0x7e, 0xd7, 0x57, 0x85, 0x63, 0xc1, 0xa8, 0x0e, 0xb8, 0x16, 0xc8, 0x21, 0x19, 0xb6,
        0x8d, 0x2e,
    ];
    assert!(verify(b"G!ider27", &scramble, &response));
}

#[test]
fn empty_password() {
    assert!(client_response(b"", &SCRAMBLE).is_empty());
    assert!(verify(b"", &SCRAMBLE, b""));
    assert!(!verify(b"", &SCRAMBLE, &[0; 32]));
}

#[test]
fn fast_auth_success_and_switch_packets() {
    assert_eq!(fast_auth_success(), [0x01, 0x03]);
    assert_eq!(
        parse_auth_more_data(&fast_auth_success()),
        Ok(&[FAST_AUTH_SUCCESS][..])
    );
    let switch = switch_to_native(&SCRAMBLE);
    let s = parse_auth_switch(&switch).unwrap();
    assert_eq!(s.plugin, "mysql_native_password");
    assert_eq!(s.data, SCRAMBLE);
    assert_eq!(
        *switch.last().unwrap(),
        0,
        "scramble NUL-terminated as MySQL sends it"
    );
}

const PUBLIC_KEY: &[u8] = b"-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAwSKusIPSk3biAn2rEnpB
IZi6f36HF/7f157MhBJ3kB2KaQWTtaIYvqysuWeBrUnaqf5N5slocb0LpDQLEQ61
0tLvezLEjDfdEDhqyih+oLksRmjme83ouB71wtr3faivuMKrEgGNcSnMzBuCMgCW
/1Y7CY8REh5hxSXVhDK4UXldEPAJ6T+UtkjdXROWjbCU7riGBxZoyfkFrMQ1MoHX
ADReS+aozmgo70S4UFb1bdV0wM544FvdNtIYK1UKAoWTzashEqjWONTbX3teAP/7
6DOeyR+U2eGAXfj3WvXiHuCSFvIIZhahLW8bA+pg1GCRB9ZhQfbuFAng3R0FPRTI
hQIDAQAB
-----END PUBLIC KEY-----
";

#[test]
fn full_authentication_responses() {
    assert_eq!(full_auth_cleartext(b"pw"), b"pw\0");
    let encrypted = full_auth_rsa(b"secret", &SCRAMBLE, PUBLIC_KEY).unwrap();
    assert_eq!(encrypted.len(), 256, "one 2048-bit RSA block");
    assert_ne!(
        full_auth_rsa(b"secret", &SCRAMBLE, PUBLIC_KEY).unwrap(),
        encrypted,
        "OAEP is randomised"
    );
    assert!(full_auth_rsa(b"secret", &SCRAMBLE, b"not a key").is_err());
}
