//! What the daemon tells systemd when systemd runs it (`Type=notify` in
//! `dist/livenessd.service`): that it is ready, once its sources are loaded, its store open
//! and its socket listening. `systemctl start` and `restart` return only then, and units
//! ordered after livenessd start only then. Outside systemd (no `NOTIFY_SOCKET`) nothing
//! is sent.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Sends `READY=1` with a one-line `STATUS=` (shown by `systemctl status`) to the socket
/// named by `NOTIFY_SOCKET`, if there is one. A failure is logged: systemd then times the
/// start out, which says more than anything the daemon could do about it.
pub fn notify_ready(status: &str) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let message = format!("READY=1\nSTATUS={}", status.replace('\n', " "));
    if let Err(e) = send(&socket.to_string_lossy(), message.as_bytes()) {
        tracing::warn!(error = %e, socket = %socket.to_string_lossy(), "cannot tell systemd that the daemon is ready");
    }
}

/// One datagram to `socket`: a path, or an abstract name written `@name`.
fn send(socket: &str, message: &[u8]) -> io::Result<()> {
    let address = match socket.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name)?
        }
        None => SocketAddr::from_pathname(socket)?,
    };
    let sent = UnixDatagram::unbound()?.send_to_addr(message, &address)?;
    if sent != message.len() {
        return Err(io::Error::other("the notification was cut short"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_reaches_a_path_or_an_abstract_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let systemd = UnixDatagram::bind(&path).unwrap();
        send(path.to_str().unwrap(), b"READY=1\nSTATUS=up").unwrap();
        let mut buf = [0u8; 64];
        let n = systemd.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=up");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("liveness-notify-test-{}", std::process::id());
        let systemd =
            UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
        send(&format!("@{name}"), b"READY=1").unwrap();
        let n = systemd.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        assert!(send(dir.path().join("absent").to_str().unwrap(), b"READY=1").is_err());
    }
}
