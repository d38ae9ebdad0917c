//! A connection to a server, whatever carries it: TCP, a Unix-domain
//! socket, or TLS over TCP (after the protocol's own request for it:
//! PostgreSQL's SSLRequest, MySQL's SSL request), or an in-process pipe
//! (`Memory`: the session benchmarks drive a whole session without
//! sockets). Both protocol crates' server connections use it, so the
//! delegation lives once.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::client::TlsStream;

pub enum ServerStream {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<TlsStream<TcpStream>>),
    /// One end of `tokio::io::duplex`: a server in the same process.
    Memory(DuplexStream),
}

impl ServerStream {
    /// The server's and this end's socket addresses (TCP and TLS; `None`
    /// over a Unix socket or a pipe), for SHOW SERVERS.
    pub fn addresses(&self) -> Option<(std::net::SocketAddr, std::net::SocketAddr)> {
        let tcp = match self {
            ServerStream::Tcp(s) => s,
            ServerStream::Tls(s) => s.get_ref().0,
            ServerStream::Unix(_) | ServerStream::Memory(_) => return None,
        };
        Some((tcp.peer_addr().ok()?, tcp.local_addr().ok()?))
    }

    /// The TLS version and cipher suite (`TLSv1_3/TLS13_AES_256_GCM_SHA384`);
    /// empty without TLS.
    pub fn tls_description(&self) -> String {
        match self {
            ServerStream::Tls(s) => {
                let c = s.get_ref().1;
                format!(
                    "{}/{}",
                    c.protocol_version()
                        .map_or(String::new(), |v| format!("{v:?}")),
                    c.negotiated_cipher_suite()
                        .map_or(String::new(), |cs| format!("{:?}", cs.suite()))
                )
            }
            _ => String::new(),
        }
    }

    /// True when nothing has arrived on an idle connection: no data, no
    /// EOF, no error. Consumes nothing on TLS (the bytes there would be a
    /// record the TLS layer must read); on plain sockets an unasked byte
    /// means the connection is not reused anyway.
    pub fn is_quiet(&mut self) -> bool {
        let mut probe = [0u8; 1];
        match self {
            ServerStream::Tcp(s) => would_block(s.try_read(&mut probe)),
            ServerStream::Unix(s) => would_block(s.try_read(&mut probe)),
            ServerStream::Tls(s) => {
                let mut cx = Context::from_waker(std::task::Waker::noop());
                let mut buf = ReadBuf::new(&mut probe);
                s.get_ref().0.poll_peek(&mut cx, &mut buf).is_pending()
            }
            ServerStream::Memory(s) => {
                let mut cx = Context::from_waker(std::task::Waker::noop());
                let mut buf = ReadBuf::new(&mut probe);
                Pin::new(s).poll_read(&mut cx, &mut buf).is_pending()
            }
        }
    }

    /// Runs the client side of a TLS handshake over a TCP stream, checking
    /// the server as `config` says, against `name`.
    pub async fn start_tls(
        self,
        config: std::sync::Arc<rustls::ClientConfig>,
        name: rustls::pki_types::ServerName<'static>,
    ) -> io::Result<ServerStream> {
        match self {
            ServerStream::Tcp(tcp) => Ok(ServerStream::Tls(Box::new(
                crate::connect(config, name, tcp).await?,
            ))),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "TLS runs over TCP connections only",
            )),
        }
    }

    /// The TLS session, when the connection is TLS.
    pub fn tls(&self) -> Option<&TlsStream<TcpStream>> {
        match self {
            ServerStream::Tls(s) => Some(s),
            _ => None,
        }
    }
}

impl AsyncRead for ServerStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerStream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            ServerStream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            ServerStream::Memory(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ServerStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ServerStream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            ServerStream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            ServerStream::Memory(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerStream::Tcp(s) => Pin::new(s).poll_flush(cx),
            ServerStream::Unix(s) => Pin::new(s).poll_flush(cx),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            ServerStream::Memory(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerStream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            ServerStream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            ServerStream::Memory(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

fn would_block(r: io::Result<usize>) -> bool {
    matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}
