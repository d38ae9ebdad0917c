//! The socket to a server: TCP (`host:port`), or a Unix-domain socket when the
//! host is an absolute directory (`/var/run/postgresql:5432` means
//! `/var/run/postgresql/.s.PGSQL.5432`, as libpq reads host and port).
//! A Unix socket skips the TCP stack when Fulcrum runs on the database host.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

pub enum ServerStream {
    Tcp(TcpStream),
    Unix(UnixStream),
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

    /// Non-blocking read; `WouldBlock` when nothing is there.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ServerStream::Tcp(s) => s.try_read(buf),
            ServerStream::Unix(s) => s.try_read(buf),
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
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerStream::Tcp(s) => Pin::new(s).poll_flush(cx),
            ServerStream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerStream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            ServerStream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
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
