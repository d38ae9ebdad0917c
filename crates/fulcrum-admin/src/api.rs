//! The console's tables as JSON, for the status page and scripts
//! (`/api/v1/<table>` on the metrics port): the same rows the console's
//! SHOW sends, read back from its result set (one producer for both), as
//! an array of objects keyed by column. Decoding is a pure function over
//! the console's bytes. Beside the tables, what only the status page
//! wants: `history` (the recent totals, `fulcrum_metrics::history`) and
//! `mirrors` (each mirror target's totals).

use bytes::BytesMut;

use crate::command::Show;
use crate::Admin;

/// The tables the API serves, by the name in its path.
pub const TABLES: &[&str] = &[
    "clusters",
    "servers",
    "backends",
    "pools",
    "clients",
    "queries",
    "stats",
    "databases",
    "lists",
    "failovers",
    "mirror",
    "mirrors",
    "history",
    "cache",
];

impl Admin {
    /// `/api/v1/<what>` as JSON; `None` for a table it does not serve.
    pub fn api_json(&self, what: &str) -> Option<String> {
        let mut out = BytesMut::new();
        match what {
            "clusters" => self.show(Show::Clusters, &mut out),
            "servers" => self.show(Show::Servers, &mut out),
            "backends" => self.show(Show::Backends, &mut out),
            "pools" => self.show(Show::Pools, &mut out),
            "clients" => self.show(Show::Clients, &mut out),
            "stats" => self.show(Show::Stats, &mut out),
            "databases" => self.show(Show::Databases, &mut out),
            "lists" => self.show(Show::Lists, &mut out),
            "failovers" => self.show(Show::Failovers, &mut out),
            "mirror" => self.show(Show::Mirror, &mut out),
            "cache" => self.show(Show::Cache, &mut out),
            "queries" => self.show_queries(None, &mut out).ok()?,
            "mirrors" => return Some(self.mirrors_json()),
            "history" => return Some(history_json(&self.metrics.history.points())),
            _ => return None,
        }
        Some(to_json(&out))
    }
}

impl Admin {
    /// Each mirror target: its cluster, name and totals (sent, dropped,
    /// differing); `[]` when no cluster mirrors.
    fn mirrors_json(&self) -> String {
        let mut rows = Vec::new();
        for c in &self.clusters() {
            for m in c.mirrors() {
                let (sent, dropped, differing) = m.totals();
                rows.push(serde_json::json!({
                    "cluster": c.config().name,
                    "target": m.target,
                    "sent": sent,
                    "dropped": dropped,
                    "differing": differing,
                }));
            }
        }
        serde_json::Value::Array(rows).to_string()
    }
}

/// `/api/v1/history`: the sampling interval and window, then each
/// cluster's points (what happened between two consecutive samples), oldest
/// first. Numbers, not strings: nothing here comes from the console.
pub fn history_json(clusters: &[(String, Vec<fulcrum_metrics::history::Point>)]) -> String {
    use fulcrum_metrics::history::{SAMPLE_EVERY, WINDOW};
    let clusters: Vec<serde_json::Value> = clusters
        .iter()
        .map(|(name, points)| {
            let points: Vec<serde_json::Value> = points
                .iter()
                .map(|p| {
                    serde_json::json!({
                        "at_unix_ms": p.at_unix_ms,
                        "seconds": p.seconds,
                        "transactions": p.transactions,
                        "errors": p.errors,
                        "pool_waits": p.pool_waits,
                        "pool_wait_us": p.pool_wait_us,
                        "clients_waiting": p.clients_waiting,
                    })
                })
                .collect();
            serde_json::json!({"cluster": name, "points": points})
        })
        .collect();
    serde_json::json!({
        "interval_s": SAMPLE_EVERY.as_secs(),
        "window_s": WINDOW.as_secs(),
        "clusters": clusters,
    })
    .to_string()
}

/// A console result set (RowDescription, DataRows) as a JSON array of
/// objects; values are strings, as the console's (NULL is `null`).
pub fn to_json(bytes: &[u8]) -> String {
    let mut columns: Vec<String> = Vec::new();
    let mut rows: Vec<serde_json::Value> = Vec::new();
    let mut at = 0;
    while at + 5 <= bytes.len() {
        let kind = bytes[at];
        let len = i32::from_be_bytes([bytes[at + 1], bytes[at + 2], bytes[at + 3], bytes[at + 4]])
            as usize;
        let end = (at + 1 + len).min(bytes.len());
        let body = &bytes[(at + 5).min(end)..end];
        match kind {
            b'T' => columns = field_names(body),
            b'D' => {
                let values = row_values(body);
                let object: serde_json::Map<String, serde_json::Value> = columns
                    .iter()
                    .cloned()
                    .zip(
                        values
                            .into_iter()
                            .map(|v| v.map_or(serde_json::Value::Null, serde_json::Value::String)),
                    )
                    .collect();
                rows.push(serde_json::Value::Object(object));
            }
            _ => {}
        }
        at = end;
    }
    serde_json::Value::Array(rows).to_string()
}

fn field_names(body: &[u8]) -> Vec<String> {
    let mut names = Vec::new();
    if body.len() < 2 {
        return names;
    }
    let n = u16::from_be_bytes([body[0], body[1]]) as usize;
    let mut at = 2;
    for _ in 0..n {
        let Some(nul) = body[at..].iter().position(|&b| b == 0) else {
            break;
        };
        names.push(String::from_utf8_lossy(&body[at..at + nul]).into_owned());
        at += nul + 1 + 18;
        if at > body.len() {
            break;
        }
    }
    names
}

fn row_values(body: &[u8]) -> Vec<Option<String>> {
    let mut values = Vec::new();
    if body.len() < 2 {
        return values;
    }
    let n = u16::from_be_bytes([body[0], body[1]]) as usize;
    let mut at = 2;
    for _ in 0..n {
        if at + 4 > body.len() {
            break;
        }
        let len = i32::from_be_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
        at += 4;
        if len < 0 {
            values.push(None);
            continue;
        }
        let end = (at + len as usize).min(body.len());
        values.push(Some(String::from_utf8_lossy(&body[at..end]).into_owned()));
        at = end;
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_set_reads_back_as_objects() {
        let mut out = BytesMut::new();
        crate::rows::result(
            &mut out,
            &["backend", "role"],
            &[
                vec!["a:1".into(), "primary".into()],
                vec!["b:2".into(), "re\"plica".into()],
            ],
        );
        assert_eq!(
            to_json(&out),
            r#"[{"backend":"a:1","role":"primary"},{"backend":"b:2","role":"re\"plica"}]"#
        );
        let mut empty = BytesMut::new();
        crate::rows::result(&mut empty, &["x"], &[]);
        assert_eq!(to_json(&empty), "[]");
        assert_eq!(
            to_json(b"\x01\x02"),
            "[]",
            "garbage is no rows, never a panic"
        );
    }

    #[test]
    fn the_history_is_numbers_per_cluster() {
        let point = fulcrum_metrics::history::Point {
            at_unix_ms: 5000,
            seconds: 5.0,
            transactions: 50,
            errors: 1,
            pool_waits: 50,
            pool_wait_us: 1200,
            clients_waiting: 0,
        };
        let json: serde_json::Value =
            serde_json::from_str(&history_json(&[("ma\"in".into(), vec![point])])).unwrap();
        assert_eq!(json["interval_s"], 5);
        assert_eq!(json["window_s"], 600);
        assert_eq!(json["clusters"][0]["cluster"], "ma\"in");
        assert_eq!(json["clusters"][0]["points"][0]["transactions"], 50);
        assert_eq!(json["clusters"][0]["points"][0]["pool_wait_us"], 1200);
    }
}
