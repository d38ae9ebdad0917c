//! The HTTP endpoints on the `[fulcrum] metrics` address, a minimal
//! HTTP/1.1 responder (one request per connection): `GET /metrics` (the
//! text exposition format), `GET /healthz` (the process answers: 200) and
//! `GET /ready` (200 when every cluster has a write target and Fulcrum is
//! not shutting down, else 503 with the reason), for Kubernetes probes and
//! load balancers; anything else 404 (405 for other methods).

use std::sync::Arc;
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

/// Serves the endpoints on `listener` until `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    readiness: Arc<dyn Readiness>,
    mut shutdown: watch::Receiver<bool>,
) {
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
        tokio::spawn(async move {
            let _ = tokio::time::timeout(
                Duration::from_secs(10),
                answer(stream, &metrics, readiness.as_ref()),
            )
            .await;
        });
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
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
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
