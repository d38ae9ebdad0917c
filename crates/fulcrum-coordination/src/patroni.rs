//! `topology = "patroni"`: Fulcrum follows Patroni and never promotes. Each
//! health round reads `GET /cluster` from the first Patroni REST endpoint
//! that answers (roles, states, lag, timeline) and names the running
//! leader as the only possible primary; SWITCHOVER in the console becomes
//! Patroni's `POST /switchover`. Endpoints are `http://` or `https://`
//! (checked against `patroni_tls_ca`); with `patroni_user` every request
//! carries HTTP basic authentication (Patroni's `restapi.authentication`
//! guards its unsafe endpoints, `/switchover` among them). Parsing is pure
//! and tested with Patroni's JSON.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::{json, Value};

use fulcrum_tls::rustls::ClientConfig;

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
    /// `Basic ...` for `patroni_user` / `patroni_password`.
    authorization: Option<String>,
    /// `patroni_user`, for the error when Patroni refuses it.
    user: Option<String>,
    timeout: Duration,
    state: Mutex<State>,
    cluster: String,
}

const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The `Authorization` header of HTTP basic authentication (RFC 7617).
pub fn basic_authorization(user: &str, password: &str) -> String {
    format!("Basic {}", B64.encode(format!("{user}:{password}")))
}

/// Where a Patroni REST URL (`http://host:port` or `https://host:port`, as
/// validated) answers; `https://` goes over `tls`. An `https://` URL
/// without a TLS config (the config refuses that) is `None`: never plain
/// HTTP in its place.
fn endpoint(url: &str, tls: &Option<Arc<ClientConfig>>) -> Option<Endpoint> {
    match url.strip_prefix("https://") {
        Some(address) => Some(Endpoint {
            address: address.to_owned(),
            tls: Some(tls.clone()?),
        }),
        None => Some(Endpoint {
            address: url.trim_start_matches("http://").to_owned(),
            tls: None,
        }),
    }
}

impl Followed {
    pub fn new(cluster: &str, settings: &fulcrum_config::Patroni) -> Followed {
        Followed {
            endpoints: settings
                .endpoints
                .iter()
                .filter_map(|u| {
                    let e = endpoint(u, &settings.tls);
                    if e.is_none() {
                        tracing::error!(cluster, endpoint = %u, "an https:// Patroni endpoint without patroni_tls_ca: not used");
                    }
                    e
                })
                .collect(),
            authorization: settings
                .user
                .as_ref()
                .map(|u| basic_authorization(u, &settings.password)),
            user: settings.user.clone(),
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
            match http::call(
                endpoint,
                "GET",
                "/cluster",
                None,
                self.authorization.as_deref(),
                CALL_TIMEOUT,
            )
            .await
            {
                Ok(a) if a.status == 200 => match parse_cluster(&a.body) {
                    Ok(members) => {
                        self.take(members);
                        return;
                    }
                    Err(e) => last = Some(e),
                },
                Ok(a) => last = Some(self.refused(endpoint, "GET /cluster", &a)),
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

    /// Patroni's answer other than 200 to `what`, naming `patroni_user`
    /// when it is an authentication refusal (401).
    fn refused(&self, endpoint: &Endpoint, what: &str, a: &http::Answer) -> CoordError {
        let body = String::from_utf8_lossy(&a.body);
        let body = body.trim();
        CoordError::Patroni(match (a.status, &self.user) {
            (401, Some(user)) => format!(
                "{}: Patroni refused patroni_user {user:?} for {what} (HTTP 401): {body}",
                endpoint.address
            ),
            (401, None) => format!(
                "{}: Patroni refused {what} (HTTP 401: its REST API wants authentication; \
                 set patroni_user and patroni_password): {body}",
                endpoint.address
            ),
            (status, _) => format!(
                "{}: Patroni refused {what} (HTTP {status}): {body}",
                endpoint.address
            ),
        })
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
                self.authorization.as_deref(),
                Duration::from_secs(60),
            )
            .await
            {
                Ok(a) if a.status == 200 => {
                    self.refresh().await;
                    return Ok(String::from_utf8_lossy(&a.body).into_owned());
                }
                Ok(a) => {
                    let e = self.refused(endpoint, "the switchover", &a);
                    tracing::error!(cluster = %self.cluster, error = %e, "Patroni refused the switchover");
                    return Err(e);
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
            &fulcrum_config::Patroni::plain(
                vec!["http://127.0.0.1:1".into()],
                Duration::from_secs(5),
                fulcrum_config::CoordinatorLoss::Hold,
            ),
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

    #[test]
    fn basic_authorization_is_rfc_7617() {
        // RFC 7617's own example.
        assert_eq!(
            basic_authorization("Aladdin", "open sesame"),
            "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
    }

    /// A local Patroni stand-in: answers `GET /cluster` with `CLUSTER`,
    /// anything else with `status`, and sends each request's head out.
    async fn patroni(
        status: &'static str,
    ) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (heads, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let mut request = vec![0u8; 8192];
                let n = s.read(&mut request).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&request[..n]).into_owned();
                let (status, body) = if head.starts_with("GET /cluster ") {
                    ("200 OK", CLUSTER)
                } else {
                    (status, "no auth header received")
                };
                let _ = heads.send(head);
                let answer = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
                let _ = s.shutdown().await;
            }
        });
        (url, rx)
    }

    fn settings(url: String, user: Option<&str>) -> fulcrum_config::Patroni {
        let mut p = fulcrum_config::Patroni::plain(
            vec![url],
            Duration::from_secs(5),
            fulcrum_config::CoordinatorLoss::Hold,
        );
        p.user = user.map(str::to_owned);
        p.password = "s3cret".into();
        p
    }

    #[tokio::test]
    async fn every_request_carries_basic_authentication_when_patroni_user_is_set() {
        let (url, mut heads) = patroni("200 OK").await;
        let f = Followed::new("c", &settings(url, Some("fulcrum")));
        f.switchover("127.0.0.1:5434").await.unwrap();
        let want = format!(
            "authorization: {}\r\n",
            basic_authorization("fulcrum", "s3cret")
        );
        let mut seen = Vec::new();
        while let Ok(head) = heads.try_recv() {
            seen.push(head.lines().next().unwrap_or("").to_owned());
            assert!(
                head.to_ascii_lowercase()
                    .contains(&want.to_ascii_lowercase()),
                "{head}"
            );
        }
        assert!(
            seen.iter().any(|l| l.starts_with("POST /switchover "))
                && seen.iter().any(|l| l.starts_with("GET /cluster ")),
            "{seen:?}"
        );
    }

    #[tokio::test]
    async fn no_credentials_no_header_and_a_401_says_what_to_set() {
        let (url, mut heads) = patroni("401 Unauthorized").await;
        let f = Followed::new("c", &settings(url.clone(), None));
        let e = f
            .switchover("127.0.0.1:5434")
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("HTTP 401") && e.contains("set patroni_user and patroni_password"),
            "{e}"
        );
        while let Ok(head) = heads.try_recv() {
            assert!(
                !head.to_ascii_lowercase().contains("authorization:"),
                "{head}"
            );
        }
        let f = Followed::new("c", &settings(url, Some("fulcrum")));
        let e = f
            .switchover("127.0.0.1:5434")
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("Patroni refused patroni_user \"fulcrum\" for the switchover (HTTP 401)"),
            "{e}"
        );
    }

    #[test]
    fn an_https_endpoint_never_falls_back_to_plain_http() {
        let none = None;
        assert!(endpoint("https://127.0.0.1:8008", &none).is_none());
        let e = endpoint("http://127.0.0.1:8008", &none).unwrap();
        assert_eq!(
            (e.address.as_str(), e.tls.is_none()),
            ("127.0.0.1:8008", true)
        );
    }
}
