//! The socket to a server: TCP (`host:port`), or a Unix-domain socket when the
//! host is an absolute directory (`/var/run/postgresql:5432` means
//! `/var/run/postgresql/.s.PGSQL.5432`, as libpq reads host and port).
//! A Unix socket skips the TCP stack when Fulcrum runs on the database host.
//! Over TCP the connection may be TLS, after an SSLRequest the server
//! answered `S` (`server_tls`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use fulcrum_tls::tokio_rustls::client::TlsStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

pub enum ServerStream {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// The socket file for an address whose host is a directory, if it is one.
pub fn unix_socket_path(address: &str) -> Option<String> {
    let (dir, port) = address.rsplit_once(':')?;
    dir.starts_with('/')
        .then(|| format!("{}/.s.PGSQL.{port}", dir.trim_end_matches('/')))
}

impl ServerStream {
    pub async fn connect(address: &str) -> io::Result<ServerStream> {
        match unix_socket_path(address) {
            Some(path) => Ok(ServerStream::Unix(UnixStream::connect(path).await?)),
            None => {
                let s = TcpStream::connect(address).await?;
                s.set_nodelay(true)?;
                Ok(ServerStream::Tcp(s))
            }
        }
    }

    /// True when nothing has arrived on an idle connection: no data, no
    /// EOF, no error. Consumes nothing on TLS (the bytes there would be a
    /// record the TLS layer must read); on plain sockets an unasked byte
    /// means the connection is not reused anyway.
    pub fn is_quiet(&self) -> bool {
        let mut probe = [0u8; 1];
        match self {
            ServerStream::Tcp(s) => would_block(s.try_read(&mut probe)),
            ServerStream::Unix(s) => would_block(s.try_read(&mut probe)),
            ServerStream::Tls(s) => {
                let mut cx = Context::from_waker(std::task::Waker::noop());
                let mut buf = ReadBuf::new(&mut probe);
                s.get_ref().0.poll_peek(&mut cx, &mut buf).is_pending()
            }
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
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerStream::Tcp(s) => Pin::new(s).poll_flush(cx),
            ServerStream::Unix(s) => Pin::new(s).poll_flush(cx),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerStream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            ServerStream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

fn would_block(r: io::Result<usize>) -> bool {
    matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_hosts_are_unix_sockets() {
        assert_eq!(
            unix_socket_path("/var/run/postgresql:5432").as_deref(),
            Some("/var/run/postgresql/.s.PGSQL.5432")
        );
        assert_eq!(
            unix_socket_path("/tmp/:6000").as_deref(),
            Some("/tmp/.s.PGSQL.6000")
        );
        assert_eq!(unix_socket_path("127.0.0.1:5432"), None);
        assert_eq!(unix_socket_path("db.example:5432"), None);
    }
}
