//! The HTTP endpoints on the `[fulcrum] metrics` address, a minimal
//! HTTP/1.1 responder (one request per connection): `GET /metrics` (the
//! text exposition format), `GET /healthz` (the process answers: 200) and
//! `GET /ready` (200 when every cluster has a write target and Fulcrum is
//! not shutting down, else 503 with the reason), for Kubernetes probes and
//! load balancers; anything else 404 (405 for other methods).
//!
//! Every answer carries `X-Content-Type-Options: nosniff`,
//! `X-Frame-Options: DENY` and a `Content-Security-Policy`: the status
//! page's admits only its own inline script and style, by their SHA-256
//! hashes ([`page_policy`]), and same-origin fetches; every other answer's
//! admits nothing.
//!
//! Bounded: at most [`MAX_CONNECTIONS`] connections at once (a new one
//! closes the oldest, so idle or slow clients cannot lock out the probes),
//! and a request's head must arrive within [`HEAD_TIMEOUT`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::Metrics;

/// Whether the daemon can take traffic (`/ready`).
pub trait Readiness: Send + Sync {
    /// `None` when ready; otherwise why not.
    fn not_ready(&self) -> Option<String>;
}

/// The status page and its JSON API (`/` and `/api/v1/<table>`), behind a
/// key; the daemon implements it over the admin console's tables.
pub trait Status: Send + Sync {
    /// The key a request must present (`?key=` or `Authorization: Bearer`);
    /// `None`: the page and the API are off.
    fn key(&self) -> Option<String>;
    /// The page's HTML.
    fn page(&self) -> &'static str;
    /// A table as JSON; `None`: no such table.
    fn api(&self, table: &str) -> Option<String>;
}

/// Always ready (for tests and callers without clusters).
pub struct AlwaysReady;

impl Readiness for AlwaysReady {
    fn not_ready(&self) -> Option<String> {
        None
    }
}

/// Connections served at once; the next one closes the oldest.
pub const MAX_CONNECTIONS: usize = 32;
/// How long a client may take to send its request's head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a whole exchange may take (a large scrape to a slow reader).
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// The connections being served, oldest first, by number.
type Open = Arc<Mutex<VecDeque<(u64, tokio::task::AbortHandle)>>>;

/// Serves the endpoints on `listener` until `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    readiness: Arc<dyn Readiness>,
    status: Option<Arc<dyn Status>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let open: Open = Arc::default();
    let mut next = 0u64;
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.changed() => return,
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let metrics = metrics.clone();
        let readiness = readiness.clone();
        let status = status.clone();
        let id = next;
        next += 1;
        let done = open.clone();
        // Held while the task is spawned and listed: its own removal, at
        // its end, always finds it listed.
        let mut listed = open.lock().unwrap_or_else(|e| e.into_inner());
        if listed.len() >= MAX_CONNECTIONS {
            if let Some((_, oldest)) = listed.pop_front() {
                oldest.abort();
            }
        }
        let task = tokio::spawn(async move {
            let _ = tokio::time::timeout(
                EXCHANGE_TIMEOUT,
                answer(stream, &metrics, readiness.as_ref(), status.as_deref()),
            )
            .await;
            let mut open = done.lock().unwrap_or_else(|e| e.into_inner());
            open.retain(|(i, _)| *i != id);
        });
        listed.push_back((id, task.abort_handle()));
    }
}

/// The policy of every answer but the status page: nothing may load, nor
/// frame it.
pub const CLOSED_POLICY: &str = "default-src 'none'; frame-ancestors 'none'";

/// The text of each inline `<tag>...</tag>` element of `page`.
fn inline_blocks<'a>(page: &'a str, tag: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut blocks = Vec::new();
    let mut rest = page;
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(&close) else { break };
        blocks.push(&after[..end]);
        rest = &after[end + close.len()..];
    }
    blocks
}

/// The status page's `Content-Security-Policy`: same-origin only, its
/// inline scripts and styles admitted by hash (no `'unsafe-inline'`), no
/// framing, no `<base>`, no form posts.
pub fn page_policy(page: &str) -> String {
    let hashes = |tag: &str| {
        inline_blocks(page, tag)
            .iter()
            .map(|b| {
                let digest = Sha256::digest(b.as_bytes());
                format!(
                    " 'sha256-{}'",
                    base64::engine::general_purpose::STANDARD.encode(digest)
                )
            })
            .collect::<String>()
    };
    format!(
        "default-src 'self'; script-src{}; style-src{}; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        hashes("script"),
        hashes("style")
    )
}

/// The request line of an HTTP request, once its head is complete.
pub fn request_line(head: &[u8]) -> Option<(&str, &str)> {
    let text = std::str::from_utf8(head).ok()?;
    let line = text.lines().next()?;
    let mut parts = line.split_whitespace();
    Some((parts.next()?, parts.next()?))
}

/// Whether `head` presents `key`, as `?key=` in the path or as
/// `Authorization: Bearer`.
pub fn presents_key(head: &[u8], path: &str, key: &str) -> bool {
    let in_query = path
        .split_once('?')
        .is_some_and(|(_, q)| q.split('&').any(|p| p.strip_prefix("key=") == Some(key)));
    let text = String::from_utf8_lossy(head);
    let in_header = text.lines().any(|l| {
        l.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("authorization")
                && value.trim().strip_prefix("Bearer ") == Some(key)
        })
    });
    in_query || in_header
}

/// `/` and `/api/v1/...`: (status, content type, body).
fn status_answer(
    head: &[u8],
    path: &str,
    status: Option<&dyn Status>,
) -> (&'static str, &'static str, String) {
    const OFF: &str = "the status page is off: set [fulcrum] status_key (docs/metrics.md)\n";
    let Some((status, key)) = status.and_then(|s| Some((s, s.key()?))) else {
        return ("404 Not Found", "text/plain; charset=utf-8", OFF.to_owned());
    };
    if !presents_key(head, path, &key) {
        return (
            "401 Unauthorized",
            "text/plain; charset=utf-8",
            "a key is needed: ?key=... or Authorization: Bearer ...\n".to_owned(),
        );
    }
    let bare = path.split('?').next().unwrap_or("");
    if bare == "/" {
        return (
            "200 OK",
            "text/html; charset=utf-8",
            status.page().to_owned(),
        );
    }
    match bare.strip_prefix("/api/v1/").and_then(|t| status.api(t)) {
        Some(json) => ("200 OK", "application/json", json),
        None => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "no such table; try /api/v1/clusters, servers, backends, pools, clients, queries, stats, databases, lists, failovers, mirror, mirrors, history\n".to_owned(),
        ),
    }
}

async fn answer(
    mut stream: TcpStream,
    metrics: &Metrics,
    readiness: &dyn Readiness,
    status: Option<&dyn Status>,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let read_head = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<(), std::io::Error>(())
    };
    match tokio::time::timeout(HEAD_TIMEOUT, read_head).await {
        Ok(r) => r?,
        Err(_) => return Ok(()),
    }
    const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
    let (code, kind, body) = match request_line(&head) {
        Some(("GET", path)) if path == "/metrics" || path.starts_with("/metrics?") => {
            ("200 OK", TEXT, metrics.encode())
        }
        Some(("GET", "/healthz")) => ("200 OK", TEXT, "ok\n".to_owned()),
        Some(("GET", "/ready")) => match readiness.not_ready() {
            None => ("200 OK", TEXT, "ready\n".to_owned()),
            Some(why) => (
                "503 Service Unavailable",
                TEXT,
                format!("not ready: {why}\n"),
            ),
        },
        Some(("GET", path))
            if path == "/" || path.starts_with("/?") || path.starts_with("/api/v1/") =>
        {
            status_answer(&head, path, status)
        }
        Some(("GET", _)) => (
            "404 Not Found",
            TEXT,
            "not found; try /metrics, /healthz, /ready, / (status page) or /api/v1/...\n"
                .to_owned(),
        ),
        _ => ("405 Method Not Allowed", TEXT, "only GET\n".to_owned()),
    };
    // Only the status page is HTML.
    let policy = if kind.starts_with("text/html") {
        page_policy(&body)
    } else {
        CLOSED_POLICY.to_owned()
    };
    let response = format!(
        "HTTP/1.1 {code}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nContent-Security-Policy: {policy}\r\nX-Frame-Options: DENY\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn idle_connections_are_bounded_and_do_not_lock_out_a_probe() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_tx, rx) = watch::channel(false);
        let _task = tokio::spawn(serve(
            listener,
            Arc::new(Metrics::new()),
            Arc::new(AlwaysReady),
            None,
            rx,
        ));
        // Many idle connections, then a probe: it is answered at once, and
        // the oldest idle ones were closed.
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS * 3 {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        let mut probe = TcpStream::connect(addr).await.unwrap();
        probe
            .write_all(b"GET /healthz HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(1), probe.read_to_string(&mut out))
            .await
            .expect("the probe is answered at once")
            .unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        let mut byte = [0u8; 1];
        let first = tokio::time::timeout(Duration::from_secs(1), idle[0].read(&mut byte))
            .await
            .expect("the oldest idle connection was closed");
        assert!(matches!(first, Ok(0) | Err(_)), "{first:?}");
    }

    struct Keyed;
    impl Status for Keyed {
        fn key(&self) -> Option<String> {
            Some("k".repeat(16))
        }
        fn page(&self) -> &'static str {
            "<html>page</html>"
        }
        fn api(&self, table: &str) -> Option<String> {
            (table == "clusters").then(|| "[]".to_owned())
        }
    }

    #[test]
    fn the_status_page_and_api_need_the_key() {
        let key = "k".repeat(16);
        let off = status_answer(b"GET / HTTP/1.1\r\n\r\n", "/", None);
        assert_eq!(off.0, "404 Not Found", "off without a key configured");
        let none = status_answer(b"GET / HTTP/1.1\r\n\r\n", "/", Some(&Keyed));
        assert_eq!(none.0, "401 Unauthorized");
        let wrong = format!("/?key={}", "x".repeat(16));
        assert_eq!(
            status_answer(b"", &wrong, Some(&Keyed)).0,
            "401 Unauthorized"
        );
        let page = status_answer(b"", &format!("/?key={key}"), Some(&Keyed));
        assert_eq!((page.0, page.2.as_str()), ("200 OK", "<html>page</html>"));
        let head = format!("GET /api/v1/clusters HTTP/1.1\r\nAuthorization: Bearer {key}\r\n\r\n");
        let api = status_answer(head.as_bytes(), "/api/v1/clusters", Some(&Keyed));
        assert_eq!(
            (api.0, api.1, api.2.as_str()),
            ("200 OK", "application/json", "[]")
        );
        let unknown = status_answer(head.as_bytes(), "/api/v1/secrets", Some(&Keyed));
        assert_eq!(unknown.0, "404 Not Found");
    }

    #[test]
    fn the_page_policy_admits_its_inline_blocks_by_hash() {
        let page = "<style>b{}</style><script>go()</script><script>x()</script>";
        let policy = page_policy(page);
        let hash = |t: &str| {
            base64::engine::general_purpose::STANDARD.encode(Sha256::digest(t.as_bytes()))
        };
        assert!(
            policy.contains(&format!(
                "script-src 'sha256-{}' 'sha256-{}';",
                hash("go()"),
                hash("x()")
            )),
            "{policy}"
        );
        assert!(
            policy.contains(&format!("style-src 'sha256-{}';", hash("b{}"))),
            "{policy}"
        );
        assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
        assert!(!policy.contains("unsafe"), "{policy}");
        assert_eq!(
            inline_blocks("<script>unclosed", "script"),
            Vec::<&str>::new()
        );
    }

    #[test]
    fn request_lines_are_read() {
        assert_eq!(
            request_line(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(request_line(b""), None);
        assert_eq!(request_line(&[0xff, 0xfe]), None);
    }

    #[tokio::test]
    async fn metrics_are_served_over_http() {
        let metrics = Arc::new(Metrics::new());
        let cm = crate::ClusterMetrics::new(metrics.clone(), "main", &["db1:5432".into()]);
        cm.queries(0, crate::RouteLabel::Read, 3);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(serve(listener, metrics, Arc::new(AlwaysReady), None, rx));
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        assert!(
            out.contains(
                "fulcrum_queries_total{backend=\"db1:5432\",cluster=\"main\",route=\"read\"} 3"
            ),
            "{out}"
        );
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 404"), "{out}");
        tx.send(true).unwrap();
        task.await.unwrap();
    }
}
