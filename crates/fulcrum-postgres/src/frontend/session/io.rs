//! One step of the forwarding loop's socket I/O: whichever of the four
//! directions (client in and out, server in and out) is ready first, writes
//! before reads.

use super::*;

/// One step of I/O on the client and its server, whichever is ready first:
/// writes before reads, so what is owed drains before more is taken.
pub(super) enum Io {
    ClientRead(std::io::Result<usize>),
    ServerRead(std::io::Result<usize>),
    ClientWrote(std::io::Result<usize>),
    ServerWrote(std::io::Result<usize>),
}

pub(super) fn poll_io(
    cx: &mut std::task::Context<'_>,
    client: &mut Connection<ClientStream>,
    server: Option<&mut Checkout<ServerConn>>,
    to_server: &mut BytesMut,
    read_client: bool,
    read_server: bool,
    write_client: bool,
) -> std::task::Poll<Io> {
    use std::task::Poll::Ready;
    let attached = server.is_some();
    if let Some(server) = server {
        if !to_server.is_empty() {
            if let Ready(r) = server.io.poll_write_from(cx, to_server) {
                return Ready(Io::ServerWrote(r));
            }
        }
        if read_server {
            if let Ready(r) = server.io.poll_read_more(cx) {
                return Ready(Io::ServerRead(r));
            }
        }
    }
    if write_client && client.has_output() {
        if let Ready(r) = client.poll_write_queued(cx) {
            return Ready(Io::ClientWrote(r));
        }
    }
    if read_client {
        // Between units (no server attached) the client is idle: while it
        // sends nothing it holds no read buffer.
        let read = if attached {
            client.poll_read_more(cx)
        } else {
            client.poll_read_idle(cx)
        };
        if let Ready(r) = read {
            return Ready(Io::ClientRead(r));
        }
    }
    std::task::Poll::Pending
}
