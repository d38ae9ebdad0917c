//! The topology the etcd leader publishes for every instance: the primary,
//! the replicas, and an epoch that only grows. Encoded as JSON under
//! `<etcd_prefix>/<cluster>/topology`. Pure.

use serde::{Deserialize, Serialize};

/// Where a published decision stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// The leader is promoting `primary`: nobody writes until it is
    /// `ready`. A next leader finishes this promotion, never another one
    /// for the same epoch.
    Promoting,
    /// `primary` takes writes.
    #[default]
    Ready,
}

/// One published decision.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    pub epoch: u64,
    /// The primary's address as configured (`[[cluster.backend]] address`).
    pub primary: Option<String>,
    #[serde(default)]
    pub replicas: Vec<String>,
    pub stage: Stage,
    /// The instance that published it.
    pub by: String,
    /// When, in milliseconds since the Unix epoch (for people reading etcd).
    #[serde(default)]
    pub at_ms: u64,
    /// The first transaction id the new primary had not handed out when
    /// it was promoted (PostgreSQL): every instance resolves a COMMIT in
    /// flight at the failover against it (docs/failover.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_floor: Option<u64>,
    /// The primary this decision replaces (a failover), as configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<String>,
    /// The failover's duties not yet done, so that a next leader does
    /// them if this one dies: replicas still to re-point at `primary`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub followers_pending: Vec<String>,
    /// `failover_command` still to run for this failover.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub command_pending: bool,
    /// The lease of the leader that wrote it, and its candidate key's
    /// create revision: set by [`crate::Elected::publish`], checked by
    /// every reader against the election (`proof`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_lease: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_revision: Option<i64>,
}

impl Published {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a Published serializes")
    }

    pub fn decode(bytes: &[u8]) -> Result<Published, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("not a published topology: {e}"))
    }

    /// Whether `self`, just read, may replace `seen`: an instance never
    /// goes back to a lower epoch.
    pub fn supersedes(&self, seen: Option<&Published>) -> bool {
        seen.is_none_or(|s| self.epoch >= s.epoch)
    }
}

/// Milliseconds since the Unix epoch now.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(epoch: u64, stage: Stage) -> Published {
        Published {
            epoch,
            primary: Some("127.0.0.1:5433".into()),
            replicas: vec!["127.0.0.1:5434".into()],
            stage,
            by: "a".into(),
            at_ms: 1,
            commit_floor: None,
            replaces: None,
            followers_pending: Vec::new(),
            command_pending: false,
            leader_lease: None,
            leader_revision: None,
        }
    }

    #[test]
    fn round_trips_through_json() {
        let p = at(3, Stage::Promoting);
        let text = String::from_utf8(p.encode()).unwrap();
        assert!(text.contains("\"stage\":\"promoting\""), "{text}");
        assert_eq!(Published::decode(text.as_bytes()).unwrap(), p);
        assert!(Published::decode(b"{\"epoch\":1}").is_err());
        // What a failover leaves to do travels with it, and is left out
        // once done.
        let mut f = at(4, Stage::Ready);
        f.replaces = Some("127.0.0.1:5432".into());
        f.followers_pending = vec!["127.0.0.1:5435".into()];
        f.command_pending = true;
        let text = String::from_utf8(f.encode()).unwrap();
        assert!(
            text.contains("\"followers_pending\":[\"127.0.0.1:5435\"]")
                && text.contains("\"command_pending\":true"),
            "{text}"
        );
        assert_eq!(Published::decode(text.as_bytes()).unwrap(), f);
        assert!(!String::from_utf8(at(4, Stage::Ready).encode())
            .unwrap()
            .contains("pending"));
    }

    #[test]
    fn a_lower_epoch_never_supersedes() {
        let seen = at(5, Stage::Ready);
        assert!(at(5, Stage::Ready).supersedes(Some(&seen)));
        assert!(at(6, Stage::Promoting).supersedes(Some(&seen)));
        assert!(!at(4, Stage::Ready).supersedes(Some(&seen)));
        assert!(at(1, Stage::Ready).supersedes(None));
    }
}
