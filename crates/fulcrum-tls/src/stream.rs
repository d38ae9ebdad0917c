//! A client connection: plain TCP, or TLS over it once the protocol's
//! handshake asked for it, a Unix-domain socket (never TLS, as with
//! PgBouncer), or an in-process pipe (`Memory`: the session benchmarks
//! drive a whole session without sockets).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

pub enum ClientStream {
    Plain(TcpStream),
    Tls(Box<TlsStream<Prefixed>>),
    /// A client of the listener's Unix-domain socket: local, never TLS.
    Unix(UnixStream),
    /// One end of `tokio::io::duplex`: a client in the same process (no
    /// TLS, no peer address).
    Memory(DuplexStream),
    /// Given up: a TLS handshake on it failed. Every read and write fails.
    Closed,
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "the TLS handshake failed")
}

impl ClientStream {
    /// Runs the server side of a TLS handshake on a plain stream; after
    /// it the stream is TLS (or `Closed`, when the handshake failed).
    pub async fn upgrade(&mut self, acceptor: &TlsAcceptor) -> io::Result<()> {
        self.upgrade_with(acceptor, Vec::new()).await
    }

    /// As [`upgrade`](Self::upgrade), with `early` the first bytes of the
    /// client's handshake, already read from the socket (a MySQL client
    /// sends its ClientHello right behind the SSL request, unanswered, so
    /// one read may take both).
    pub async fn upgrade_with(&mut self, acceptor: &TlsAcceptor, early: Vec<u8>) -> io::Result<()> {
        match std::mem::replace(self, ClientStream::Closed) {
            ClientStream::Plain(tcp) => {
                let io = Prefixed { early, at: 0, tcp };
                *self = ClientStream::Tls(Box::new(acceptor.accept(io).await?));
                Ok(())
            }
            other => {
                let why = match other {
                    ClientStream::Unix(_) => "TLS is not offered over a Unix socket",
                    _ => "TLS asked for twice",
                };
                *self = other;
                Err(io::Error::new(io::ErrorKind::InvalidInput, why))
            }
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, ClientStream::Tls(_))
    }

    /// The socket, when it can be handed to another process with the
    /// session on it (a binary upgrade): plain TCP or a Unix socket. A TLS
    /// session's keys and sequence numbers are this process's (there is no
    /// kernel TLS here), so a TLS client cannot move.
    pub fn movable_socket(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        match self {
            ClientStream::Plain(s) => Some(s.as_fd()),
            ClientStream::Unix(s) => Some(s.as_fd()),
            _ => None,
        }
    }

    /// A client of the listener's Unix-domain socket.
    pub fn is_unix(&self) -> bool {
        matches!(self, ClientStream::Unix(_))
    }

    /// No one between the client and Fulcrum can read what it sends: TLS,
    /// or a Unix socket (the kernel carries it; MySQL counts both as a
    /// secure transport for a password in clear).
    pub fn is_secure(&self) -> bool {
        matches!(self, ClientStream::Tls(_) | ClientStream::Unix(_))
    }

    /// The certificate the client presented in the TLS handshake (checked
    /// against `tls_client_ca`), if any.
    pub fn client_certificate(&self) -> Option<&[u8]> {
        match self {
            ClientStream::Tls(s) => s
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| c.as_ref()),
            _ => None,
        }
    }

    /// The application protocol agreed by ALPN in the TLS handshake, if any.
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        match self {
            ClientStream::Tls(s) => s.get_ref().1.alpn_protocol(),
            _ => None,
        }
    }

    /// The client's IP address (none over a Unix socket, or once `Closed`).
    pub fn peer_ip(&self) -> Option<std::net::IpAddr> {
        self.tcp()?.peer_addr().ok().map(|a| a.ip())
    }

    /// The TCP socket under it (none over a Unix socket, or once `Closed`).
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            ClientStream::Plain(s) => Some(s),
            ClientStream::Tls(s) => Some(&s.get_ref().0.tcp),
            ClientStream::Unix(_) | ClientStream::Memory(_) | ClientStream::Closed => None,
        }
    }
}

/// A TCP stream with bytes already read from it put back in front.
pub struct Prefixed {
    early: Vec<u8>,
    at: usize,
    tcp: TcpStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if me.at < me.early.len() {
            let n = (me.early.len() - me.at).min(buf.remaining());
            buf.put_slice(&me.early[me.at..me.at + n]);
            me.at += n;
            if me.at == me.early.len() {
                me.early = Vec::new();
                me.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut me.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

impl From<TcpStream> for ClientStream {
    fn from(s: TcpStream) -> ClientStream {
        ClientStream::Plain(s)
    }
}

impl From<UnixStream> for ClientStream {
    fn from(s: UnixStream) -> ClientStream {
        ClientStream::Unix(s)
    }
}

impl AsyncRead for ClientStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            ClientStream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            ClientStream::Memory(s) => Pin::new(s).poll_read(cx, buf),
            ClientStream::Closed => Poll::Ready(Err(closed())),
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            ClientStream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            ClientStream::Memory(s) => Pin::new(s).poll_write(cx, buf),
            ClientStream::Closed => Poll::Ready(Err(closed())),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            ClientStream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ClientStream::Memory(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ClientStream::Closed => Poll::Ready(Err(closed())),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ClientStream::Plain(s) => s.is_write_vectored(),
            ClientStream::Tls(s) => s.is_write_vectored(),
            ClientStream::Unix(s) => s.is_write_vectored(),
            ClientStream::Memory(s) => s.is_write_vectored(),
            ClientStream::Closed => false,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_flush(cx),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            ClientStream::Unix(s) => Pin::new(s).poll_flush(cx),
            ClientStream::Memory(s) => Pin::new(s).poll_flush(cx),
            ClientStream::Closed => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            ClientStream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            ClientStream::Memory(s) => Pin::new(s).poll_shutdown(cx),
            ClientStream::Closed => Poll::Ready(Ok(())),
        }
    }
}
