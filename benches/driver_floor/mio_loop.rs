//! Driver (b): mio, one loop per worker. One thread, one `mio::Poll`; the
//! listener and every client and server socket are registered
//! edge-triggered (mio's only mode) for reading and writing at once, so no
//! socket is ever re-registered. On readiness the handler reads with `read`
//! until `WouldBlock` and writes each read to the peer at once; bytes the
//! peer's buffer would not take wait in the direction's buffer, and that
//! direction is not read again until the peer's writable event has flushed
//! them. No tokio, no tasks, no wakers, no timers.
//!
//! With `short`, a read shorter than the buffer ends the reading (epoll(7):
//! for a stream, a short read means its input is exhausted, and data
//! arriving later raises a new edge): one `recv` per event instead of two.

use std::io::{self, ErrorKind, Read, Write};
use std::net::SocketAddr;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

use crate::BUF;

/// The listener's token; a pair in slot `i` has tokens `2i + 1` (client)
/// and `2i + 2` (server).
const LISTENER: Token = Token(0);

/// One direction of a pair: its buffer and the unwritten bytes in it.
struct Direction {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

/// A client and the server connection opened for it.
struct Pair {
    /// `[client, server]`.
    socks: [TcpStream; 2],
    /// `dirs[s]` carries what side `s` sends to side `1 - s`.
    dirs: [Direction; 2],
    /// A short read ends the reading (the module's doc).
    short: bool,
}

/// Runs the forwarder until the process is killed.
pub fn run(listen: SocketAddr, server: SocketAddr, short: bool) -> io::Result<()> {
    let mut poll = Poll::new()?;
    let mut listener = TcpListener::bind(listen)?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    let mut pairs: Vec<Option<Pair>> = Vec::new();
    let mut events = Events::with_capacity(1024);
    loop {
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        for event in events.iter() {
            if event.token() == LISTENER {
                accept(&poll, &listener, server, short, &mut pairs)?;
                continue;
            }
            let slot = (event.token().0 - 1) / 2;
            let side = (event.token().0 - 1) % 2;
            let Some(pair) = pairs.get_mut(slot).and_then(Option::as_mut) else {
                continue; // closed earlier in this batch
            };
            let mut open = true;
            if event.is_writable() || event.is_write_closed() {
                // The peer of `side` sends through dirs[1 - side].
                open &= flush(pair, 1 - side).is_ok();
            }
            if open && (event.is_readable() || event.is_read_closed() || event.is_error()) {
                open &= forward(pair, side).unwrap_or(false);
            }
            if !open {
                close(&poll, &mut pairs[slot]);
            }
        }
    }
}

/// Accepts every pending client, opening its server connection.
fn accept(
    poll: &Poll,
    listener: &TcpListener,
    server: SocketAddr,
    short: bool,
    pairs: &mut Vec<Option<Pair>>,
) -> io::Result<()> {
    loop {
        let (client, _) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(e),
        };
        // A blocking connect on loopback returns at once; it is paid per
        // login, which the measurement cancels out.
        let Ok(std_server) = std::net::TcpStream::connect(server) else {
            continue; // the client is dropped: closed
        };
        std_server.set_nonblocking(true)?;
        let server_sock = TcpStream::from_std(std_server);
        client.set_nodelay(true)?;
        server_sock.set_nodelay(true)?;
        let slot = match pairs.iter().position(Option::is_none) {
            Some(s) => s,
            None => {
                pairs.push(None);
                pairs.len() - 1
            }
        };
        let mut pair = Pair {
            socks: [client, server_sock],
            dirs: [Direction::new(), Direction::new()],
            short,
        };
        let both = Interest::READABLE | Interest::WRITABLE;
        for (side, sock) in pair.socks.iter_mut().enumerate() {
            poll.registry()
                .register(sock, Token(2 * slot + 1 + side), both)?;
        }
        pairs[slot] = Some(pair);
    }
}

impl Direction {
    fn new() -> Direction {
        Direction {
            buf: vec![0u8; BUF].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }
}

/// Reads side `side` until `WouldBlock` and writes each read to its peer
/// at once. False when the side has closed. Stops early, leaving the
/// socket's edge to the peer's writable event, when the peer is full.
fn forward(pair: &mut Pair, side: usize) -> io::Result<bool> {
    let [client, server] = &mut pair.socks;
    let (from, to) = if side == 0 {
        (client, server)
    } else {
        (server, client)
    };
    let dir = &mut pair.dirs[side];
    loop {
        if dir.start != dir.end {
            return Ok(true); // still flushing: read again once flushed
        }
        let n = match from.read(&mut dir.buf) {
            Ok(0) => return Ok(false),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(true),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        dir.start = 0;
        dir.end = n;
        write_out(to, dir)?;
        if pair.short && n < dir.buf.len() {
            return Ok(true);
        }
    }
}

/// Flushes what side `side` sent and its peer had no room for, then goes on
/// reading `side` (its readable edge may have passed while it waited).
fn flush(pair: &mut Pair, side: usize) -> io::Result<bool> {
    if pair.dirs[side].start == pair.dirs[side].end {
        return Ok(true);
    }
    let to = &mut pair.socks[1 - side];
    write_out(to, &mut pair.dirs[side])?;
    if pair.dirs[side].start != pair.dirs[side].end {
        return Ok(true);
    }
    forward(pair, side)
}

/// Writes the direction's unwritten bytes until done or `WouldBlock`.
fn write_out(to: &mut TcpStream, dir: &mut Direction) -> io::Result<()> {
    while dir.start != dir.end {
        match to.write(&dir.buf[dir.start..dir.end]) {
            Ok(n) => dir.start += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    dir.start = 0;
    dir.end = 0;
    Ok(())
}

/// Deregisters and drops both sockets of a pair.
fn close(poll: &Poll, slot: &mut Option<Pair>) {
    if let Some(mut pair) = slot.take() {
        for sock in &mut pair.socks {
            let _ = poll.registry().deregister(sock);
        }
    }
}
