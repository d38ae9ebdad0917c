//! A small client of etcd's v3 API over its JSON gateway (`/v3/...`,
//! etcd 3.4 and later): leases, a guarded put (the election), reads,
//! compare-and-swap writes and watches. Tries each member in turn,
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
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub lease: i64,
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
            return Err(CoordError::Etcd(format!(
                "{}{path}: HTTP {}: {message}",
                endpoint.address, answer.status
            )));
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
                "{}: etcd refused etcd_user {user:?} (HTTP {status})",
                endpoint.address
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

    /// The election: puts `me` under `key` with `lease` if nobody holds
    /// the key. Returns who holds it now.
    pub async fn campaign(
        &self,
        key: &str,
        me: &str,
        lease: i64,
    ) -> Result<Option<Kv>, CoordError> {
        let v = self
            .post("/v3/kv/txn", campaign_request(key, me, lease))
            .await?;
        Ok(holder_after_campaign(&v, me, lease))
    }

    /// Writes `value` under `key` only while `leader_key` holds `me` and
    /// `key` is still at `expected_mod` (0: does not exist yet): a leader
    /// that lost its lease, or raced another, writes nothing. The
    /// revision written, or `None` when the compare failed.
    pub async fn put_if_leader(
        &self,
        key: &str,
        value: &[u8],
        leader_key: &str,
        me: &str,
        expected_mod: i64,
    ) -> Result<Option<i64>, CoordError> {
        let v = self
            .post(
                "/v3/kv/txn",
                guarded_put_request(key, value, leader_key, me, expected_mod),
            )
            .await?;
        Ok(v["succeeded"]
            .as_bool()
            .unwrap_or(false)
            .then(|| int(&v["header"]["revision"])))
    }

    /// Deletes `key` only while it holds `me` (a leader stepping down).
    pub async fn delete_if(&self, key: &str, me: &str) -> Result<(), CoordError> {
        let body = json!({
            "compare": [{"key": B64.encode(key), "result": "EQUAL", "target": "VALUE", "value": B64.encode(me)}],
            "success": [{"request_delete_range": {"key": B64.encode(key)}}],
        });
        self.post("/v3/kv/txn", body).await.map(|_| ())
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
    let kv = kvs.as_array()?.first()?;
    Some(Kv {
        value: kv["value"]
            .as_str()
            .and_then(|v| B64.decode(v).ok())
            .unwrap_or_default(),
        create_revision: int(&kv["create_revision"]),
        mod_revision: int(&kv["mod_revision"]),
        lease: int(&kv["lease"]),
    })
}

fn campaign_request(key: &str, me: &str, lease: i64) -> Value {
    let k = B64.encode(key);
    json!({
        "compare": [{"key": k, "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
        "success": [{"request_put": {"key": k, "value": B64.encode(me), "lease": lease.to_string()}}],
        "failure": [{"request_range": {"key": k}}],
    })
}

/// Who holds the leader key after a campaign: us when the put went
/// through, else the holder the failure branch read.
fn holder_after_campaign(v: &Value, me: &str, lease: i64) -> Option<Kv> {
    if v["succeeded"].as_bool().unwrap_or(false) {
        return Some(Kv {
            value: me.as_bytes().to_vec(),
            create_revision: int(&v["header"]["revision"]),
            mod_revision: int(&v["header"]["revision"]),
            lease,
        });
    }
    first_kv(&v["responses"][0]["response_range"]["kvs"])
}

fn guarded_put_request(
    key: &str,
    value: &[u8],
    leader_key: &str,
    me: &str,
    expected_mod: i64,
) -> Value {
    let k = B64.encode(key);
    let position = if expected_mod == 0 {
        json!({"key": k, "result": "EQUAL", "target": "CREATE", "create_revision": "0"})
    } else {
        json!({"key": k, "result": "EQUAL", "target": "MOD", "mod_revision": expected_mod.to_string()})
    };
    json!({
        "compare": [
            {"key": B64.encode(leader_key), "result": "EQUAL", "target": "VALUE", "value": B64.encode(me)},
            position,
        ],
        "success": [{"request_put": {"key": k, "value": B64.encode(value)}}],
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
    fn a_campaign_puts_only_where_nobody_holds_the_key() {
        let r = campaign_request("/f/c/leader", "me", 42);
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
    fn the_campaign_answer_names_the_holder() {
        let won = json!({"header": {"revision": "9"}, "succeeded": true});
        assert_eq!(holder_after_campaign(&won, "me", 7).unwrap().value, b"me");
        let lost = json!({"header": {"revision": "9"}, "responses": [{"response_range": {"kvs": [
            {"key": B64.encode("/f/c/leader"), "value": B64.encode("other"), "create_revision": "3", "mod_revision": "3", "lease": "5"}
        ], "count": "1"}}]});
        let holder = holder_after_campaign(&lost, "me", 7).unwrap();
        assert_eq!(holder.value, b"other");
        assert_eq!((holder.create_revision, holder.lease), (3, 5));
        // The holder's lease ran out between the compare and the range.
        let gone = json!({"header": {"revision": "9"}, "responses": [{"response_range": {}}]});
        assert_eq!(holder_after_campaign(&gone, "me", 7), None);
    }

    #[test]
    fn a_guarded_put_compares_the_leader_and_the_version() {
        let r = guarded_put_request("/f/c/topology", b"{}", "/f/c/leader", "me", 0);
        assert_eq!(r["compare"][0]["target"], "VALUE");
        assert_eq!(r["compare"][1]["target"], "CREATE");
        let r = guarded_put_request("/f/c/topology", b"{}", "/f/c/leader", "me", 12);
        assert_eq!(r["compare"][1]["target"], "MOD");
        assert_eq!(r["compare"][1]["mod_revision"], "12");
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
