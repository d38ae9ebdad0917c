//! A small client of etcd's v3 API over its JSON gateway (`/v3/...`,
//! etcd 3.4 and later): leases, a guarded put (the election), reads,
//! compare-and-swap writes (the leader's, bound to its candidate key:
//! `proof`), an election's candidates as of a revision, and watches. Tries each member in turn,
//! starting from the one that answered last. Requests are built and
//! answers read by pure functions (tested with the gateway's JSON).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::{json, Value};

use crate::http::{self, Endpoint};
use crate::CoordError;

/// How long one call to a member may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// One key's current version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub lease: i64,
}

/// This instance's key in the election: what a publication's transaction
/// holds on and writes again (`proof`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub key: String,
    /// Its value: this instance's name.
    pub me: String,
    pub lease: i64,
    pub created: i64,
}

pub struct EtcdClient {
    endpoints: Vec<Endpoint>,
    next: AtomicUsize,
    credentials: Option<(String, String)>,
    token: Mutex<Option<String>>,
}

impl EtcdClient {
    pub fn new(settings: &fulcrum_config::Etcd) -> EtcdClient {
        EtcdClient {
            endpoints: settings
                .endpoints
                .iter()
                .map(|a| Endpoint {
                    address: a.clone(),
                    tls: settings.tls.clone(),
                })
                .collect(),
            next: AtomicUsize::new(0),
            credentials: settings
                .user
                .clone()
                .map(|u| (u, settings.password.clone())),
            token: Mutex::new(None),
        }
    }

    /// Posts `body` to `path` on the first member that answers.
    async fn post(&self, path: &str, body: Value) -> Result<Value, CoordError> {
        let n = self.endpoints.len();
        let start = self.next.load(Ordering::Relaxed);
        let mut last = CoordError::Http("no etcd endpoint".into());
        for i in 0..n {
            let at = (start + i) % n;
            let endpoint = &self.endpoints[at];
            match self.post_to(endpoint, path, &body).await {
                Ok(v) => {
                    self.next.store(at, Ordering::Relaxed);
                    return Ok(v);
                }
                Err(e @ CoordError::Etcd(_)) => return Err(e),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    async fn post_to(
        &self,
        endpoint: &Endpoint,
        path: &str,
        body: &Value,
    ) -> Result<Value, CoordError> {
        let token = self.token(endpoint).await?;
        let bytes = serde_json::to_vec(body).expect("JSON values serialize");
        let answer = http::call(
            endpoint,
            "POST",
            path,
            Some(bytes),
            token.as_deref(),
            CALL_TIMEOUT,
        )
        .await?;
        let value: Value = serde_json::from_slice(&answer.body)
            .map_err(|e| CoordError::Http(format!("{}{path}: not JSON ({e})", endpoint.address)))?;
        if answer.status != 200 {
            let message = value
                .get("message")
                .or_else(|| value.get("error"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            if message.contains("token") {
                // An expired token: the next call authenticates again.
                *self.token.lock().unwrap_or_else(|e| e.into_inner()) = None;
            }
            let what = format!(
                "{}{path}: HTTP {}: {message}",
                endpoint.address, answer.status
            );
            // A 5xx is this member's trouble (no leader, leader changed,
            // timed out): the next member may answer. Anything else is
            // etcd's answer to the request itself.
            return Err(if answer.status >= 500 {
                CoordError::Http(what)
            } else {
                CoordError::Etcd(what)
            });
        }
        Ok(value)
    }

    /// The auth token, fetched once per client (and after it expired).
    async fn token(&self, endpoint: &Endpoint) -> Result<Option<String>, CoordError> {
        let Some((user, password)) = &self.credentials else {
            return Ok(None);
        };
        if let Some(t) = self.token.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(Some(t));
        }
        let body = serde_json::to_vec(&json!({"name": user, "password": password})).expect("JSON");
        let answer = http::call(
            endpoint,
            "POST",
            "/v3/auth/authenticate",
            Some(body),
            None,
            CALL_TIMEOUT,
        )
        .await?;
        let value: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        let token = value
            .get("token")
            .and_then(Value::as_str)
            .map(str::to_owned);
        match (answer.status, token) {
            (200, Some(t)) => {
                *self.token.lock().unwrap_or_else(|e| e.into_inner()) = Some(t.clone());
                Ok(Some(t))
            }
            (status, _) => Err(CoordError::Etcd(format!(
                "{}: etcd refused etcd_user {user:?} (HTTP {status}: {})",
                endpoint.address,
                value
                    .get("message")
                    .or_else(|| value.get("error"))
                    .and_then(Value::as_str)
                    .unwrap_or("no reason given")
            ))),
        }
    }

    /// Grants a lease of `ttl`; returns its id and the TTL etcd gave.
    pub async fn grant(&self, ttl: Duration) -> Result<(i64, i64), CoordError> {
        let v = self
            .post("/v3/lease/grant", json!({"TTL": ttl.as_secs().to_string()}))
            .await?;
        let id = int(&v["ID"]);
        if id == 0 {
            return Err(CoordError::Etcd(format!("lease grant gave no id: {v}")));
        }
        Ok((id, int(&v["TTL"])))
    }

    /// Renews lease `id`; the TTL it has now (0: it is gone).
    pub async fn keep_alive(&self, id: i64) -> Result<i64, CoordError> {
        let v = self
            .post("/v3/lease/keepalive", json!({"ID": id.to_string()}))
            .await?;
        Ok(int(&v["result"]["TTL"]))
    }

    /// Ends lease `id` (and the keys it holds) at once.
    pub async fn revoke(&self, id: i64) -> Result<(), CoordError> {
        self.post("/v3/lease/revoke", json!({"ID": id.to_string()}))
            .await
            .map(|_| ())
    }

    /// The key's current version, if it exists.
    pub async fn get(&self, key: &str) -> Result<Option<Kv>, CoordError> {
        let v = self
            .post("/v3/kv/range", json!({"key": B64.encode(key)}))
            .await?;
        Ok(first_kv(&v["kvs"]))
    }

    /// The election, as etcd's own election API runs it (its
    /// `concurrency.Election`): each candidate puts `me` under
    /// `<election>/<lease in hex>` with its lease, once; the candidate
    /// whose key has the lowest create revision leads, read with the
    /// election API's `leader` call. A key with a lower revision can never
    /// appear later, so a leader leads while its key lives (its lease).
    /// Returns this candidate's key's create revision and the leader's key.
    pub async fn campaign(
        &self,
        election: &str,
        me: &str,
        lease: i64,
    ) -> Result<(i64, Option<Kv>), CoordError> {
        let mine = candidate_key(election, lease);
        let v = self
            .post("/v3/kv/txn", campaign_request(&mine, me, lease))
            .await?;
        let created = created_by_campaign(&v);
        let leader = match self
            .post("/v3/election/leader", json!({"name": B64.encode(election)}))
            .await
        {
            Ok(v) => {
                first_kv(&Value::Array(vec![v["kv"].clone()])).filter(|kv| kv.create_revision > 0)
            }
            // Nobody campaigns (our key's lease ran out in between);
            // etcd answers that with a 500.
            Err(e) if e.to_string().contains("election: no leader") => None,
            Err(e) => return Err(e),
        };
        Ok((created, leader))
    }

    /// Writes `value` under `key` only while this candidate's key lives
    /// (at its create revision) and `key` is still at `expected_mod` (0:
    /// does not exist yet): a leader whose lease ran out, or that raced
    /// another, writes nothing. The same transaction writes the candidate
    /// key again, with its lease, so that both carry the revision written
    /// (what readers check: `proof`). The revision written, or `None` when
    /// the compare failed.
    pub async fn put_if_leader(
        &self,
        key: &str,
        value: &[u8],
        candidate: &Candidate,
        expected_mod: i64,
    ) -> Result<Option<i64>, CoordError> {
        let v = self
            .post(
                "/v3/kv/txn",
                guarded_put_request(key, value, candidate, expected_mod),
            )
            .await?;
        Ok(v["succeeded"]
            .as_bool()
            .unwrap_or(false)
            .then(|| int(&v["header"]["revision"])))
    }

    /// Every key under `<election>/` as it was at revision `at`; once etcd
    /// compacted that revision away, as it is now.
    pub async fn candidates(&self, election: &str, at: i64) -> Result<Vec<Kv>, CoordError> {
        match self
            .post("/v3/kv/range", candidates_request(election, Some(at)))
            .await
        {
            Ok(v) => Ok(all_kvs(&v["kvs"])),
            Err(CoordError::Etcd(e)) if e.contains("compacted") => {
                let v = self
                    .post("/v3/kv/range", candidates_request(election, None))
                    .await?;
                Ok(all_kvs(&v["kvs"]))
            }
            Err(e) => Err(e),
        }
    }

    /// Opens a watch on `key` from revision `from`, on the first member
    /// that takes it.
    pub async fn watch(&self, key: &str, from: i64) -> Result<hyper::body::Incoming, CoordError> {
        let body = serde_json::to_vec(&json!({"create_request": {
            "key": B64.encode(key),
            "start_revision": from.to_string(),
        }}))
        .expect("JSON");
        let n = self.endpoints.len();
        let start = self.next.load(Ordering::Relaxed);
        let mut last = CoordError::Http("no etcd endpoint".into());
        for i in 0..n {
            let endpoint = &self.endpoints[(start + i) % n];
            let token = match self.token(endpoint).await {
                Ok(t) => t,
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            match http::open_stream(
                endpoint,
                "/v3/watch",
                body.clone(),
                token.as_deref(),
                CALL_TIMEOUT,
            )
            .await
            {
                Ok(stream) => return Ok(stream),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// gRPC's JSON mapping writes int64 as a string; accept either.
fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// The first key-value of a `kvs` array.
pub fn first_kv(kvs: &Value) -> Option<Kv> {
    kvs.as_array()?.first().map(kv_of)
}

/// Every key-value of a `kvs` array.
pub fn all_kvs(kvs: &Value) -> Vec<Kv> {
    kvs.as_array()
        .map_or_else(Vec::new, |a| a.iter().map(kv_of).collect())
}

fn kv_of(kv: &Value) -> Kv {
    let text = |v: &Value| v.as_str().and_then(|v| B64.decode(v).ok());
    Kv {
        key: text(&kv["key"])
            .map_or_else(String::new, |k| String::from_utf8_lossy(&k).into_owned()),
        value: kv["value"]
            .as_str()
            .and_then(|v| B64.decode(v).ok())
            .unwrap_or_default(),
        create_revision: int(&kv["create_revision"]),
        mod_revision: int(&kv["mod_revision"]),
        lease: int(&kv["lease"]),
    }
}

/// A candidate's key in an election: `<election>/<lease in hex>`, as
/// etcd's election API names it.
pub fn candidate_key(election: &str, lease: i64) -> String {
    format!("{election}/{lease:x}")
}

fn campaign_request(key: &str, me: &str, lease: i64) -> Value {
    let k = B64.encode(key);
    json!({
        "compare": [{"key": k, "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
        "success": [{"request_put": {"key": k, "value": B64.encode(me), "lease": lease.to_string()}}],
        "failure": [{"request_range": {"key": k}}],
    })
}

/// The create revision of this candidate's key after a campaign: the
/// transaction's when the put went through, else the key's as read (0:
/// it is gone, its lease ran out).
fn created_by_campaign(v: &Value) -> i64 {
    if v["succeeded"].as_bool().unwrap_or(false) {
        return int(&v["header"]["revision"]);
    }
    first_kv(&v["responses"][0]["response_range"]["kvs"]).map_or(0, |kv| kv.create_revision)
}

/// A range over every key under `<election>/`, at revision `at` (`None`:
/// now).
fn candidates_request(election: &str, at: Option<i64>) -> Value {
    let prefix = format!("{election}/");
    let mut end = prefix.clone().into_bytes();
    // The prefix ends in '/': the range ends just past it.
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    let mut r = json!({"key": B64.encode(&prefix), "range_end": B64.encode(&end)});
    if let Some(at) = at {
        r["revision"] = json!(at.to_string());
    }
    r
}

fn guarded_put_request(key: &str, value: &[u8], candidate: &Candidate, expected_mod: i64) -> Value {
    let k = B64.encode(key);
    let position = if expected_mod == 0 {
        json!({"key": k, "result": "EQUAL", "target": "CREATE", "create_revision": "0"})
    } else {
        json!({"key": k, "result": "EQUAL", "target": "MOD", "mod_revision": expected_mod.to_string()})
    };
    let c = B64.encode(&candidate.key);
    json!({
        "compare": [
            {"key": c, "result": "EQUAL", "target": "CREATE", "create_revision": candidate.created.to_string()},
            position,
        ],
        "success": [
            {"request_put": {"key": k, "value": B64.encode(value)}},
            {"request_put": {"key": c, "value": B64.encode(&candidate.me), "lease": candidate.lease.to_string()}},
        ],
    })
}

/// The newest version of the watched key in one watch message: `Some(None)`
/// when it was deleted, `None` when the message carries no event.
pub fn watch_event(message: &[u8]) -> Result<Option<Option<Kv>>, CoordError> {
    let v: Value = serde_json::from_slice(message)
        .map_err(|e| CoordError::Http(format!("watch: not JSON ({e})")))?;
    if let Some(err) = v.get("error") {
        return Err(CoordError::Etcd(format!("watch: {err}")));
    }
    let result = &v["result"];
    if result["canceled"].as_bool() == Some(true) {
        return Err(CoordError::Etcd(format!(
            "watch canceled: {}",
            result["cancel_reason"].as_str().unwrap_or("compacted")
        )));
    }
    let Some(last) = result["events"].as_array().and_then(|e| e.last()) else {
        return Ok(None);
    };
    if last["type"].as_str() == Some("DELETE") {
        return Ok(Some(None));
    }
    Ok(Some(first_kv(&Value::Array(vec![last["kv"].clone()]))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_campaign_puts_the_candidate_key_once() {
        let key = candidate_key("/f/c/leader", 0x2a);
        assert_eq!(key, "/f/c/leader/2a", "etcd's election API's naming");
        let r = campaign_request(&key, "me", 42);
        assert_eq!(r["compare"][0]["target"], "CREATE");
        assert_eq!(r["compare"][0]["create_revision"], "0");
        assert_eq!(r["success"][0]["request_put"]["lease"], "42");
        assert_eq!(
            B64.decode(r["success"][0]["request_put"]["value"].as_str().unwrap())
                .unwrap(),
            b"me"
        );
    }

    #[test]
    fn the_campaign_answer_gives_the_candidate_s_revision() {
        let put = json!({"header": {"revision": "9"}, "succeeded": true});
        assert_eq!(created_by_campaign(&put), 9);
        let there = json!({"header": {"revision": "9"}, "responses": [{"response_range": {"kvs": [
            {"key": B64.encode("/f/c/leader/7"), "value": B64.encode("me"), "create_revision": "3", "mod_revision": "3", "lease": "7"}
        ], "count": "1"}}]});
        assert_eq!(created_by_campaign(&there), 3);
        // The lease ran out between the compare and the range.
        let gone = json!({"header": {"revision": "9"}, "responses": [{"response_range": {}}]});
        assert_eq!(created_by_campaign(&gone), 0);
    }

    #[test]
    fn a_guarded_put_compares_the_candidate_key_and_the_version() {
        let me = Candidate {
            key: "/f/c/leader/7".into(),
            me: "f1".into(),
            lease: 7,
            created: 3,
        };
        let r = guarded_put_request("/f/c/topology", b"{}", &me, 0);
        assert_eq!(r["compare"][0]["target"], "CREATE");
        assert_eq!(r["compare"][0]["create_revision"], "3");
        assert_eq!(r["compare"][1]["target"], "CREATE");
        // The candidate key is written again in the same transaction,
        // with its lease and value unchanged: both keys carry its revision.
        let again = &r["success"][1]["request_put"];
        assert_eq!(again["key"], B64.encode("/f/c/leader/7"));
        assert_eq!(again["value"], B64.encode("f1"));
        assert_eq!(again["lease"], "7");
        assert!(r["success"][0]["request_put"].get("lease").is_none());
        let r = guarded_put_request("/f/c/topology", b"{}", &me, 12);
        assert_eq!(r["compare"][1]["target"], "MOD");
        assert_eq!(r["compare"][1]["mod_revision"], "12");
    }

    #[test]
    fn the_candidates_are_read_at_a_revision() {
        let r = candidates_request("/f/c/leader", Some(12));
        assert_eq!(r["key"], B64.encode("/f/c/leader/"));
        assert_eq!(r["range_end"], B64.encode("/f/c/leader0"));
        assert_eq!(r["revision"], "12");
        assert!(candidates_request("/f/c/leader", None)
            .get("revision")
            .is_none());
        let answer = json!({"kvs": [
            {"key": B64.encode("/f/c/leader/2a"), "value": B64.encode("a"), "create_revision": "5", "mod_revision": "12", "lease": "42"},
            {"key": B64.encode("/f/c/leader/2b"), "value": B64.encode("b"), "create_revision": "8", "mod_revision": "8", "lease": "43"},
        ]});
        let kvs = all_kvs(&answer["kvs"]);
        assert_eq!(kvs.len(), 2);
        assert_eq!((kvs[0].key.as_str(), kvs[0].lease), ("/f/c/leader/2a", 42));
        assert!(all_kvs(&json!(null)).is_empty());
    }

    #[test]
    fn watch_messages_give_the_newest_event() {
        let created = br#"{"result":{"header":{"revision":"4"},"created":true}}"#;
        assert_eq!(watch_event(created).unwrap(), None);
        let put = format!(
            r#"{{"result":{{"events":[{{"kv":{{"key":"x","value":"{}","mod_revision":"5","create_revision":"2"}}}},{{"kv":{{"value":"{}","mod_revision":"6","create_revision":"2"}}}}]}}}}"#,
            B64.encode("a"),
            B64.encode("b")
        );
        let kv = watch_event(put.as_bytes()).unwrap().unwrap().unwrap();
        assert_eq!((kv.value.as_slice(), kv.mod_revision), (&b"b"[..], 6));
        let del =
            br#"{"result":{"events":[{"type":"DELETE","kv":{"key":"x","mod_revision":"7"}}]}}"#;
        assert_eq!(watch_event(del).unwrap(), Some(None));
        let canceled = br#"{"result":{"canceled":true,"compact_revision":"3"}}"#;
        assert!(watch_event(canceled).is_err());
        assert_eq!(int(&json!(12)), 12);
        assert_eq!(int(&json!("12")), 12);
    }
}
