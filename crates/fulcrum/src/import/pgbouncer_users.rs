//! The auth file's users in `fulcrum import pgbouncer`: clear-text
//! passwords, SCRAM secrets and md5 hashes become `[[cluster.user]]`
//! entries wherever the cluster's `client_auth` can check them (Fulcrum
//! passes a SCRAM secret or md5 hash through to the servers as PgBouncer
//! does); the others are named in a note with the reason. Pure.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use fulcrum_config::PasswordHash;

/// What the users section of the result needs.
pub(super) struct Carried {
    /// The `[[cluster.user]]` tables.
    pub lines: String,
    pub count: usize,
    /// `client_auth`, which a file of SCRAM secrets may have changed.
    pub client_auth: &'static str,
    /// `health_user` and `health_password` lines, when no carried user has
    /// a password the health probe could log in with.
    pub health: String,
}

enum Kind {
    Plain,
    Hash(PasswordHash),
    Malformed(String),
}

fn kind(password: &str) -> Kind {
    match PasswordHash::detect(password) {
        None => Kind::Plain,
        Some(Ok(hash)) => Kind::Hash(hash),
        Some(Err(why)) => Kind::Malformed(why),
    }
}

/// The users of the auth file under PgBouncer's `auth_type`, read as
/// `asked`; `auth_user` says whether an `auth_user` with a password is
/// carried (the health probe's default login then). A carried user's
/// `[users]` pool lines (`pools`, by name) follow its password; those left
/// in `pools` belong to no carried user.
pub(super) fn carry(
    users: &[(String, String)],
    asked: &'static str,
    auth_user: bool,
    pools: &mut BTreeMap<String, Vec<String>>,
    notes: &mut Vec<String>,
) -> Carried {
    let kinds: Vec<Kind> = users.iter().map(|(_, p)| kind(p)).collect();
    let scram = kinds
        .iter()
        .any(|k| matches!(k, Kind::Hash(PasswordHash::Scram(_))));
    let md5 = kinds
        .iter()
        .any(|k| matches!(k, Kind::Hash(PasswordHash::Md5(_))));
    // PgBouncer's md5 runs SCRAM for a user stored as SCRAM; Fulcrum asks
    // every client of a cluster the same method, which clear-text
    // passwords pass too.
    let client_auth = if asked == "md5" && scram && !md5 {
        notes.push("auth_type = md5 with SCRAM secrets in the auth file (PgBouncer runs SCRAM for those users): Fulcrum asks every client one method; took scram-sha-256, which clear-text passwords pass too".into());
        "scram-sha-256"
    } else {
        asked
    };
    let mut carried = Carried {
        lines: String::new(),
        count: 0,
        client_auth,
        health: String::new(),
    };
    let (mut plain, mut first) = (false, None);
    for ((name, password), kind) in users.iter().zip(&kinds) {
        let refusal = match kind {
            Kind::Plain => None,
            Kind::Malformed(why) => Some(format!("its SCRAM secret is malformed: {why}")),
            // hba: the file's lines pick the method per connection; a
            // line the hash cannot serve refuses that login (28P01).
            Kind::Hash(PasswordHash::Scram(_)) => match client_auth {
                "scram-sha-256" | "hba" => None,
                "md5" => Some("the auth file holds a SCRAM secret, which client_auth = \"md5\" cannot check (PgBouncer runs SCRAM for it; Fulcrum asks every client one method, and the md5 hashes of other users need md5): store its password as md5, or the others' as SCRAM".to_owned()),
                other => Some(format!("the auth file holds a SCRAM secret: Fulcrum logs in to the servers with the keys a client proves by SCRAM, which client_auth = {other:?} never runs")),
            },
            Kind::Hash(PasswordHash::Md5(_)) => (client_auth == "scram-sha-256").then(|| {
                "the auth file holds an md5 hash, which SCRAM cannot check (nor can PgBouncer's scram-sha-256)".to_owned()
            }),
        };
        if let Some(why) = refusal {
            notes.push(format!("user {name:?}: {why}; left out"));
            continue;
        }
        plain |= matches!(kind, Kind::Plain);
        first.get_or_insert(name.as_str());
        carried.count += 1;
        let _ = writeln!(
            carried.lines,
            "\n[[cluster.user]]\nname = {}\npassword = {}",
            super::pgbouncer::quote(name),
            super::pgbouncer::quote(password)
        );
        for line in pools.remove(name).unwrap_or_default() {
            let _ = writeln!(carried.lines, "{line}");
        }
    }
    if carried.count > 0 && !plain && !auth_user {
        notes.push("every user carried over has a SCRAM secret or md5 hash, with which the health probe cannot log in (it runs before any client): health_password is read from the environment variable FULCRUM_HEALTH_PASSWORD; set it, or set health_user and health_password to a login with a password".into());
        let _ = writeln!(
            carried.health,
            "health_user = {}\nhealth_password = {{ env = \"FULCRUM_HEALTH_PASSWORD\" }}",
            super::pgbouncer::quote(first.unwrap_or_default())
        );
    }
    carried
}

#[cfg(test)]
mod tests {
    use super::*;

    const VERIFIER: &str = "SCRAM-SHA-256$4096:3Gzs3CMeVwGOnDpOPN0t1w==$\
        IzrC80OShm1c9hPUIu//DMHJilWT3RDB5PkKtTzQ7X0=:aeom++Gc31b0VaQjEwZCJMCTTuItEBoTrxO6LjkwbTU=";
    const MD5: &str = "md5a3556571e93b0d20722ba62be61e8c2d";

    fn users(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, p)| (n.to_string(), p.to_string()))
            .collect()
    }

    #[test]
    fn scram_secrets_are_kept_and_md5_becomes_scram_when_nothing_needs_md5() {
        let mut notes = Vec::new();
        let u = users(&[("app", VERIFIER), ("ops", "ops-pw")]);
        let c = carry(&u, "md5", false, &mut Default::default(), &mut notes);
        assert_eq!((c.count, c.client_auth), (2, "scram-sha-256"));
        assert!(
            c.lines
                .contains(&format!("name = \"app\"\npassword = \"{VERIFIER}\"")),
            "{}",
            c.lines
        );
        assert!(c.health.is_empty(), "ops has a password: {}", c.health);
        assert!(notes[0].contains("took scram-sha-256"), "{notes:?}");
    }

    #[test]
    fn a_hash_the_method_cannot_check_is_left_out_with_the_reason() {
        let mut notes = Vec::new();
        let u = users(&[("s", VERIFIER), ("m", MD5), ("bad", "SCRAM-SHA-256$x")]);
        let c = carry(&u, "md5", false, &mut Default::default(), &mut notes);
        assert_eq!((c.count, c.client_auth), (1, "md5"), "{notes:?}");
        assert!(c.lines.contains("name = \"m\""), "{}", c.lines);
        let notes = notes.join("\n");
        assert!(
            notes.contains("user \"s\": the auth file holds a SCRAM secret, which client_auth = \"md5\" cannot check"),
            "{notes}"
        );
        assert!(
            notes.contains("user \"bad\": its SCRAM secret is malformed"),
            "{notes}"
        );
        let mut notes = Vec::new();
        let c = carry(
            &u,
            "scram-sha-256",
            true,
            &mut Default::default(),
            &mut notes,
        );
        assert_eq!(c.count, 1);
        assert!(c.lines.contains("name = \"s\""), "{}", c.lines);
        assert!(c.health.is_empty(), "auth_user is the probe's login");
        assert!(
            notes
                .join("\n")
                .contains("user \"m\": the auth file holds an md5 hash"),
            "{notes:?}"
        );
        let mut notes = Vec::new();
        let c = carry(&u, "trust", false, &mut Default::default(), &mut notes);
        assert_eq!(c.count, 1, "trust takes the md5 hash only");
        assert!(c.lines.contains("name = \"m\""), "{}", c.lines);
    }

    #[test]
    fn with_only_hashes_the_health_password_comes_from_the_environment() {
        let mut notes = Vec::new();
        let c = carry(
            &users(&[("app", VERIFIER)]),
            "scram-sha-256",
            false,
            &mut Default::default(),
            &mut notes,
        );
        assert_eq!(
            c.health,
            "health_user = \"app\"\nhealth_password = { env = \"FULCRUM_HEALTH_PASSWORD\" }\n"
        );
        assert!(notes.join("\n").contains("FULCRUM_HEALTH_PASSWORD"));
    }
}
