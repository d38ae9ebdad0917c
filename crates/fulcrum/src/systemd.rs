//! systemd's readiness protocol (`Type=notify`), written by hand: one
//! datagram to the socket named by `$NOTIFY_SOCKET` (a path, or an abstract
//! name written with a leading `@`). `READY=1` once every listener is open,
//! `RELOADING=1` / `READY=1` around a reload, `STOPPING=1` when draining
//! starts. Without the variable (not run by systemd), nothing is sent.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (newline-separated `KEY=value` lines) to systemd, if it
/// is listening; a failure is logged, never fatal.
pub fn notify(state: &str) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send(&socket, state) {
        tracing::warn!(socket = ?socket, error = %e, "cannot notify systemd");
    }
}

fn send(socket: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    let sender = UnixDatagram::unbound()?;
    let bytes = socket.as_encoded_bytes();
    match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sender.send_to_addr(state.as_bytes(), &addr)?;
        }
        None => {
            sender.send_to(state.as_bytes(), socket)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_reaches_a_path_socket() {
        let path = std::env::temp_dir().join(format!("fulcrum-notify-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let receiver = UnixDatagram::bind(&path).unwrap();
        send(path.as_os_str(), "READY=1\nSTATUS=test").unwrap();
        let mut buf = [0u8; 64];
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=test");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_datagram_reaches_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("fulcrum-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let receiver = UnixDatagram::bind_addr(&addr).unwrap();
        send(std::ffi::OsStr::new(&format!("@{name}")), "STOPPING=1").unwrap();
        let mut buf = [0u8; 64];
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }
}
