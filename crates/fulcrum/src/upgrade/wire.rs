//! The wire between a running daemon and the process replacing it on an
//! upgrade: a Unix stream socket carrying lines (`HELLO <pid>` from the new
//! process, `READY` when it serves) and one message from the old process
//! with its listening sockets: their descriptors as `SCM_RIGHTS`, their
//! names as lines in the same order. Naming the sockets ([`encode`],
//! [`decode`]) is pure; [`send_sockets`] and [`recv_sockets`] are the I/O
//! edge (the hand-over's `send_with_fds` / `recv_with_fds`).

use std::io::{self, Read};
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use fulcrum_cluster::handover::wire::{recv_with_fds, send_with_fds};

/// The environment variable naming the old process's upgrade socket: set
/// only for a process an upgrade starts.
pub const ENV: &str = "FULCRUM_UPGRADE_FROM";

/// At most this many sockets are handed over (the kernel takes 253
/// descriptors per message).
pub const MAX_SOCKETS: usize = 200;

/// A listening socket, by what the config says it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Socket {
    /// A cluster's client listener (its `listen`).
    Tcp(SocketAddr),
    /// The Unix socket beside the client listener on this TCP port.
    Unix(u16, PathBuf),
    /// The admin console (`[fulcrum] admin`).
    Admin(SocketAddr),
    /// `/metrics` and the status page (`[fulcrum] metrics`).
    Metrics(SocketAddr),
}

/// The sockets' names, one line each: the message's payload after its
/// 4-byte length. A path with a line break is refused (never handed over).
pub fn encode(names: &[Socket]) -> io::Result<Vec<u8>> {
    let mut text = String::new();
    for name in names {
        let line = match name {
            Socket::Tcp(a) => format!("tcp {a}"),
            Socket::Unix(port, path) => {
                let path = path.to_str().filter(|p| !p.contains('\n')).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "a socket path that is not one line of UTF-8",
                    )
                })?;
                format!("unix {port} {path}")
            }
            Socket::Admin(a) => format!("admin {a}"),
            Socket::Metrics(a) => format!("metrics {a}"),
        };
        text.push_str(&line);
        text.push('\n');
    }
    let mut out = (text.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    Ok(out)
}

/// The names [`encode`] wrote (without the length).
pub fn decode(text: &[u8]) -> Result<Vec<Socket>, String> {
    let text =
        std::str::from_utf8(text).map_err(|_| "the socket names are not UTF-8".to_string())?;
    text.lines()
        .map(|line| {
            let (kind, rest) = line
                .split_once(' ')
                .ok_or_else(|| format!("bad socket line {line:?}"))?;
            let addr = || {
                rest.parse::<SocketAddr>()
                    .map_err(|e| format!("bad address in {line:?}: {e}"))
            };
            Ok(match kind {
                "tcp" => Socket::Tcp(addr()?),
                "admin" => Socket::Admin(addr()?),
                "metrics" => Socket::Metrics(addr()?),
                "unix" => {
                    let (port, path) = rest
                        .split_once(' ')
                        .ok_or_else(|| format!("bad socket line {line:?}"))?;
                    let port = port.parse().map_err(|_| format!("bad port in {line:?}"))?;
                    Socket::Unix(port, PathBuf::from(path))
                }
                _ => return Err(format!("unknown socket kind in {line:?}")),
            })
        })
        .collect()
}

/// Sends `names` with their descriptors `fds` (same order) in one message.
pub fn send_sockets(
    stream: &UnixStream,
    names: &[Socket],
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    if names.len() != fds.len() || fds.len() > MAX_SOCKETS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many sockets, or names and sockets differ",
        ));
    }
    send_with_fds(stream, &encode(names)?, fds)
}

/// Receives what [`send_sockets`] sent: each name with its descriptor
/// (close-on-exec).
pub fn recv_sockets(stream: &UnixStream) -> io::Result<Vec<(Socket, OwnedFd)>> {
    let mut buf = vec![0u8; 64 * 1024];
    let (got, fds) = recv_with_fds(stream, &mut buf, MAX_SOCKETS)?;
    let mut bytes = buf[..got].to_vec();
    if bytes.len() < 4 {
        let mut more = [0u8; 4];
        let need = 4 - bytes.len();
        (&*stream).read_exact(&mut more[..need])?;
        bytes.extend_from_slice(&more[..need]);
    }
    let len = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    if len > buf.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "socket names too long",
        ));
    }
    while bytes.len() < 4 + len {
        let mut more = vec![0u8; 4 + len - bytes.len()];
        let n = (&*stream).read(&mut more)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        bytes.extend_from_slice(&more[..n]);
    }
    let names =
        decode(&bytes[4..4 + len]).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    if names.len() != fds.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} socket names but {} descriptors", names.len(), fds.len()),
        ));
    }
    Ok(names.into_iter().zip(fds).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn names() -> Vec<Socket> {
        vec![
            Socket::Tcp("127.0.0.1:6432".parse().unwrap()),
            Socket::Unix(6432, PathBuf::from("/tmp/dir with space/.s.PGSQL.6432")),
            Socket::Admin("[::1]:6433".parse().unwrap()),
            Socket::Metrics("0.0.0.0:9187".parse().unwrap()),
        ]
    }

    #[test]
    fn names_survive_the_round_trip() {
        let bytes = encode(&names()).unwrap();
        assert_eq!(decode(&bytes[4..]).unwrap(), names());
        assert_eq!(
            u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize,
            bytes.len() - 4
        );
    }

    #[test]
    fn a_bad_line_is_an_error_naming_it() {
        assert!(decode(b"tcp nonsense\n").unwrap_err().contains("nonsense"));
        assert!(decode(b"udp 1.2.3.4:5\n").unwrap_err().contains("unknown"));
        assert!(encode(&[Socket::Unix(1, PathBuf::from("a\nb"))]).is_err());
    }

    #[test]
    fn listening_sockets_cross_to_the_other_end_and_still_accept() {
        let (a, b) = UnixStream::pair().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let name = Socket::Tcp(addr);
        send_sockets(&a, std::slice::from_ref(&name), &[listener.as_fd()]).unwrap();
        drop(listener);
        let got = recv_sockets(&b).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, name);
        let (_, fd) = got.into_iter().next().unwrap();
        let received = std::net::TcpListener::from(fd);
        assert_eq!(received.local_addr().unwrap(), addr);
        let _client = std::net::TcpStream::connect(addr).unwrap();
        received.accept().unwrap();
    }
}
