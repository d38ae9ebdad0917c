//! Binding the client listeners at start: one per `listen` address
//! (clusters sharing an address share it), each with its Unix-domain socket
//! beside it when the cluster has `unix_socket_dir` (PostgreSQL) or
//! `unix_socket` (MySQL). The socket's rules (a stale file replaced, a live
//! or foreign one refused, the file removed on exit) are
//! `fulcrum_net::listener`'s. After an upgrade, the sockets the old process
//! handed over are used instead of binding new ones
//! (`upgrade::successor`), and [`handed_sockets`] names what this process
//! would hand over in turn.

use fulcrum_config::Config;
use fulcrum_net::listener::{bind_unix, Found, UnixSocket};
use fulcrum_net::ClientListener;
use tokio::net::TcpListener;

use crate::DaemonError;

/// Pending connections a client listener queues before the kernel drops
/// handshakes (capped by `net.core.somaxconn`). tokio's default is 128: a
/// burst of 2,000 clients overflowed it, and a MySQL client whose handshake
/// was dropped waits forever for the server's greeting.
pub const LISTEN_BACKLOG: u32 = 4096;

/// A client listener on `address` with [`LISTEN_BACKLOG`] (and
/// `SO_REUSEADDR`, as `TcpListener::bind` sets it).
pub fn bind_listener(address: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if address.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Every client listener of `config`, with the indexes of the clusters it
/// serves (port 0 is never shared: the OS picks a port per listener). On
/// an error, the sockets bound so far are closed (their files removed).
pub(crate) fn bind_all(config: &Config) -> Result<Vec<(Vec<usize>, ClientListener)>, DaemonError> {
    let mut listeners: Vec<(Vec<usize>, ClientListener)> = Vec::new();
    for (i, cluster) in config.clusters.iter().enumerate() {
        let shares = cluster.listen.port() != 0;
        if let Some((members, _)) = listeners
            .iter_mut()
            .find(|(m, _)| shares && config.clusters[m[0]].listen == cluster.listen)
        {
            members.push(i);
            continue;
        }
        let listen_error = |source| DaemonError::Listen {
            cluster: cluster.name.clone(),
            address: cluster.listen,
            source,
        };
        let tcp = match crate::upgrade::successor::tcp(cluster.listen) {
            Some(l) => l
                .set_nonblocking(true)
                .and_then(|()| TcpListener::from_std(l))
                .map_err(listen_error)?,
            None => bind_listener(cluster.listen).map_err(listen_error)?,
        };
        let unix = match &cluster.unix_socket {
            None => None,
            Some(socket) => {
                // The port bound, for `listen` on port 0.
                let port = tcp.local_addr().map_or(cluster.listen.port(), |a| a.port());
                let path = socket.path(port);
                let gid = socket.group.as_ref().map(|g| g.gid);
                let unix_error = |source| DaemonError::UnixSocket {
                    cluster: cluster.name.clone(),
                    path: path.clone(),
                    source,
                };
                let (unix, found) = match crate::upgrade::successor::unix(port, &path) {
                    Some(l) => (
                        UnixSocket::adopt(l, &path, port).map_err(unix_error)?,
                        Found::Nothing,
                    ),
                    None => bind_unix(&path, socket.mode, gid, port).map_err(unix_error)?,
                };
                if found == Found::Stale {
                    tracing::info!(cluster = %cluster.name, path = %path.display(), "replaced a stale socket file nobody listened on");
                }
                tracing::info!(cluster = %cluster.name, path = %path.display(), mode = format!("{:04o}", socket.mode), "listening on a Unix socket");
                Some(unix)
            }
        };
        listeners.push((vec![i], ClientListener::new(tcp, unix)));
    }
    Ok(listeners)
}

/// Copies of the listening sockets of `listeners` (bound by [`bind_all`]
/// for `config`), named as the config names them, for an upgrade to hand
/// over. A `listen` on port 0 is left out: the next process binds its own.
pub(crate) fn handed_sockets(
    config: &Config,
    listeners: &[(Vec<usize>, ClientListener)],
) -> crate::upgrade::Sockets {
    use crate::upgrade::wire::Socket;
    use std::os::fd::AsFd;
    let mut sockets = Vec::new();
    for (members, listener) in listeners {
        let address = config.clusters[members[0]].listen;
        if address.port() == 0 {
            continue;
        }
        if let Ok(fd) = listener.tcp().as_fd().try_clone_to_owned() {
            sockets.push((Socket::Tcp(address), fd));
        }
        if let Some(unix) = listener.unix() {
            if let Ok(fd) = unix.listener_fd().try_clone_to_owned() {
                sockets.push((Socket::Unix(address.port(), unix.path().to_path_buf()), fd));
            }
        }
    }
    sockets
}

#[cfg(test)]
mod tests {
    use super::{bind_listener, LISTEN_BACKLOG};

    /// The kernel reports a listener's queue length as `ss`'s Send-Q.
    #[tokio::test]
    async fn client_listeners_queue_thousands_of_handshakes() {
        let listener = bind_listener("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = listener.local_addr().unwrap().port();
        let out = std::process::Command::new("ss")
            .args(["-ltnH", &format!("sport = :{port}")])
            .output()
            .expect("ss (iproute2) runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let send_q: u32 = text
            .split_whitespace()
            .nth(2)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no listener line from ss: {text:?}"));
        let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(send_q, LISTEN_BACKLOG.min(somaxconn));
        if somaxconn > 128 {
            assert!(send_q > 128, "more than tokio's default of 128");
        }
    }
}
