//! One HTTP/1.1 exchange with a coordinator (etcd's v3 JSON gateway,
//! Patroni's REST API): a fresh connection per call, plain or TLS, bounded
//! by a timeout, and a streamed answer for etcd's watch. Control traffic
//! only (a few calls a second), so no connection is kept.
//!
//! Bounded: an answer, and one message of a stream, may hold at most
//! [`MAX_ANSWER`] bytes (a coordinator's answers are kilobytes); past it
//! the call fails naming the endpoint, so a wrong or hostile endpoint
//! cannot make Fulcrum hold a huge body. The stream splitter
//! ([`Messages`]) scans each byte once.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::CONTENT_LENGTH;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::CoordError;

/// Where one coordinator member answers.
#[derive(Clone)]
pub struct Endpoint {
    /// `host:port`.
    pub address: String,
    pub tls: Option<Arc<fulcrum_tls::rustls::ClientConfig>>,
}

impl Endpoint {
    fn host(&self) -> &str {
        self.address
            .rsplit_once(':')
            .map_or(self.address.as_str(), |(h, _)| h)
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// The most an answer, or one message of a stream, may hold.
pub const MAX_ANSWER: usize = 8 * 1024 * 1024;

/// An answer read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

/// Sends `body` (JSON, or nothing for a GET) to `path` and reads the
/// whole answer, all within `timeout`.
pub async fn call(
    endpoint: &Endpoint,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
    token: Option<&str>,
    timeout: Duration,
) -> Result<Answer, CoordError> {
    let too_large = || {
        CoordError::Http(format!(
            "{}{path}: the answer is larger than {} MiB; refused",
            endpoint.address,
            MAX_ANSWER >> 20
        ))
    };
    let exchange = async {
        let response = send(endpoint, method, path, body, token).await?;
        let status = response.status().as_u16();
        let declared = response
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > MAX_ANSWER as u64) {
            return Err(too_large());
        }
        let mut body = response.into_body();
        let mut data = Vec::new();
        while let Some(chunk) = next_chunk(&mut body).await {
            let chunk =
                chunk.map_err(|e| CoordError::Http(format!("{}: {e}", endpoint.address)))?;
            if data.len() + chunk.len() > MAX_ANSWER {
                return Err(too_large());
            }
            data.extend_from_slice(&chunk);
        }
        Ok(Answer {
            status,
            body: Bytes::from(data),
        })
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| CoordError::Http(format!("{}: no answer in {timeout:?}", endpoint.address)))?
}

/// Sends the request and returns the answer's body unread, for a stream
/// of messages (etcd's watch). Connecting is bounded by `timeout`.
pub async fn open_stream(
    endpoint: &Endpoint,
    path: &str,
    body: Vec<u8>,
    token: Option<&str>,
    timeout: Duration,
) -> Result<Incoming, CoordError> {
    let response = tokio::time::timeout(timeout, send(endpoint, "POST", path, Some(body), token))
        .await
        .map_err(|_| {
            CoordError::Http(format!("{}: no answer in {timeout:?}", endpoint.address))
        })??;
    if !response.status().is_success() {
        return Err(CoordError::Http(format!(
            "{}{path}: HTTP {}",
            endpoint.address,
            response.status()
        )));
    }
    Ok(response.into_body())
}

async fn send(
    endpoint: &Endpoint,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
    token: Option<&str>,
) -> Result<hyper::Response<Incoming>, CoordError> {
    let fail = |e: &dyn std::fmt::Display| CoordError::Http(format!("{}: {e}", endpoint.address));
    let tcp = TcpStream::connect(&endpoint.address)
        .await
        .map_err(|e| fail(&e))?;
    let _ = tcp.set_nodelay(true);
    let io: Box<dyn Io> = match &endpoint.tls {
        None => Box::new(tcp),
        Some(config) => {
            let name = fulcrum_tls::server_name(endpoint.host()).map_err(|e| fail(&e))?;
            Box::new(
                fulcrum_tls::connect(config.clone(), name, tcp)
                    .await
                    .map_err(|e| fail(&e))?,
            )
        }
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| fail(&e))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", endpoint.address.as_str());
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    if let Some(token) = token {
        request = request.header("authorization", token);
    }
    let request = request
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| fail(&e))?;
    sender.send_request(request).await.map_err(|e| fail(&e))
}

/// Splits a stream of JSON messages (etcd's gateway puts a newline after
/// each) into whole messages; a partial one is kept for the next chunk.
/// Each byte is scanned once (the partial tail is not rescanned), and a
/// partial message past [`MAX_ANSWER`] is an error.
#[derive(Debug, Default)]
pub struct Messages {
    buffer: Vec<u8>,
    /// How much of `buffer` is known to hold no newline.
    scanned: usize,
}

impl Messages {
    /// Takes the next chunk; the whole messages it completes.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Vec<u8>>, CoordError> {
        self.buffer.extend_from_slice(chunk);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(i) = self.buffer[self.scanned..].iter().position(|&b| b == b'\n') {
            let end = self.scanned + i;
            let line = self.buffer[start..end].trim_ascii();
            if !line.is_empty() {
                out.push(line.to_vec());
            }
            start = end + 1;
            self.scanned = start;
        }
        self.buffer.drain(..start);
        self.scanned = self.buffer.len();
        if self.buffer.len() > MAX_ANSWER {
            self.buffer = Vec::new();
            self.scanned = 0;
            return Err(CoordError::Http(format!(
                "a streamed message is larger than {} MiB; refused",
                MAX_ANSWER >> 20
            )));
        }
        Ok(out)
    }

    /// The partial message held.
    pub fn partial(&self) -> &[u8] {
        &self.buffer
    }
}

/// The next chunk of a streamed body; `None` at its end.
pub async fn next_chunk(body: &mut Incoming) -> Option<Result<Bytes, CoordError>> {
    loop {
        match body.frame().await? {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    return Some(Ok(data));
                }
            }
            Err(e) => return Some(Err(CoordError::Http(e.to_string()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_split_at_newlines_and_keeps_the_partial_tail() {
        let mut m = Messages::default();
        let msgs = m.push(b"{\"a\":1}\n\n{\"b\":2}\n{\"c\"").unwrap();
        assert_eq!(msgs, vec![b"{\"a\":1}".to_vec(), b"{\"b\":2}".to_vec()]);
        assert_eq!(m.partial(), b"{\"c\"");
        assert!(m.push(b":").unwrap().is_empty());
        assert_eq!(m.scanned, 5, "the tail is not scanned again");
        assert_eq!(m.push(b"3}\n").unwrap(), vec![b"{\"c\":3}".to_vec()]);
        assert!(m.partial().is_empty());
    }

    #[test]
    fn a_streamed_message_past_the_bound_is_refused() {
        let mut m = Messages::default();
        let chunk = vec![b'x'; 1024 * 1024];
        for _ in 0..MAX_ANSWER / chunk.len() {
            assert!(m.push(&chunk).unwrap().is_empty());
        }
        let e = m.push(b"x").unwrap_err();
        assert!(e.to_string().contains("larger than 8 MiB"), "{e}");
        assert!(m.partial().is_empty(), "the buffer is let go");
        assert_eq!(m.push(b"{}\n").unwrap(), vec![b"{}".to_vec()]);
    }

    /// A local server that answers every connection with `head` and then
    /// `body_len` bytes of `x`, and closes.
    async fn serving(head: String, body_len: usize) -> Endpoint {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let head = head.clone();
                tokio::spawn(async move {
                    let mut request = [0u8; 4096];
                    let _ = s.read(&mut request).await;
                    let _ = s.write_all(head.as_bytes()).await;
                    let chunk = vec![b'x'; 64 * 1024];
                    let mut left = body_len;
                    while left > 0 {
                        let n = left.min(chunk.len());
                        if s.write_all(&chunk[..n]).await.is_err() {
                            return;
                        }
                        left -= n;
                    }
                    let _ = s.shutdown().await;
                });
            }
        });
        Endpoint { address, tls: None }
    }

    #[tokio::test]
    async fn an_oversized_answer_is_refused_naming_the_endpoint() {
        let timeout = Duration::from_secs(20);
        let big = MAX_ANSWER + 1024 * 1024;
        // Declared up front: refused before the body is read.
        let declared = serving(
            format!("HTTP/1.1 200 OK\r\nContent-Length: {big}\r\n\r\n"),
            big,
        )
        .await;
        let e = call(&declared, "GET", "/cluster", None, None, timeout)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("{}/cluster", declared.address)) && e.contains("larger than 8 MiB"),
            "{e}"
        );
        // Not declared (read until the connection closes): refused at the bound.
        let undeclared = serving(
            "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_owned(),
            big,
        )
        .await;
        let e = call(&undeclared, "GET", "/cluster", None, None, timeout)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("{}/cluster", undeclared.address)) && e.contains("larger than"),
            "{e}"
        );
        // Under the bound: read whole.
        let small = serving(
            "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_owned(),
            1000,
        )
        .await;
        let answer = call(&small, "GET", "/cluster", None, None, timeout)
            .await
            .unwrap();
        assert_eq!((answer.status, answer.body.len()), (200, 1000));
    }
}
