//! A password given as PostgreSQL stores it (`pg_authid.rolpassword`,
//! PgBouncer's auth file): a SCRAM-SHA-256 verifier or an md5 hash, told
//! from a plain password by its form and checked here, so a malformed
//! verifier is a config error rather than a password nobody can type. Pure.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;

const SCRAM_PREFIX: &str = "SCRAM-SHA-256$";
const SCRAM_FORM: &str = "SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>";

/// `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`, decoded.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramVerifier {
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub stored_key: [u8; 32],
    pub server_key: [u8; 32],
}

impl std::fmt::Debug for ScramVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScramVerifier(<redacted>)")
    }
}

/// What stands in for a password.
#[derive(Clone, PartialEq, Eq)]
pub enum PasswordHash {
    /// A SCRAM-SHA-256 verifier: a client proves it with SCRAM, and the
    /// ClientKey it proves logs in to a server holding the same verifier.
    Scram(ScramVerifier),
    /// `md5` + 32 lower-case hex digits: md5(password + user name), which
    /// checks an md5 client and answers a server's md5 request.
    Md5(String),
}

impl std::fmt::Debug for PasswordHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PasswordHash::Scram(_) => "Scram(<redacted>)",
            PasswordHash::Md5(_) => "Md5(<redacted>)",
        })
    }
}

impl PasswordHash {
    /// Reads `text`: `None` when it is a plain password; `Some(Err(why))`
    /// when it starts as a SCRAM verifier but is not a valid one (`why`
    /// never quotes the text). An md5 hash is exactly `md5` and 32 hex
    /// digits, as PgBouncer and PostgreSQL tell it; anything else starting
    /// with `md5` is a password.
    pub fn detect(text: &str) -> Option<Result<PasswordHash, String>> {
        if let Some(rest) = text.strip_prefix(SCRAM_PREFIX) {
            return Some(parse_scram(rest).map(PasswordHash::Scram));
        }
        let md5 = text.len() == 35
            && text.starts_with("md5")
            && text[3..].bytes().all(|b| b.is_ascii_hexdigit());
        md5.then(|| Ok(PasswordHash::Md5(text.to_ascii_lowercase())))
    }

    /// How it is named in messages.
    pub fn kind(&self) -> &'static str {
        match self {
            PasswordHash::Scram(_) => "a SCRAM-SHA-256 verifier",
            PasswordHash::Md5(_) => "an md5 hash",
        }
    }
}

fn parse_scram(rest: &str) -> Result<ScramVerifier, String> {
    let malformed = || format!("is not a SCRAM-SHA-256 verifier: expected {SCRAM_FORM}");
    let (params, keys) = rest.split_once('$').ok_or_else(malformed)?;
    let (iterations, salt) = params.split_once(':').ok_or_else(malformed)?;
    let (stored, server) = keys.split_once(':').ok_or_else(malformed)?;
    let iterations = iterations
        .parse::<u32>()
        .ok()
        .filter(|i| *i > 0)
        .ok_or_else(|| {
            "the SCRAM-SHA-256 verifier's iteration count is not a whole number from 1 to 4294967295"
                .to_owned()
        })?;
    let salt = B64
        .decode(salt)
        .ok()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            "the SCRAM-SHA-256 verifier's salt is not base64 (or is empty)".to_owned()
        })?;
    let key = |b64: &str, name: &str| -> Result<[u8; 32], String> {
        let bytes = B64
            .decode(b64)
            .map_err(|_| format!("the SCRAM-SHA-256 verifier's {name} is not base64"))?;
        let len = bytes.len();
        bytes.try_into().map_err(|_| {
            format!("the SCRAM-SHA-256 verifier's {name} is {len} bytes; a SHA-256 key is 32")
        })
    };
    Ok(ScramVerifier {
        iterations,
        salt,
        stored_key: key(stored, "StoredKey")?,
        server_key: key(server, "ServerKey")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The verifier PostgreSQL stores for the password "secret" with this
    /// salt (computed with Python's hashlib).
    const PG_VERIFIER: &str = "SCRAM-SHA-256$4096:3Gzs3CMeVwGOnDpOPN0t1w==$\
        IzrC80OShm1c9hPUIu//DMHJilWT3RDB5PkKtTzQ7X0=:aeom++Gc31b0VaQjEwZCJMCTTuItEBoTrxO6LjkwbTU=";

    fn verifier(iterations: &str, salt: &str, stored: &str, server: &str) -> String {
        format!("SCRAM-SHA-256${iterations}:{salt}${stored}:{server}")
    }

    #[test]
    fn a_verifier_is_decoded() {
        let Some(Ok(PasswordHash::Scram(v))) = PasswordHash::detect(PG_VERIFIER) else {
            panic!("not read as a verifier");
        };
        assert_eq!(v.iterations, 4096);
        assert_eq!(v.salt.len(), 16);
        assert_eq!(&v.stored_key[..3], &[35, 58, 194]);
        assert_eq!(&v.server_key[..3], &[105, 234, 38]);
        assert!(!format!("{:?}", PasswordHash::Scram(v)).contains("4096"));
    }

    #[test]
    fn md5_hashes_and_passwords_are_told_apart() {
        let hash = "md5A3556571E93B0D20722BA62BE61E8C2D";
        assert_eq!(
            PasswordHash::detect(hash),
            Some(Ok(PasswordHash::Md5(hash.to_ascii_lowercase())))
        );
        for password in [
            "secret",
            "",
            "md5",
            "md5a3556571e93b0d20722ba62be61e8c2",   // 31 digits
            "md5a3556571e93b0d20722ba62be61e8c2dd", // 33
            "md5a3556571e93b0d20722ba62be61e8c2g",  // not hex
            "scram-sha-256$4096:x$y:z",             // the prefix is case-sensitive
            "SCRAM-SHA-256",
        ] {
            assert_eq!(PasswordHash::detect(password), None, "{password:?}");
        }
    }

    #[test]
    fn malformed_verifiers_say_what_is_wrong() {
        let key = B64.encode([7u8; 32]);
        let short = B64.encode([7u8; 31]);
        let salt = "c2FsdA==";
        let cases = [
            (
                "SCRAM-SHA-256$".to_owned(),
                "expected SCRAM-SHA-256$<iterations>",
            ),
            (
                format!("SCRAM-SHA-256$4096:{salt}"),
                "expected SCRAM-SHA-256$<iterations>",
            ),
            (
                format!("SCRAM-SHA-256$4096:{salt}${key}"),
                "expected SCRAM-SHA-256$<iterations>",
            ),
            (verifier("0", salt, &key, &key), "iteration count"),
            (verifier("-1", salt, &key, &key), "iteration count"),
            (verifier("4096x", salt, &key, &key), "iteration count"),
            (verifier("4294967296", salt, &key, &key), "iteration count"),
            (
                verifier("4096", "not base64!", &key, &key),
                "salt is not base64",
            ),
            (
                verifier("4096", "", &key, &key),
                "salt is not base64 (or is empty)",
            ),
            (
                verifier("4096", salt, "%%%", &key),
                "StoredKey is not base64",
            ),
            (
                verifier("4096", salt, &key, "%%%"),
                "ServerKey is not base64",
            ),
            (
                verifier("4096", salt, &short, &key),
                "StoredKey is 31 bytes",
            ),
            (verifier("4096", salt, &key, ""), "ServerKey is 0 bytes"),
        ];
        for (text, want) in cases {
            match PasswordHash::detect(&text) {
                Some(Err(why)) => {
                    assert!(why.contains(want), "{text}: {why}");
                    assert!(!why.contains(&key), "the text is not quoted: {why}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        assert!(matches!(
            PasswordHash::detect(&verifier("1", salt, &key, &key)),
            Some(Ok(PasswordHash::Scram(_)))
        ));
    }
}
