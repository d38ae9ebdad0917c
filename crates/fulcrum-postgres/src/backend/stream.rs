//! The socket to a server: TCP (`host:port`), or a Unix-domain socket when the
//! host is an absolute directory (`/var/run/postgresql:5432` means
//! `/var/run/postgresql/.s.PGSQL.5432`, as libpq reads host and port).
//! A Unix socket skips the TCP stack when Fulcrum runs on the database host.
//! A host name is resolved through `fulcrum_net::dns` (kept for
//! `dns_max_ttl`, each address tried). The stream type itself
//! (`ServerStream`, with TLS) is `fulcrum_tls`'s.

use std::io;

use tokio::net::UnixStream;

pub use fulcrum_tls::ServerStream;

/// The socket file for an address whose host is a directory, if it is one.
pub fn unix_socket_path(address: &str) -> Option<String> {
    let (dir, port) = address.rsplit_once(':')?;
    dir.starts_with('/')
        .then(|| format!("{}/.s.PGSQL.{port}", dir.trim_end_matches('/')))
}

/// Connects to `address`: a Unix socket for a directory host, else TCP.
pub async fn connect(address: &str) -> io::Result<ServerStream> {
    match unix_socket_path(address) {
        Some(path) => Ok(ServerStream::Unix(UnixStream::connect(path).await?)),
        None => {
            let s = fulcrum_net::dns::connect(address).await?;
            s.set_nodelay(true)?;
            Ok(ServerStream::Tcp(s))
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
