//! The HTTP endpoints on the `[fulcrum] metrics` address, a minimal
//! HTTP/1.1 responder (one request per connection): `GET /metrics` (the
//! text exposition format), `GET /healthz` (the process answers: 200) and
//! `GET /ready` (200 when every cluster has a write target and Fulcrum is
//! not shutting down, else 503 with the reason), for Kubernetes probes and
//! load balancers; anything else 404 (405 for other methods).
//!
//! Bounded: at most [`MAX_CONNECTIONS`] connections at once (a new one
//! closes the oldest, so idle or slow clients cannot lock out the probes),
//! and a request's head must arrive within [`HEAD_TIMEOUT`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::Metrics;

/// Whether the daemon can take traffic (`/ready`).
pub trait Readiness: Send + Sync {
    /// `None` when ready; otherwise why not.
    fn not_ready(&self) -> Option<String>;
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
                answer(stream, &metrics, readiness.as_ref()),
            )
            .await;
            let mut open = done.lock().unwrap_or_else(|e| e.into_inner());
            open.retain(|(i, _)| *i != id);
        });
        listed.push_back((id, task.abort_handle()));
    }
}

/// The request line of an HTTP request, once its head is complete.
pub fn request_line(head: &[u8]) -> Option<(&str, &str)> {
    let text = std::str::from_utf8(head).ok()?;
    let line = text.lines().next()?;
    let mut parts = line.split_whitespace();
    Some((parts.next()?, parts.next()?))
}

async fn answer(
    mut stream: TcpStream,
    metrics: &Metrics,
    readiness: &dyn Readiness,
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
    let (status, body) = match request_line(&head) {
        Some(("GET", path)) if path == "/metrics" || path.starts_with("/metrics?") => {
            ("200 OK", metrics.encode())
        }
        Some(("GET", "/healthz")) => ("200 OK", "ok\n".to_owned()),
        Some(("GET", "/ready")) => match readiness.not_ready() {
            None => ("200 OK", "ready\n".to_owned()),
            Some(why) => ("503 Service Unavailable", format!("not ready: {why}\n")),
        },
        Some(("GET", _)) => (
            "404 Not Found",
            "not found; try /metrics, /healthz or /ready\n".to_owned(),
        ),
        _ => ("405 Method Not Allowed", "only GET\n".to_owned()),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
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
        let task = tokio::spawn(serve(listener, metrics, Arc::new(AlwaysReady), rx));
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
