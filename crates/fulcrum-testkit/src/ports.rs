//! Picks free loopback TCP ports for servers the harness starts. Never hands
//! out the well-known ports of the machine's own services (PostgreSQL 5432,
//! PgBouncer/Fulcrum 6432, MariaDB 3306/33060), nor the same port twice in one
//! process. A port can still be taken between probing and binding, so callers
//! that start servers retry with a new port when the bind fails. Also waits
//! for a listener: on a TCP address, or on a Unix socket.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Ports that belong to real services on developer and CI machines.
pub const RESERVED_PORTS: &[u16] = &[3306, 5432, 6432, 33060];

/// Ports already handed out by this process.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A loopback port that was free a moment ago.
///
/// Binds `127.0.0.1:0`, reads the kernel's choice and closes the socket.
/// Panics only if the machine cannot bind loopback sockets at all.
pub fn free_port() -> u16 {
    for _ in 0..1000 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1:0 to find a free port: {e}"));
        let port = listener
            .local_addr()
            .expect("local_addr of a bound listener")
            .port();
        drop(listener);
        if RESERVED_PORTS.contains(&port) {
            continue;
        }
        let mut guard = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
        if guard.get_or_insert_with(HashSet::new).insert(port) {
            return port;
        }
    }
    panic!("no free loopback port after 1000 tries");
}

/// Polls until `addr` accepts a TCP connection or `timeout` passes.
pub fn wait_for_tcp(addr: &str, timeout: Duration) -> bool {
    let Ok(sock) = addr.parse::<SocketAddr>() else {
        return false;
    };
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(stream) = TcpStream::connect_timeout(&sock, Duration::from_millis(200)) {
            // With nobody listening, the kernel may pick the destination port
            // as our source port and connect the socket to itself (TCP
            // simultaneous open); that is not a listener. Go's net package
            // has the same guard.
            if stream.local_addr().ok() != stream.peer_addr().ok() {
                return true;
            }
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// True once something accepts on the Unix socket at `path`, polling until
/// `timeout`.
pub fn wait_for_unix(path: &std::path::Path, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_and_never_reserved() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let unique: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(unique.len(), ports.len());
        assert!(ports.iter().all(|p| !RESERVED_PORTS.contains(p)));
    }

    #[test]
    fn a_free_port_can_be_bound() {
        let port = free_port();
        TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("port should be free");
    }
}
