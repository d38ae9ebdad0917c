//! One HTTP/1.1 exchange with a coordinator (etcd's v3 JSON gateway,
//! Patroni's REST API): a fresh connection per call, plain or TLS, bounded
//! by a timeout, and a streamed answer for etcd's watch. Control traffic
//! only (a few calls a second), so no connection is kept.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
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
    let exchange = async {
        let response = send(endpoint, method, path, body, token).await?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| CoordError::Http(format!("{}: {e}", endpoint.address)))?
            .to_bytes();
        Ok(Answer { status, body })
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
/// each) into whole messages; a partial one stays in `buffer`.
pub fn split_messages(buffer: &mut Vec<u8>) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(end) = buffer.iter().position(|&b| b == b'\n') {
        let line: Vec<u8> = buffer.drain(..=end).collect();
        let line = line.trim_ascii();
        if !line.is_empty() {
            out.push(line.to_vec());
        }
    }
    out
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
        let mut buf = b"{\"a\":1}\n\n{\"b\":2}\n{\"c\"".to_vec();
        let msgs = split_messages(&mut buf);
        assert_eq!(msgs, vec![b"{\"a\":1}".to_vec(), b"{\"b\":2}".to_vec()]);
        assert_eq!(buf, b"{\"c\"".to_vec());
        buf.extend_from_slice(b":3}\n");
        assert_eq!(split_messages(&mut buf), vec![b"{\"c\":3}".to_vec()]);
        assert!(buf.is_empty());
    }
}
