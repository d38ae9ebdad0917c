//! Which topology read from etcd to believe. Anyone who can write the
//! etcd prefix can `put` a topology; only the elected leader can write one
//! in its own lease-bound transaction, and that is what a reader checks.
//! Pure: the reads it needs are `elected`'s.
//!
//! The leader's publishing transaction (`etcd::guarded_put_request`)
//! holds on its candidate key's create revision and, besides the topology
//! (a key without a lease), puts its candidate key again with its own
//! lease. Every put of one transaction carries the same revision, so the
//! topology's mod revision is also the leader key's. The published value
//! records the leader's lease and its candidate key's create revision. A
//! reader ranges the election prefix at the topology's mod revision and
//! accepts the topology only if, at that revision, the leader (the key
//! with the lowest create revision under `<election>/`, as etcd's election
//! API says)
//!
//! * was last written at that very revision (a direct `put` of the
//!   topology leaves the leader key's revision behind),
//! * is bound to the lease its name gives (`<election>/<lease hex>`): a
//!   transaction that rewrote it with another lease is refused,
//! * is the candidate the value names (lease, create revision), and its
//!   value is the instance the topology names as its writer (`by`).
//!
//! Why the topology key carries no lease itself: a key attached to the
//! leader's lease is deleted when that lease expires, so a dead leader
//! would take the last topology with it, and with it the epoch and the
//! failover duties (`stage = "promoting"`, `followers_pending`) the next
//! leader must finish, for every instance that starts afterwards. The
//! check above needs no lease on the topology: it reads the election as
//! it was when the topology was written (etcd keeps that history until it
//! is compacted; then the election as it is now stands in, which holds
//! while the leader that wrote the topology still leads, and each new
//! leader writes the topology again under its own lease as it takes the
//! lead).
//!
//! What it cannot stop: a writer of the prefix who attaches the leader's
//! own lease to a transaction shaped like the leader's, or who deletes the
//! candidate keys and campaigns itself. Against those, etcd's
//! authentication (`etcd_user`, a role limited to the prefix) is the
//! guard.

use crate::etcd::{candidate_key, Kv};
use crate::published::Published;

/// Why a topology is refused; `None` when the leader wrote it.
pub fn refusal(election: &str, topology: &Kv, p: &Published, candidates: &[Kv]) -> Option<String> {
    let prefix = format!("{election}/");
    let at = topology.mod_revision;
    let Some(leader) = candidates
        .iter()
        .filter(|c| c.create_revision > 0 && c.key.starts_with(&prefix))
        .min_by_key(|c| c.create_revision)
    else {
        return Some(format!(
            "no instance led (no key under {prefix}) at revision {at}, when it was written"
        ));
    };
    let leader_name = String::from_utf8_lossy(&leader.value);
    if leader.mod_revision != at {
        return Some(format!(
            "not written in the leader's transaction: the leader key {} ({leader_name}) was last \
             written at revision {}, the topology at {at}",
            leader.key, leader.mod_revision
        ));
    }
    if leader.lease == 0 || leader.key != candidate_key(election, leader.lease) {
        return Some(format!(
            "the leader key {} was rewritten with lease {:x}, not the lease its name gives",
            leader.key, leader.lease
        ));
    }
    if p.leader_lease != Some(leader.lease) || p.leader_revision != Some(leader.create_revision) {
        return Some(format!(
            "it records lease {} and candidate revision {}, the leader's are {:x} and {}",
            p.leader_lease.map_or("none".into(), |l| format!("{l:x}")),
            p.leader_revision.map_or("none".into(), |r| r.to_string()),
            leader.lease,
            leader.create_revision
        ));
    }
    if p.by.as_bytes() != leader.value.as_slice() {
        return Some(format!(
            "it names {:?} as its writer, the leader is {leader_name:?}",
            p.by
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::published::Stage;

    const ELECTION: &str = "/f/c/leader";

    fn kv(key: &str, value: &str, create: i64, modified: i64, lease: i64) -> Kv {
        Kv {
            key: key.into(),
            value: value.as_bytes().to_vec(),
            create_revision: create,
            mod_revision: modified,
            lease,
        }
    }

    /// Two candidates: `a` (lease 0x2a, created at 5) leads, `b` (lease
    /// 0x2b, created at 8) waits. `a` last wrote its key at `a_mod`.
    fn election(a_mod: i64) -> Vec<Kv> {
        vec![
            kv("/f/c/leader/2b", "b", 8, 8, 0x2b),
            kv("/f/c/leader/2a", "a", 5, a_mod, 0x2a),
        ]
    }

    /// What `a` publishes at `at`.
    fn published(by: &str, lease: Option<i64>, created: Option<i64>) -> Published {
        Published {
            epoch: 2,
            primary: Some("127.0.0.1:5433".into()),
            stage: Stage::Promoting,
            by: by.into(),
            leader_lease: lease,
            leader_revision: created,
            ..Default::default()
        }
    }

    fn topology(at: i64, lease: i64) -> Kv {
        kv("/f/c/topology", "{}", 3, at, lease)
    }

    #[test]
    fn the_leader_s_own_transaction_is_accepted() {
        let p = published("a", Some(0x2a), Some(5));
        assert_eq!(refusal(ELECTION, &topology(12, 0), &p, &election(12)), None);
    }

    #[test]
    fn a_direct_put_is_refused() {
        // etcdctl put /f/c/topology '{"epoch":2,...}' at revision 13: the
        // leader key stays at 12. Copying the leader's lease and revision
        // into the value does not help.
        for p in [
            published("a", None, None),
            published("a", Some(0x2a), Some(5)),
        ] {
            let why = refusal(ELECTION, &topology(13, 0), &p, &election(12)).unwrap();
            assert!(
                why.contains("not written in the leader's transaction"),
                "{why}"
            );
            assert!(why.contains("/f/c/leader/2a"), "{why}");
        }
    }

    #[test]
    fn a_put_with_the_attacker_s_lease_is_refused() {
        // etcdctl put --lease=77 /f/c/topology ...: the topology carries a
        // lease, but not the leader's transaction.
        let p = published("a", Some(0x77), Some(5));
        assert!(refusal(ELECTION, &topology(13, 0x77), &p, &election(12)).is_some());
        // A transaction that also rewrites the leader key, with its own
        // lease 0x77.
        let rewritten = vec![kv("/f/c/leader/2a", "a", 5, 13, 0x77)];
        let why = refusal(ELECTION, &topology(13, 0x77), &p, &rewritten).unwrap();
        assert!(why.contains("not the lease its name gives"), "{why}");
        // A transaction with its own candidate key (lease 0x77, created
        // now): it does not lead, a lower create revision does.
        let mut own = election(12);
        own.push(kv("/f/c/leader/77", "a", 13, 13, 0x77));
        let p = published("a", Some(0x77), Some(13));
        let why = refusal(ELECTION, &topology(13, 0x77), &p, &own).unwrap();
        assert!(
            why.contains("not written in the leader's transaction"),
            "{why}"
        );
    }

    #[test]
    fn the_waiting_candidate_cannot_publish() {
        // `b` writes its own key and the topology in one transaction: its
        // key is not the leader's.
        let mut e = election(12);
        e[0].mod_revision = 13;
        let p = published("b", Some(0x2b), Some(8));
        assert!(refusal(ELECTION, &topology(13, 0), &p, &e).is_some());
    }

    #[test]
    fn the_value_must_name_the_leader() {
        let wrong_lease = published("a", Some(0x2b), Some(5));
        let why = refusal(ELECTION, &topology(12, 0), &wrong_lease, &election(12)).unwrap();
        assert!(why.contains("records lease 2b"), "{why}");
        let wrong_revision = published("a", Some(0x2a), Some(4));
        assert!(refusal(ELECTION, &topology(12, 0), &wrong_revision, &election(12)).is_some());
        let wrong_writer = published("b", Some(0x2a), Some(5));
        let why = refusal(ELECTION, &topology(12, 0), &wrong_writer, &election(12)).unwrap();
        assert!(why.contains("names \"b\" as its writer"), "{why}");
    }

    #[test]
    fn nobody_leading_means_nobody_wrote_it() {
        let p = published("a", Some(0x2a), Some(5));
        let why = refusal(ELECTION, &topology(12, 0), &p, &[]).unwrap();
        assert!(why.contains("no instance led"), "{why}");
        // Keys outside the election do not count.
        let stray = vec![kv("/f/c/leaderboard", "a", 1, 12, 0x2a)];
        assert!(refusal(ELECTION, &topology(12, 0), &p, &stray).is_some());
    }
}
