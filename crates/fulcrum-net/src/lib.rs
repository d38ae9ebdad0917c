//! Fulcrum's connection type: one socket and the two buffers that go with
//! it, for the clients and server connections of PostgreSQL and MySQL and
//! for the admin console. PostgreSQL's logins (a client's startup and
//! authentication, a server connection's connect and authentication) and
//! the console's read and write the raw stream first, with a buffer the
//! `Connection` then takes over; MariaDB's health probes, MySQL's
//! `auth_query` and catalog look-ups and its change stream talk through
//! their driver (mysql_async).
//!
//! It owns:
//! - frame intake: bytes read into `read_buf` in chunks, and the length of
//!   the whole frame at its front, by a protocol's `Framing` (a pure
//!   function over the header);
//! - write coalescing: what is queued in `write_buf` goes out in one write
//!   per `flush`;
//! - back-pressure: `may_read` says when a peer whose work is held must not
//!   be read further, so one client cannot make Fulcrum buffer without end.
//!
//! It is generic over the stream (`AsyncRead + AsyncWrite + Unpin`): a
//! `TcpStream`, a `UnixStream` or a TLS stream (`fulcrum_tls`'s client and
//! server streams, each any of these or an in-process duplex). Its two
//! buffers are public fields: the protocols queue into `write_buf` and take
//! frames off `read_buf` themselves. It never knows a wire protocol beyond
//! what its `Framing` says, and nothing of SQL or routing.
//!
//! An idle client holds no read buffer: `poll_read_idle` gives an empty
//! one back to this thread's spares (`spare.rs`) when the socket has
//! nothing, and the next read takes one.
//!
//! Beside it, `PendingLogins`: the cap on connections still logging in;
//! `within`: the deadline on opening a server connection; `SessionTimer`:
//! a session's idle or query timer, made when first armed; `dns`: the
//! cache of server names (`dns_max_ttl`) and a connect that tries each
//! address of a name; and the client listener (`listener.rs`): TCP and an
//! optional Unix-domain socket accepted as one, each client with its
//! peer, and the socket file's life.

#![forbid(unsafe_code)]

mod deadline;
pub mod dns;
pub mod listener;
mod pending;
mod spare;

pub use deadline::{within, SessionTimer};
pub use listener::{Accepted, ClientListener, ClientPeer, UnixPeer};
pub use pending::{PendingLogins, PendingTicket};
pub use spare::SPARE_MAX;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Bytes asked of the socket per read by default (the buffer grows by
/// this much when less than a quarter of it is free).
pub const READ_CHUNK: usize = 8 * 1024;

/// A client's read buffer and reads: statements are small (PgBouncer's
/// `pkt_buf` is 4 kB), and an idle client gives its buffer back
/// (`poll_read_idle`). A larger message gets room for all of it as it
/// arrives (`reserve_for`).
pub const CLIENT_READ_CHUNK: usize = 2 * 1024;

/// How a protocol delimits its frames.
pub trait Framing {
    type Error;
    /// The total length of the frame at the front of `buf` once its header
    /// is there (`None` until then); an error for a malformed header or a
    /// declared length over `max`.
    fn frame_len(buf: &[u8], max: u64) -> Result<Option<usize>, Self::Error>;
}

/// The most reserved ahead of the bytes of a partial frame (a declared
/// length is the peer's word, not yet its bytes) until the peer has sent an
/// eighth of it.
pub const RESERVE_AHEAD: usize = 1024 * 1024;

/// How much room to reserve for a frame of `total` bytes of which `len`
/// have arrived: [`RESERVE_AHEAD`] at a time (the buffer grows with what
/// arrives) until an eighth of the frame is there, then all that is
/// missing at once (one allocation of the frame's size, not a series of
/// copies). A header alone never reserves more than 1 MiB; a peer must
/// send an eighth of a frame before Fulcrum holds room for all of it.
pub fn reserve_ahead(len: usize, total: usize) -> usize {
    let missing = total.saturating_sub(len);
    if missing <= RESERVE_AHEAD || len >= (total / 8).max(RESERVE_AHEAD) {
        missing
    } else {
        RESERVE_AHEAD
    }
}

/// A socket with its read and write buffers.
#[derive(Debug)]
pub struct Connection<S> {
    stream: S,
    /// Room made in `read_buf` before a read when it runs low.
    chunk: usize,
    /// Bytes read and not yet taken, frames at the front.
    pub read_buf: BytesMut,
    /// Bytes queued for the peer, written by `flush`.
    pub write_buf: BytesMut,
    /// The stream took bytes it has not sent yet (a TLS stream's records).
    unflushed: bool,
    /// Bytes handed to the stream so far.
    written: u64,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Connection<S> {
    /// A connection with empty buffers (allocated at first use, so an idle
    /// connection holds none).
    pub fn new(stream: S) -> Connection<S> {
        Connection::with_read_buf(stream, BytesMut::new())
    }

    /// A connection whose first bytes were already read (e.g. during a
    /// login done before the session took the socket).
    pub fn with_read_buf(stream: S, read_buf: BytesMut) -> Connection<S> {
        Connection {
            stream,
            chunk: READ_CHUNK,
            read_buf,
            write_buf: BytesMut::new(),
            unflushed: false,
            written: 0,
        }
    }

    /// Reads in chunks of `chunk` bytes (servers stream large results:
    /// fewer, larger reads).
    pub fn with_chunk(mut self, chunk: usize) -> Connection<S> {
        self.chunk = chunk.max(1024);
        self
    }

    /// Reads what the socket has (waiting for at least one byte); 0 at EOF.
    pub async fn read_more(&mut self) -> io::Result<usize> {
        self.make_room();
        self.stream.read_buf(&mut self.read_buf).await
    }

    /// Polls one read into `read_buf` (for a loop that also watches the
    /// other side: a read never waits behind a write, nor a write behind a
    /// read).
    pub fn poll_read_more(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.make_room();
        let read = self.stream.read_buf(&mut self.read_buf);
        tokio::pin!(read);
        read.poll(cx)
    }

    /// [`poll_read_more`](Self::poll_read_more) for a peer that owes
    /// nothing (a client between units): when the socket has nothing and
    /// nothing is buffered, the read buffer goes back to this thread's
    /// spares, so an idle client holds none; the next read takes one (a
    /// pop, not an allocation, while the thread has spares).
    pub fn poll_read_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let r = self.poll_read_more(cx);
        if r.is_pending() && self.read_buf.is_empty() {
            spare::give(std::mem::take(&mut self.read_buf));
        }
        r
    }

    /// Room for one read: a chunk more when less than a quarter of one is
    /// free (a spare buffer when none is held).
    fn make_room(&mut self) {
        if self.read_buf.capacity() == 0 {
            self.read_buf = spare::take(self.chunk);
        } else if self.read_buf.capacity() - self.read_buf.len() < self.chunk / 4 {
            self.read_buf.reserve(self.chunk);
        }
    }

    /// Polls one write of the front of `buf` (this connection's queue or a
    /// buffer kept elsewhere), removing what was written from it.
    pub fn poll_write_from(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.stream).poll_write(cx, buf) {
            Poll::Ready(Ok(0)) if !buf.is_empty() => {
                Poll::Ready(Err(io::ErrorKind::WriteZero.into()))
            }
            Poll::Ready(Ok(n)) => {
                if n == buf.len() {
                    // All of it: cleared, not advanced, so the buffer's room
                    // starts at its front again and the next queued frame
                    // fits without `reserve` moving anything (issue 44).
                    buf.clear();
                } else {
                    buf.advance(n);
                }
                self.written += n as u64;
                // A stream that buffers (TLS records) is pushed on at once;
                // what it cannot send now is `unflushed` until it can.
                self.unflushed = true;
                match self.poll_flush_stream(cx) {
                    Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                    _ => Poll::Ready(Ok(n)),
                }
            }
            other => other,
        }
    }

    /// Polls the stream's own buffer out, when it holds something.
    fn poll_flush_stream(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.unflushed {
            return Poll::Ready(Ok(()));
        }
        let r = Pin::new(&mut self.stream).poll_flush(cx);
        if matches!(r, Poll::Ready(Ok(()))) {
            self.unflushed = false;
        }
        r
    }

    /// Where the end of `write_buf` is in everything ever queued for the
    /// peer: bytes written plus bytes queued. It only grows (a session
    /// that checksums what its client received reads new output by it).
    pub fn output_position(&self) -> u64 {
        self.written + self.write_buf.len() as u64
    }

    /// Bytes are waiting to go to the peer: queued here, or taken by a
    /// stream that buffers (TLS) and not sent yet.
    pub fn has_output(&self) -> bool {
        !self.write_buf.is_empty() || self.unflushed
    }

    /// Polls one write of what is queued in `write_buf` (or, when nothing
    /// is queued, what the stream itself still holds).
    pub fn poll_write_queued(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.write_buf.is_empty() {
            return self.poll_flush_stream(cx).map_ok(|()| 0);
        }
        let mut queued = std::mem::take(&mut self.write_buf);
        let r = self.poll_write_from(cx, &mut queued);
        self.write_buf = queued;
        r
    }

    /// Writes as much of `buf` as the socket takes now, without waiting;
    /// the rest stays in `buf` for the loop to write when it can.
    pub fn write_now_from(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        let mut cx = Context::from_waker(Waker::noop());
        let mut written = 0;
        while !buf.is_empty() {
            match self.poll_write_from(&mut cx, buf) {
                Poll::Ready(Ok(n)) => written += n,
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => break,
            }
        }
        if let Poll::Ready(Err(e)) = self.poll_flush_stream(&mut cx) {
            return Err(e);
        }
        Ok(written)
    }

    /// Writes as much of `write_buf` as the socket takes now.
    pub fn write_now(&mut self) -> io::Result<usize> {
        let mut queued = std::mem::take(&mut self.write_buf);
        let r = self.write_now_from(&mut queued);
        self.write_buf = queued;
        r
    }

    /// Back-pressure: whether to read from this peer now. While its work is
    /// `held` (waiting for a replica, a position or a pool slot), it is read
    /// only until `limit` bytes (the largest message allowed) plus one read
    /// are buffered; then the socket's own buffers push back on the peer.
    pub fn may_read(&self, held: bool, limit: u64) -> bool {
        !held || (self.read_buf.len() as u64) <= limit.saturating_add(self.chunk as u64)
    }

    /// The length of the complete frame at the front of `read_buf`, if it
    /// has all arrived; room is reserved for the rest of a partial one.
    pub fn complete_frame<F: Framing>(&mut self, max: u64) -> Result<Option<usize>, F::Error> {
        match F::frame_len(&self.read_buf, max)? {
            Some(total) if self.read_buf.len() >= total => Ok(Some(total)),
            Some(total) => {
                self.reserve_for(total);
                Ok(None)
            }
            None => Ok(None),
        }
    }

    /// Room for a frame of `total` bytes whose start is buffered, reserved
    /// as its bytes arrive ([`reserve_ahead`]): a header declaring a large
    /// frame costs nothing until the peer sends it.
    pub fn reserve_for(&mut self, total: usize) {
        let ahead = reserve_ahead(self.read_buf.len(), total);
        self.read_buf.reserve(ahead);
    }

    /// Takes `n` bytes from the front of `read_buf`.
    pub fn take(&mut self, n: usize) -> BytesMut {
        self.read_buf.split_to(n)
    }

    /// Queues bytes for the peer (coalesced until `flush`).
    pub fn queue(&mut self, bytes: &[u8]) {
        self.write_buf.extend_from_slice(bytes);
    }

    /// Writes everything queued, in one write when the socket takes it.
    pub async fn flush(&mut self) -> io::Result<()> {
        if !self.write_buf.is_empty() {
            let r = self.stream.write_all(&self.write_buf).await;
            self.written += self.write_buf.len() as u64;
            self.write_buf.clear();
            r?;
        }
        self.stream.flush().await?;
        self.unflushed = false;
        Ok(())
    }

    /// Writes `bytes` now, ahead of nothing queued (the caller flushed or
    /// means to bypass the queue, e.g. a fatal error).
    pub async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes).await?;
        self.written += bytes.len() as u64;
        self.stream.flush().await?;
        self.unflushed = false;
        Ok(())
    }

    pub fn stream(&self) -> &S {
        &self.stream
    }

    pub fn stream_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// The stream and whatever was read but not taken.
    pub fn into_parts(self) -> (S, BytesMut) {
        (self.stream, self.read_buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_for_a_large_frame_follows_what_arrived() {
        const MB: usize = 1024 * 1024;
        // A bare header: 1 MiB at most, however large the frame says it is.
        assert_eq!(reserve_ahead(5, 200 * MB), RESERVE_AHEAD);
        // A small frame: all of it.
        assert_eq!(reserve_ahead(5, 1000), 995);
        // An eighth of a large one arrived: the rest at once.
        assert_eq!(reserve_ahead(25 * MB, 200 * MB), 175 * MB);
        assert_eq!(reserve_ahead(24 * MB, 200 * MB), RESERVE_AHEAD);
    }

    /// A test framing: one length byte, then that many bytes.
    struct LenByte;

    impl Framing for LenByte {
        type Error = String;
        fn frame_len(buf: &[u8], max: u64) -> Result<Option<usize>, String> {
            match buf.first() {
                None => Ok(None),
                Some(&n) if n as u64 > max => Err(format!("{n} over {max}")),
                Some(&n) => Ok(Some(1 + n as usize)),
            }
        }
    }

    #[tokio::test]
    async fn frames_are_taken_whole_and_writes_coalesced() {
        let (a, b) = tokio::io::duplex(1024);
        let mut near = Connection::new(a);
        let mut far = Connection::new(b);
        far.queue(&[3, b'a', b'b']);
        far.flush().await.unwrap();
        near.read_more().await.unwrap();
        assert_eq!(near.complete_frame::<LenByte>(10).unwrap(), None, "partial");
        far.queue(&[b'c', 1]);
        far.queue(b"z");
        assert_eq!(far.write_buf.len(), 3, "queued, not written");
        far.flush().await.unwrap();
        assert!(far.write_buf.is_empty());
        while near.read_buf.len() < 6 {
            near.read_more().await.unwrap();
        }
        assert_eq!(near.complete_frame::<LenByte>(10).unwrap(), Some(4));
        assert_eq!(&near.take(4)[..], &[3, b'a', b'b', b'c']);
        assert_eq!(near.complete_frame::<LenByte>(10).unwrap(), Some(2));
        assert_eq!(&near.take(2)[..], &[1, b'z']);
        far.queue(&[200]);
        far.flush().await.unwrap();
        near.read_more().await.unwrap();
        assert!(near.complete_frame::<LenByte>(10).is_err(), "over max");
    }

    #[tokio::test]
    async fn a_held_peer_is_read_only_up_to_the_limit_plus_one_read() {
        let (a, _b) = tokio::io::duplex(64);
        let mut c = Connection::new(a);
        assert!(c.may_read(false, 0), "nothing held: always read");
        assert!(c.may_read(true, 100));
        c.read_buf.extend_from_slice(&vec![0u8; 100 + READ_CHUNK]);
        assert!(c.may_read(true, 100), "at the limit plus one read");
        c.read_buf.extend_from_slice(&[0]);
        assert!(!c.may_read(true, 100), "past it: stop reading");
        assert!(c.may_read(false, 100), "no longer held: read again");
    }

    #[tokio::test]
    async fn writes_now_take_what_the_socket_takes_and_keep_the_rest() {
        let (a, b) = tokio::io::duplex(100);
        let mut near = Connection::new(a);
        let mut far = Connection::new(b);
        near.queue(&[7u8; 250]);
        assert_eq!(near.write_now().unwrap(), 100, "the pipe holds 100");
        assert_eq!(near.write_buf.len(), 150, "the rest is kept, in order");
        assert_eq!(near.write_now().unwrap(), 0, "nothing more fits now");
        while far.read_buf.len() < 100 {
            far.read_more().await.unwrap();
        }
        let wrote = std::future::poll_fn(|cx| near.poll_write_queued(cx))
            .await
            .unwrap();
        assert_eq!(wrote, 100);
        assert_eq!(near.write_buf.len(), 50);
        let mut other = BytesMut::with_capacity(64);
        other.extend_from_slice(b"xyz");
        far.take(100);
        while far.read_buf.len() < 100 {
            far.read_more().await.unwrap();
        }
        far.take(100);
        near.write_now().unwrap();
        assert_eq!(near.write_now_from(&mut other).unwrap(), 3);
        assert!(other.is_empty());
        assert_eq!(
            other.capacity(),
            64,
            "written whole: its room starts at the front again, no reserve needed"
        );
    }

    #[tokio::test]
    async fn an_idle_read_holds_no_buffer_and_the_next_read_takes_one_back() {
        let (a, b) = tokio::io::duplex(64);
        let mut near = Connection::new(a).with_chunk(CLIENT_READ_CHUNK);
        let mut far = Connection::new(b);
        let mut cx = Context::from_waker(Waker::noop());
        let kept = spare::kept();
        assert!(near.poll_read_idle(&mut cx).is_pending());
        assert_eq!(
            near.read_buf.capacity(),
            0,
            "nothing to read: no buffer held"
        );
        assert_eq!(spare::kept(), kept + 1, "it waits in this thread's spares");
        far.queue(b"abc");
        far.flush().await.unwrap();
        std::future::poll_fn(|cx| near.poll_read_idle(cx))
            .await
            .unwrap();
        assert_eq!(&near.read_buf[..], b"abc");
        assert!(near.read_buf.capacity() >= CLIENT_READ_CHUNK);
        assert_eq!(spare::kept(), kept, "the spare was taken back");
        // Something buffered: the buffer is kept while the read waits.
        assert!(near.poll_read_idle(&mut cx).is_pending());
        assert_eq!(&near.read_buf[..], b"abc");
        near.take(3);
        assert!(near.poll_read_idle(&mut cx).is_pending());
        assert_eq!(near.read_buf.capacity(), 0);
    }

    #[test]
    fn spares_are_bounded_and_large_buffers_freed() {
        let kept = spare::kept();
        spare::give(BytesMut::with_capacity(64 * 1024));
        assert_eq!(spare::kept(), kept, "a grown buffer is freed");
        for _ in 0..SPARE_MAX + 5 {
            spare::give(BytesMut::with_capacity(CLIENT_READ_CHUNK));
        }
        assert_eq!(spare::kept(), SPARE_MAX);
        let taken = spare::take(CLIENT_READ_CHUNK);
        assert!(taken.capacity() >= CLIENT_READ_CHUNK && taken.is_empty());
        assert_eq!(spare::kept(), SPARE_MAX - 1);
    }

    #[tokio::test]
    async fn eof_reads_zero() {
        let (a, b) = tokio::io::duplex(64);
        drop(b);
        let mut c = Connection::new(a);
        assert_eq!(c.read_more().await.unwrap(), 0);
    }
}
