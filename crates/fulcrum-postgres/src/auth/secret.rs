//! A password as PostgreSQL stores it (`pg_authid.rolpassword`, shown by
//! `pg_shadow.passwd`): a SCRAM-SHA-256 verifier, an md5 hash, or (very old
//! installations) the password itself. Parsed from `auth_query`'s answer,
//! or given as a `[[cluster.user]]` password (`fulcrum_config::PasswordHash`).

use fulcrum_config::{PasswordHash, ScramVerifier};

use super::scram::Verifier;

/// What `auth_query` returned for a user.
#[derive(Clone, PartialEq, Eq)]
pub enum StoredSecret {
    /// `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`.
    Scram(Verifier),
    /// `md5` followed by 32 hex digits: md5(password + user).
    Md5(String),
    /// Anything else is taken as the password itself.
    Plain(String),
}

impl std::fmt::Debug for StoredSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StoredSecret::Scram(_) => "Scram(<redacted>)",
            StoredSecret::Md5(_) => "Md5(<redacted>)",
            StoredSecret::Plain(_) => "Plain(<redacted>)",
        })
    }
}

impl StoredSecret {
    /// Reads a stored password; `None` for a text that starts like a SCRAM
    /// verifier but is malformed (not taken as a password either). The
    /// forms are told apart as the config tells them
    /// (`fulcrum_config::PasswordHash::detect`).
    pub fn parse(stored: &str) -> Option<StoredSecret> {
        // No password is no secret: refused as a configured user without
        // one is, never a login with an empty password.
        if stored.is_empty() {
            return None;
        }
        match PasswordHash::detect(stored) {
            None => Some(StoredSecret::Plain(stored.to_owned())),
            Some(Ok(hash)) => Some(hash.into()),
            Some(Err(_)) => None,
        }
    }
}

impl From<PasswordHash> for StoredSecret {
    fn from(hash: PasswordHash) -> StoredSecret {
        match hash {
            PasswordHash::Scram(v) => StoredSecret::Scram(Verifier::from(&v)),
            PasswordHash::Md5(h) => StoredSecret::Md5(h),
        }
    }
}

impl From<&ScramVerifier> for Verifier {
    fn from(v: &ScramVerifier) -> Verifier {
        Verifier {
            salt: v.salt.clone(),
            iterations: v.iterations,
            stored_key: v.stored_key,
            server_key: v.server_key,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD as B64;
    use base64::Engine;

    #[test]
    fn a_scram_verifier_reads_back_as_the_one_derived_from_the_password() {
        let v = Verifier::new("pencil", b"0123456789abcdef", 4096);
        let text = format!(
            "SCRAM-SHA-256${}:{}${}:{}",
            v.iterations,
            B64.encode(&v.salt),
            B64.encode(v.stored_key),
            B64.encode(v.server_key)
        );
        assert_eq!(StoredSecret::parse(&text), Some(StoredSecret::Scram(v)));
    }

    #[test]
    fn md5_and_plain_and_broken() {
        let md5 = "md5a3556571e93b0d20722ba62be61e8c2d";
        assert_eq!(
            StoredSecret::parse(md5),
            Some(StoredSecret::Md5(md5.into()))
        );
        assert_eq!(
            StoredSecret::parse("md5short"),
            Some(StoredSecret::Plain("md5short".into()))
        );
        assert_eq!(StoredSecret::parse("SCRAM-SHA-256$4096:xx"), None);
        assert_eq!(StoredSecret::parse("SCRAM-SHA-256$0:AAAA$AA:AA"), None);
        assert_eq!(StoredSecret::parse(""), None, "no password is no secret");
        assert!(!format!("{:?}", StoredSecret::parse(md5).unwrap()).contains("a355"));
    }
}
