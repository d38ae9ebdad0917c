//! `topology = "patroni"`: Fulcrum follows Patroni and never promotes. Each
//! health round reads `GET /cluster` from the first Patroni REST endpoint
//! that answers (roles, states, lag, timeline) and names the running
//! leader as the only possible primary; SWITCHOVER in the console becomes
//! Patroni's `POST /switchover`. Parsing is pure and tested with Patroni's
//! JSON.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::http::{self, Endpoint};
use crate::published::{Published, Stage};
use crate::{CoordError, Verdict};

/// One member as Patroni reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    /// `leader`, `replica`, `sync_standby`, `standby_leader`, ...
    pub role: String,
    /// `running`, `streaming`, `stopped`, `starting`, ...
    pub state: String,
    /// `host:port` of its PostgreSQL.
    pub address: String,
    pub timeline: Option<u64>,
    /// Bytes behind the leader (replicas).
    pub lag: Option<u64>,
}

impl Member {
    /// Patroni's running leader.
    pub fn is_primary(&self) -> bool {
        self.role == "leader" && self.state == "running"
    }

    /// A replica Patroni reports running (Patroni 3.0 says `running`,
    /// later versions `streaming` or `in archive recovery`); `stopped`,
    /// `starting`, `crashed`, `creating replica`, ... serve no reads.
    pub fn serves_reads(&self) -> bool {
        matches!(
            self.state.as_str(),
            "running" | "streaming" | "in archive recovery"
        )
    }
}

/// Reads a `GET /cluster` answer.
pub fn parse_cluster(body: &[u8]) -> Result<Vec<Member>, CoordError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| CoordError::Patroni(format!("GET /cluster: not JSON ({e})")))?;
    let members = v["members"]
        .as_array()
        .ok_or_else(|| CoordError::Patroni("GET /cluster: no members".into()))?;
    Ok(members
        .iter()
        .map(|m| Member {
            name: m["name"].as_str().unwrap_or("").to_owned(),
            role: m["role"].as_str().unwrap_or("").to_owned(),
            state: m["state"].as_str().unwrap_or("").to_owned(),
            address: format!(
                "{}:{}",
                m["host"].as_str().unwrap_or(""),
                m["port"].as_u64().unwrap_or(5432)
            ),
            timeline: m["timeline"].as_u64(),
            lag: m["lag"].as_u64(),
        })
        .collect())
}

#[derive(Debug, Default)]
struct State {
    members: Vec<Member>,
    last_heard: Option<Instant>,
    last_error: Option<String>,
    /// Changes with each new leader, so the console and metrics show an
    /// epoch as with etcd (Patroni's own timeline when it reports one).
    epoch: u64,
}

pub struct Followed {
    endpoints: Vec<Endpoint>,
    timeout: Duration,
    state: Mutex<State>,
    cluster: String,
}

const CALL_TIMEOUT: Duration = Duration::from_secs(2);

impl Followed {
    pub fn new(cluster: &str, settings: &fulcrum_config::Patroni) -> Followed {
        Followed {
            endpoints: settings
                .endpoints
                .iter()
                .map(|u| Endpoint {
                    address: u.trim_start_matches("http://").to_owned(),
                    tls: None,
                })
                .collect(),
            timeout: settings.timeout,
            state: Mutex::new(State::default()),
            cluster: cluster.to_owned(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads `GET /cluster` from the first endpoint that answers.
    pub async fn refresh(&self) {
        let mut last = None;
        for endpoint in &self.endpoints {
            match http::call(endpoint, "GET", "/cluster", None, None, CALL_TIMEOUT).await {
                Ok(a) if a.status == 200 => match parse_cluster(&a.body) {
                    Ok(members) => {
                        self.take(members);
                        return;
                    }
                    Err(e) => last = Some(e),
                },
                Ok(a) => {
                    last = Some(CoordError::Patroni(format!(
                        "{}/cluster: HTTP {}",
                        endpoint.address, a.status
                    )))
                }
                Err(e) => last = Some(e),
            }
        }
        let e = last.unwrap_or_else(|| CoordError::Patroni("no endpoint".into()));
        let mut s = self.state();
        if s.last_error.as_deref() != Some(&e.to_string()) {
            tracing::warn!(cluster = %self.cluster, error = %e, "cannot read Patroni's cluster state");
        }
        s.last_error = Some(e.to_string());
    }

    fn take(&self, members: Vec<Member>) {
        let mut s = self.state();
        let before = s
            .members
            .iter()
            .find(|m| m.is_primary())
            .map(|m| m.address.clone());
        let now = members.iter().find(|m| m.is_primary());
        if now.map(|m| &m.address) != before.as_ref() {
            tracing::warn!(cluster = %self.cluster, leader = ?now.map(|m| &m.name), primary = ?now.map(|m| &m.address), "Patroni names a new primary");
            let timeline = now.and_then(|m| m.timeline).unwrap_or(0);
            s.epoch = timeline.max(s.epoch + 1);
        }
        s.members = members;
        s.last_heard = Some(Instant::now());
        s.last_error = None;
    }

    pub fn verdict(&self, now: Instant) -> Verdict {
        let s = self.state();
        let cut_off = s
            .last_heard
            .is_none_or(|t| now.saturating_duration_since(t) > self.timeout);
        let leader = s.members.iter().find(|m| m.is_primary());
        Verdict {
            published: Some(Published {
                epoch: s.epoch,
                primary: leader.map(|m| m.address.clone()),
                replicas: s
                    .members
                    .iter()
                    .filter(|m| !m.is_primary())
                    .map(|m| m.address.clone())
                    .collect(),
                stage: Stage::Ready,
                by: "patroni".into(),
                at_ms: 0,
                commit_floor: None,
                ..Default::default()
            })
            .filter(|_| s.last_heard.is_some()),
            leading: false,
            leader: leader.map(|m| m.name.clone()),
            cut_off,
            last_heard: s.last_heard,
            valid_until: s.last_heard.map(|t| t + self.timeout),
            last_error: s.last_error.clone(),
            members: s.members.clone(),
        }
    }

    /// Asks Patroni to switch over to the member serving `address`.
    pub async fn switchover(&self, address: &str) -> Result<String, CoordError> {
        self.refresh().await;
        let (leader, candidate) = {
            let s = self.state();
            let leader = s
                .members
                .iter()
                .find(|m| m.is_primary())
                .map(|m| m.name.clone());
            let candidate = s
                .members
                .iter()
                .find(|m| m.address == address)
                .map(|m| m.name.clone());
            (leader, candidate)
        };
        let leader =
            leader.ok_or_else(|| CoordError::Patroni("Patroni names no running leader".into()))?;
        let candidate = candidate
            .ok_or_else(|| CoordError::Patroni(format!("Patroni has no member at {address}")))?;
        let body =
            serde_json::to_vec(&json!({"leader": leader, "candidate": candidate})).expect("JSON");
        let mut last = CoordError::Patroni("no endpoint".into());
        for endpoint in &self.endpoints {
            match http::call(
                endpoint,
                "POST",
                "/switchover",
                Some(body.clone()),
                None,
                Duration::from_secs(60),
            )
            .await
            {
                Ok(a) if a.status == 200 => {
                    self.refresh().await;
                    return Ok(String::from_utf8_lossy(&a.body).into_owned());
                }
                Ok(a) => {
                    return Err(CoordError::Patroni(format!(
                        "Patroni refused the switchover (HTTP {}): {}",
                        a.status,
                        String::from_utf8_lossy(&a.body).trim()
                    )))
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: &str = r#"{"members": [
        {"name": "pg0", "role": "leader", "state": "running", "api_url": "http://127.0.0.1:8008/patroni", "host": "127.0.0.1", "port": 5433, "timeline": 3},
        {"name": "pg1", "role": "replica", "state": "streaming", "api_url": "http://127.0.0.1:8009/patroni", "host": "127.0.0.1", "port": 5434, "timeline": 3, "lag": 128}
    ], "scope": "demo"}"#;

    #[test]
    fn reads_roles_addresses_and_lag() {
        let m = parse_cluster(CLUSTER.as_bytes()).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(
            (m[0].address.as_str(), m[0].role.as_str()),
            ("127.0.0.1:5433", "leader")
        );
        assert!(m[0].is_primary());
        assert_eq!((m[1].lag, m[1].timeline), (Some(128), Some(3)));
        assert!(!m[1].is_primary());
        assert!(parse_cluster(b"{}").is_err());
    }

    #[test]
    fn a_stopped_leader_is_no_primary_and_a_new_one_moves_the_epoch() {
        let f = Followed::new(
            "c",
            &fulcrum_config::Patroni {
                endpoints: vec!["http://127.0.0.1:1".into()],
                timeout: Duration::from_secs(5),
                on_loss: fulcrum_config::CoordinatorLoss::Hold,
            },
        );
        assert!(f.verdict(Instant::now()).cut_off, "never heard: cut off");
        f.take(parse_cluster(CLUSTER.as_bytes()).unwrap());
        let v = f.verdict(Instant::now());
        let p = v.published.unwrap();
        assert_eq!((p.primary.as_deref(), p.epoch), (Some("127.0.0.1:5433"), 3));
        assert!(!v.cut_off);
        let stopped = CLUSTER.replace("\"state\": \"running\"", "\"state\": \"stopped\"");
        f.take(parse_cluster(stopped.as_bytes()).unwrap());
        let p = f.verdict(Instant::now()).published.unwrap();
        assert_eq!((p.primary, p.epoch), (None, 4));
        let later = Instant::now() + Duration::from_secs(6);
        assert!(f.verdict(later).cut_off, "silent past patroni_timeout");
    }
}
