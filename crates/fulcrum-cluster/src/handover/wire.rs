//! The client hand-over's messages on the upgrade socket, after `READY`:
//! a client (its socket as `SCM_RIGHTS`, who it is, and its protocol's
//! snapshot of the session) or a tally (how many clients moved, stayed or
//! were closed). Each message is a 5-byte head (the body's length, big
//! endian, and its kind), sent with the descriptor in one `sendmsg`, then
//! the body. Encoding and decoding a body are pure ([`encode_client`],
//! [`decode_client`], [`Tally`]); [`send`] and [`recv`] are the I/O edge,
//! over [`send_with_fds`] and [`recv_with_fds`] (rustix's safe `sendmsg` /
//! `recvmsg`), which the upgrade's listening sockets use too.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;

use fulcrum_net::{ClientPeer, UnixPeer};
use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// A message with a client's socket.
pub const CLIENT: u8 = b'C';
/// A message with the old process's counts.
pub const TALLY: u8 = b'T';
/// From the new process: a cancel request for a key it does not know (a
/// client left on the old process), as [`encode_cancel`] writes it.
pub const CANCEL: u8 = b'K';
/// The largest body accepted (a client's snapshot holds its prepared
/// statements, bounded by `max_client_prepared_bytes`).
pub const MAX_BODY: usize = 256 * 1024 * 1024;

/// Who a handed-over client is, and its protocol's snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHead {
    /// `postgres` or `mysql`: the protocol whose snapshot `state` is.
    pub protocol: String,
    /// The `[[cluster]]` it logged in to.
    pub cluster: String,
    pub user: String,
    pub database: String,
    pub peer: ClientPeer,
    /// The socket is a Unix stream (else TCP).
    pub unix: bool,
    /// The protocol's snapshot of the session.
    pub state: Vec<u8>,
}

/// What the old process reports of its clients since the hand-over began.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Moved to the new process.
    pub handed_over: u64,
    /// Still on the old process: TLS clients, pinned clients.
    pub left_tls: u64,
    pub left_pinned: u64,
    /// Ended on the old process by `upgrade_timeout`, or whose move failed.
    pub closed: u64,
}

impl Tally {
    pub fn encode(&self) -> Vec<u8> {
        format!(
            "handed_over={} left_tls={} left_pinned={} closed={}",
            self.handed_over, self.left_tls, self.left_pinned, self.closed
        )
        .into_bytes()
    }

    pub fn decode(body: &[u8]) -> Option<Tally> {
        let mut t = Tally::default();
        for pair in std::str::from_utf8(body).ok()?.split(' ') {
            let (k, v) = pair.split_once('=')?;
            let v: u64 = v.parse().ok()?;
            match k {
                "handed_over" => t.handed_over = v,
                "left_tls" => t.left_tls = v,
                "left_pinned" => t.left_pinned = v,
                "closed" => t.closed = v,
                _ => {}
            }
        }
        Some(t)
    }
}

fn put(out: &mut Vec<u8>, field: &[u8]) {
    out.extend_from_slice(&(field.len() as u32).to_be_bytes());
    out.extend_from_slice(field);
}

fn take<'a>(body: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = u32::from_be_bytes(body.get(..4)?.try_into().ok()?) as usize;
    let field = body.get(4..4 + len)?;
    *body = &body[4 + len..];
    Some(field)
}

fn text(body: &mut &[u8]) -> Option<String> {
    String::from_utf8(take(body)?.to_vec()).ok()
}

/// The peer as one line: `tcp ADDR`, or `unix PORT UID GID PID PATH`
/// (`-` for what the kernel did not tell).
fn peer_text(peer: &ClientPeer) -> String {
    fn opt<T: ToString>(v: Option<T>) -> String {
        v.map_or("-".into(), |v| v.to_string())
    }
    match peer {
        ClientPeer::Tcp(a) => format!("tcp {a}"),
        ClientPeer::Unix(u) => format!(
            "unix {} {} {} {} {}",
            u.port,
            opt(u.uid),
            opt(u.gid),
            opt(u.pid),
            u.socket.display()
        ),
    }
}

fn parse_peer(line: &str) -> Option<ClientPeer> {
    let (kind, rest) = line.split_once(' ')?;
    match kind {
        "tcp" => rest.parse::<SocketAddr>().ok().map(ClientPeer::Tcp),
        "unix" => {
            let mut parts = rest.splitn(5, ' ');
            let port = parts.next()?.parse().ok()?;
            let mut opt = || parts.next().map(|p| p.parse().ok());
            let (uid, gid) = (opt()?, opt()?);
            let pid = parts.next()?.parse().ok();
            let path: PathBuf = parts.next()?.into();
            Some(ClientPeer::Unix(UnixPeer {
                socket: Arc::from(path.as_path()),
                port,
                uid,
                gid,
                pid,
            }))
        }
        _ => None,
    }
}

/// A cancel request's body: the protocol, and the key the client sent.
pub fn encode_cancel(protocol: &str, process_id: u32, secret: u32) -> Vec<u8> {
    let mut f = Fields::default();
    f.text(protocol)
        .number(process_id.into())
        .number(secret.into());
    f.into_bytes()
}

/// What [`encode_cancel`] wrote.
pub fn decode_cancel(body: &[u8]) -> Option<(String, u32, u32)> {
    let mut r = Reader::new(body);
    let protocol = r.text()?.to_owned();
    let key = (
        u32::try_from(r.number()?).ok()?,
        u32::try_from(r.number()?).ok()?,
    );
    r.at_end().then_some((protocol, key.0, key.1))
}

/// A client message's body.
pub fn encode_client(head: &ClientHead) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + head.state.len());
    put(&mut out, head.protocol.as_bytes());
    put(&mut out, head.cluster.as_bytes());
    put(&mut out, head.user.as_bytes());
    put(&mut out, head.database.as_bytes());
    put(&mut out, peer_text(&head.peer).as_bytes());
    put(&mut out, if head.unix { b"unix" } else { b"tcp" });
    put(&mut out, &head.state);
    out
}

/// What [`encode_client`] wrote; `None` for anything else.
pub fn decode_client(mut body: &[u8]) -> Option<ClientHead> {
    let body = &mut body;
    let head = ClientHead {
        protocol: text(body)?,
        cluster: text(body)?,
        user: text(body)?,
        database: text(body)?,
        peer: parse_peer(&text(body)?)?,
        unix: take(body)? == b"unix",
        state: take(body)?.to_vec(),
    };
    body.is_empty().then_some(head)
}

/// A protocol's snapshot of a session being written: fields in order,
/// each length-prefixed (the protocols share this one encoding).
#[derive(Debug, Default)]
pub struct Fields(Vec<u8>);

impl Fields {
    pub fn bytes(&mut self, field: &[u8]) -> &mut Fields {
        put(&mut self.0, field);
        self
    }

    pub fn text(&mut self, field: &str) -> &mut Fields {
        self.bytes(field.as_bytes())
    }

    pub fn number(&mut self, n: u64) -> &mut Fields {
        self.bytes(&n.to_be_bytes())
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

/// A snapshot [`Fields`] wrote, read back in the same order; each read is
/// `None` past its end or on a field of the wrong shape.
#[derive(Debug)]
pub struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    pub fn new(snapshot: &'a [u8]) -> Reader<'a> {
        Reader(snapshot)
    }

    pub fn bytes(&mut self) -> Option<&'a [u8]> {
        take(&mut self.0)
    }

    pub fn text(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.bytes()?).ok()
    }

    pub fn number(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.bytes()?.try_into().ok()?))
    }

    /// Every field was read.
    pub fn at_end(&self) -> bool {
        self.0.is_empty()
    }
}

/// Writes `bytes` with `fds` attached to their first byte (one
/// `sendmsg`), then whatever that call left unwritten. The upgrade's
/// listening sockets and the hand-over's clients both cross this way.
pub fn send_with_fds(
    mut stream: &UnixStream,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    let mut space = vec![0u8; rustix::cmsg_space!(ScmRights(fds.len().max(1)))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("the descriptors do not fit one message"));
    }
    let sent = sendmsg(
        stream,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::empty(),
    )?;
    // The descriptors went with the first byte; the rest is plain bytes.
    stream.write_all(&bytes[sent..])
}

/// Reads what one `recvmsg` gives into `buf`, with the descriptors that
/// came with it (close-on-exec; room for `max_fds`, the kernel closes any
/// beyond). Returns the bytes read (0 at the end of the stream).
pub fn recv_with_fds(
    stream: &UnixStream,
    buf: &mut [u8],
    max_fds: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = vec![0u8; rustix::cmsg_space!(ScmRights(max_fds.max(1)))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = recvmsg(
        stream,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    Ok((got.bytes, fds))
}

/// Sends one message: its head with `fd` (if any) in one `sendmsg`, then
/// its body.
pub fn send(
    mut stream: &UnixStream,
    kind: u8,
    body: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let mut head = [0u8; 5];
    head[..4].copy_from_slice(&(body.len() as u32).to_be_bytes());
    head[4] = kind;
    let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
    send_with_fds(stream, &head, &fds)?;
    stream.write_all(body)
}

/// One message received: its kind, body and descriptor.
pub type Message = (u8, Vec<u8>, Option<OwnedFd>);

/// Receives one message. `None` at the end of the stream (the old process
/// has exited).
pub fn recv(mut stream: &UnixStream) -> io::Result<Option<Message>> {
    let mut head = [0u8; 5];
    // One descriptor is sent; room for a few more, which are closed here.
    let (got, fds) = recv_with_fds(stream, &mut head, 4)?;
    if got == 0 {
        return Ok(None);
    }
    let fd = fds.into_iter().next();
    stream.read_exact(&mut head[got..])?;
    let len = u32::from_be_bytes(head[..4].try_into().expect("4 bytes")) as usize;
    if len > MAX_BODY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a hand-over message of {len} bytes"),
        ));
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    Ok(Some((head[4], body, fd)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn unix_peer() -> ClientPeer {
        ClientPeer::Unix(UnixPeer {
            socket: Arc::from(std::path::Path::new("/tmp/dir with space/.s.PGSQL.6432")),
            port: 6432,
            uid: Some(1000),
            gid: None,
            pid: Some(77),
        })
    }

    #[test]
    fn a_client_head_reads_back_as_written() {
        for (peer, unix) in [
            (ClientPeer::Tcp("127.0.0.1:50000".parse().unwrap()), false),
            (ClientPeer::Tcp("[::1]:1".parse().unwrap()), false),
            (unix_peer(), true),
        ] {
            let head = ClientHead {
                protocol: "postgres".into(),
                cluster: "main".into(),
                user: "app".into(),
                database: "".into(),
                peer,
                unix,
                state: vec![0, 1, 2, 255],
            };
            assert_eq!(decode_client(&encode_client(&head)), Some(head));
        }
    }

    #[test]
    fn a_cut_or_padded_body_is_refused() {
        let head = ClientHead {
            protocol: "mysql".into(),
            cluster: "c".into(),
            user: "u".into(),
            database: "d".into(),
            peer: unix_peer(),
            unix: true,
            state: b"state".to_vec(),
        };
        let body = encode_client(&head);
        for cut in 0..body.len() {
            assert_eq!(decode_client(&body[..cut]), None, "cut at {cut}");
        }
        let mut padded = body.clone();
        padded.push(0);
        assert_eq!(decode_client(&padded), None);
    }

    #[test]
    fn snapshot_fields_read_back_in_order_and_not_past_their_end() {
        let mut f = Fields::default();
        f.number(3).text("app").bytes(&[0, 255]).number(u64::MAX);
        let bytes = f.into_bytes();
        let mut r = Reader::new(&bytes);
        assert_eq!(r.number(), Some(3));
        assert_eq!(r.text(), Some("app"));
        assert_eq!(r.bytes(), Some(&[0u8, 255][..]));
        assert!(!r.at_end());
        assert_eq!(r.number(), Some(u64::MAX));
        assert!(r.at_end());
        assert_eq!(r.bytes(), None);
        let mut r = Reader::new(&bytes);
        r.number();
        assert_eq!(r.number(), None, "text is not a number");
    }

    #[test]
    fn a_cancel_reads_back() {
        let body = encode_cancel("postgres", 7, u32::MAX);
        assert_eq!(decode_cancel(&body), Some(("postgres".into(), 7, u32::MAX)));
        assert_eq!(decode_cancel(&body[..body.len() - 1]), None);
    }

    #[test]
    fn a_tally_reads_back_and_nonsense_does_not() {
        let t = Tally {
            handed_over: 7,
            left_tls: 1,
            left_pinned: 2,
            closed: 3,
        };
        assert_eq!(Tally::decode(&t.encode()), Some(t));
        assert_eq!(Tally::decode(b"handed_over=x"), None);
    }

    /// A socket crosses with its message, and messages keep their
    /// boundaries when several wait to be read.
    #[test]
    fn messages_carry_their_socket_in_order() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mine, theirs) = UnixStream::pair().unwrap();
        send(&a, CLIENT, b"first", Some(theirs.as_fd())).unwrap();
        send(&a, TALLY, b"second", None).unwrap();
        send(&a, CLIENT, b"", Some(theirs.as_fd())).unwrap();
        drop(theirs);
        let (kind, body, fd) = recv(&b).unwrap().unwrap();
        assert_eq!((kind, &body[..]), (CLIENT, &b"first"[..]));
        let mut got = UnixStream::from(fd.expect("a socket"));
        (&mine).write_all(b"hello").unwrap();
        let mut buf = [0u8; 5];
        got.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        let (kind, body, fd) = recv(&b).unwrap().unwrap();
        assert_eq!(
            (kind, &body[..], fd.is_none()),
            (TALLY, &b"second"[..], true)
        );
        let (kind, body, fd) = recv(&b).unwrap().unwrap();
        assert_eq!((kind, body.len(), fd.is_some()), (CLIENT, 0, true));
        drop(a);
        assert!(recv(&b).unwrap().is_none(), "the end of the stream");
    }
}
