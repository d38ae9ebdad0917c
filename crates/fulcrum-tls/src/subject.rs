//! The common name (CN) of a certificate's subject, which is the login name
//! of a client authenticated by certificate (`client_auth = "cert"`, as
//! PgBouncer's `auth_type = cert` and PostgreSQL's `cert` method). Pure.

use crate::end_point::{element, OID, SEQUENCE};

const SET: u8 = 0x31;
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// The subject's CN of the certificate `der` (the first, if several), as
/// UTF-8; `None` when it has none or the bytes are not a certificate.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (tag, cert, _) = element(der)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, tbs, _) = element(cert)?;
    if tag != SEQUENCE {
        return None;
    }
    // [0] version (optional), serialNumber, signature, issuer, validity, subject.
    let mut rest = tbs;
    let (tag, _, after) = element(rest)?;
    if tag == 0xa0 {
        rest = after;
    }
    for _ in 0..4 {
        rest = element(rest)?.2;
    }
    let (tag, mut name, _) = element(rest)?;
    if tag != SEQUENCE {
        return None;
    }
    while !name.is_empty() {
        let (tag, mut set, next) = element(name)?;
        name = next;
        if tag != SET {
            return None;
        }
        while !set.is_empty() {
            let (_, attribute, after) = element(set)?;
            set = after;
            let (tag, oid, value) = element(attribute)?;
            if tag == OID && oid == COMMON_NAME {
                let (tag, text, _) = element(value)?;
                // UTF8String, PrintableString, IA5String, TeletexString.
                return match tag {
                    0x0c | 0x13 | 0x16 | 0x14 => String::from_utf8(text.to_vec()).ok(),
                    // BMPString: UTF-16BE.
                    0x1e => {
                        let units: Vec<u16> = text
                            .chunks_exact(2)
                            .map(|c| u16::from_be_bytes([c[0], c[1]]))
                            .collect();
                        String::from_utf16(&units).ok()
                    }
                    _ => None,
                };
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn openssl_cert(subject: &str) -> Vec<u8> {
        let dir = std::env::temp_dir().join(format!(
            "fulcrum-subject-{}-{}",
            std::process::id(),
            subject.len()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("c.der"), dir.join("k.pem"));
        let ok = std::process::Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ])
            .args([
                "-nodes", "-days", "1", "-utf8", "-subj", subject, "-outform", "DER",
            ])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok);
        let der = std::fs::read(&cert).unwrap();
        let _ = std::fs::remove_dir_all(dir);
        der
    }

    #[test]
    fn the_cn_of_real_certificates() {
        assert_eq!(
            common_name(&openssl_cert("/O=Acme/CN=app_user/OU=x")).as_deref(),
            Some("app_user")
        );
        assert_eq!(
            common_name(&openssl_cert("/CN=jürgen")).as_deref(),
            Some("jürgen")
        );
        assert_eq!(common_name(&openssl_cert("/O=NoName")), None);
    }

    #[test]
    fn garbage_is_none() {
        assert_eq!(common_name(b""), None);
        assert_eq!(common_name(&[0x30, 0x03, 0x30, 0x01, 0x00]), None);
        assert_eq!(common_name(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
    }
}
