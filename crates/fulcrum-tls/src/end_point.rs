//! RFC 5929's `tls-server-end-point` channel binding data: the hash of the
//! server's certificate, with the hash function of the certificate's own
//! signature algorithm (SHA-256 when that is MD5 or SHA-1). SCRAM-SHA-256-PLUS
//! binds the login to it, on both sides of Fulcrum. Pure: DER bytes in, hash out.

use sha2::{Digest, Sha256, Sha384, Sha512};

/// The hash the binding uses for the certificate `der`, or `None` when its
/// signature algorithm names no hash (Ed25519, as PostgreSQL also refuses)
/// or the bytes are not a certificate.
pub fn certificate_hash(der: &[u8]) -> Option<Vec<u8>> {
    let hash = signature_hash(der)?;
    Some(match hash {
        Hash::Sha256 => Sha256::digest(der).to_vec(),
        Hash::Sha384 => Sha384::digest(der).to_vec(),
        Hash::Sha512 => Sha512::digest(der).to_vec(),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hash {
    Sha256,
    Sha384,
    Sha512,
}

/// One DER element at the start of `b`: (tag, contents, rest).
pub(crate) fn element(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, b) = b.split_first()?;
    let (&first, mut b) = b.split_first()?;
    let len = if first < 0x80 {
        first as usize
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || b.len() < n {
            return None;
        }
        let len = b[..n]
            .iter()
            .fold(0usize, |acc, x| (acc << 8) | *x as usize);
        b = &b[n..];
        len
    };
    if b.len() < len {
        return None;
    }
    Some((tag, &b[..len], &b[len..]))
}

pub(crate) const SEQUENCE: u8 = 0x30;
pub(crate) const OID: u8 = 0x06;

/// Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm, signature }:
/// the hash named by signatureAlgorithm's OID.
fn signature_hash(der: &[u8]) -> Option<Hash> {
    let (tag, cert, _) = element(der)?;
    if tag != SEQUENCE {
        return None;
    }
    let (_, _, after_tbs) = element(cert)?;
    let (tag, algorithm, _) = element(after_tbs)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, oid, params) = element(algorithm)?;
    if tag != OID {
        return None;
    }
    match oid {
        // md5WithRSAEncryption, sha1WithRSAEncryption, sha256WithRSAEncryption,
        // ecdsa-with-SHA1, ecdsa-with-SHA256: SHA-256.
        [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x04 | 0x05 | 0x0b | 0x0e]
        | [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01]
        | [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02] => Some(Hash::Sha256),
        [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c]
        | [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03] => Some(Hash::Sha384),
        [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0d]
        | [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04] => Some(Hash::Sha512),
        // RSASSA-PSS: the hash is in its parameters.
        [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0a] => pss_hash(params),
        _ => None,
    }
}

/// RSASSA-PSS-params ::= SEQUENCE { hashAlgorithm [0] AlgorithmIdentifier DEFAULT sha1, ... }
fn pss_hash(params: &[u8]) -> Option<Hash> {
    let (tag, seq, _) = element(params)?;
    if tag != SEQUENCE {
        return None;
    }
    let Some((0xa0, explicit, _)) = element(seq) else {
        return Some(Hash::Sha256); // SHA-1 default, raised to SHA-256
    };
    let (_, algorithm, _) = element(explicit)?;
    let (_, oid, _) = element(algorithm)?;
    match oid {
        [0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02] => Some(Hash::Sha384),
        [0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x03] => Some(Hash::Sha512),
        _ => Some(Hash::Sha256),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate's outer shape around `algorithm_oid`: SEQUENCE {
    /// SEQUENCE {} (tbs), SEQUENCE { OID }, BIT STRING }.
    fn shell(algorithm_oid: &[u8]) -> Vec<u8> {
        let mut alg = vec![OID, algorithm_oid.len() as u8];
        alg.extend_from_slice(algorithm_oid);
        let mut body = vec![SEQUENCE, 0];
        body.push(SEQUENCE);
        body.push(alg.len() as u8);
        body.extend_from_slice(&alg);
        body.extend_from_slice(&[0x03, 0x01, 0x00]);
        let mut der = vec![SEQUENCE, body.len() as u8];
        der.extend_from_slice(&body);
        der
    }

    #[test]
    fn the_hash_follows_the_signature_algorithm() {
        let ecdsa256 = shell(&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02]);
        assert_eq!(
            certificate_hash(&ecdsa256).unwrap(),
            Sha256::digest(&ecdsa256).to_vec()
        );
        let rsa384 = shell(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c]);
        assert_eq!(certificate_hash(&rsa384).unwrap().len(), 48);
        let ecdsa512 = shell(&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04]);
        assert_eq!(certificate_hash(&ecdsa512).unwrap().len(), 64);
        // SHA-1 is raised to SHA-256 (RFC 5929 section 4.1).
        let rsa_sha1 = shell(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x05]);
        assert_eq!(
            certificate_hash(&rsa_sha1).unwrap(),
            Sha256::digest(&rsa_sha1).to_vec()
        );
    }

    #[test]
    fn no_hash_for_ed25519_or_garbage() {
        assert_eq!(certificate_hash(&shell(&[0x2b, 0x65, 0x70])), None);
        assert_eq!(certificate_hash(b""), None);
        assert_eq!(certificate_hash(&[0x30, 0x85, 0xff]), None);
        assert_eq!(certificate_hash(&[0x30, 0x82, 0xff, 0xff, 0x00]), None);
    }

    #[test]
    fn a_real_certificate_from_openssl() {
        let dir = std::env::temp_dir().join(format!("fulcrum-endpoint-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("c.pem"), dir.join("k.pem"));
        let ok = std::process::Command::new("openssl")
            .args(["req", "-x509", "-newkey", "rsa:2048", "-sha384", "-nodes"])
            .args(["-days", "1", "-subj", "/CN=x", "-outform", "DER"])
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
        assert_eq!(
            certificate_hash(&der).unwrap(),
            Sha384::digest(&der).to_vec()
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
