//! Driver (a): tokio, one task per client, lean. A current_thread runtime
//! (Fulcrum's `workers = 1`); each task owns a client socket and the server
//! socket opened for it at accept. The task waits for either to be readable
//! with one `poll_fn` over `poll_read_ready` (no `select!`, no `read_buf`
//! future), drains the ready side with `try_read` until `WouldBlock`, and
//! writes each read to the peer with `try_write` at once, waiting for
//! writability only when the peer's buffer is full. One reusable buffer per
//! direction; no timers.
//!
//! With `short`, a read shorter than the buffer is taken as the end of what
//! the socket holds (epoll(7): for a stream, a short read means its input is
//! exhausted, and data arriving later raises a new edge), so the second
//! `recv` that would only return `WouldBlock` is skipped. Tokio keeps a
//! socket's readiness until it sees `WouldBlock`, so the read is done inside
//! `try_io`, and a short read reports `WouldBlock` to it to clear the
//! readiness (tokio clears it only if no event came in meanwhile).

use std::future::poll_fn;
use std::io::{self, ErrorKind};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::task::Poll;

use tokio::io::Interest;
use tokio::net::{TcpListener, TcpStream};

use crate::BUF;

/// Runs the forwarder until the process is killed. `time` enables the
/// runtime's time driver (its wheel is consulted at every park) as Fulcrum's
/// runtime does; without it the runtime parks on epoll alone. `short`: see
/// the module's doc.
pub fn run(listen: SocketAddr, server: SocketAddr, time: bool, short: bool) -> io::Result<()> {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_io();
    if time {
        builder.enable_time();
    }
    builder.build()?.block_on(async move {
        let listener = TcpListener::bind(listen).await?;
        loop {
            let (client, _) = listener.accept().await?;
            tokio::spawn(async move {
                // A client whose server cannot be reached, or a pair one of
                // whose sides failed, is simply closed: this is a bench.
                let _ = pair(client, server, short).await;
            });
        }
    })
}

/// Forwards between one client and its own server connection until either
/// side closes.
async fn pair(client: TcpStream, server: SocketAddr, short: bool) -> io::Result<()> {
    let server = TcpStream::connect(server).await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let mut to_server = vec![0u8; BUF];
    let mut to_client = vec![0u8; BUF];
    loop {
        // Both sockets polled in one future: the task is woken by whichever
        // turns readable first. An error counts as ready, for `try_read` to
        // report it.
        let (from_client, from_server) = poll_fn(|cx| {
            let c = client.poll_read_ready(cx).is_ready();
            let s = server.poll_read_ready(cx).is_ready();
            if c || s {
                Poll::Ready((c, s))
            } else {
                Poll::Pending
            }
        })
        .await;
        if from_client && !pump(&client, &server, &mut to_server, short).await? {
            return Ok(());
        }
        if from_server && !pump(&server, &client, &mut to_client, short).await? {
            return Ok(());
        }
    }
}

/// Reads `from` until `WouldBlock` (or, with `short`, a short read),
/// writing each read to `to` at once. False when `from` has closed.
async fn pump(from: &TcpStream, to: &TcpStream, buf: &mut [u8], short: bool) -> io::Result<bool> {
    loop {
        let read = if short {
            recv_once(from, buf)
        } else {
            from.try_read(buf).map(|n| (n, false))
        };
        let (n, drained) = match read {
            Ok((0, _)) => return Ok(false),
            Ok(read) => read,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(true),
            Err(e) => return Err(e),
        };
        write_all(to, &buf[..n]).await?;
        if drained {
            return Ok(true);
        }
    }
}

/// One `recv` inside `try_io`: the bytes read, and whether the read was
/// short (the socket drained, its readiness cleared).
fn recv_once(from: &TcpStream, buf: &mut [u8]) -> io::Result<(usize, bool)> {
    let mut short = None;
    let read = from.try_io(Interest::READABLE, || {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes, and the
        // descriptor is `from`'s, open for as long as `from` is borrowed.
        let n = unsafe { libc::recv(from.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
        if n > 0 && n < buf.len() {
            short = Some(n);
            return Err(ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match (read, short) {
        (_, Some(n)) => Ok((n, true)),
        (read, None) => read.map(|n| (n, false)),
    }
}

/// Writes all of `bytes`, trying first and waiting for writability only
/// when the socket's buffer is full (never, at `pgbench -S`'s sizes).
async fn write_all(to: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match to.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock => to.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
