//! The systemd readiness protocol, by hand (no libsystemd): under a `Type=notify`
//! unit, systemd passes `$NOTIFY_SOCKET`, a unix datagram socket (a path, or an
//! abstract name written with a leading '@'), and waits for one datagram saying
//! `READY=1` before it counts the service as started. `STOPPING=1` tells it a clean
//! stop has begun. Without the variable nothing is sent: a node run by hand or by
//! `drove up` is unaffected.
use std::os::unix::net::UnixDatagram;

/// Send `state` (newline-separated `KEY=VALUE` lines) to `$NOTIFY_SOCKET` if it is
/// set. A failure is logged, never fatal: the node serves either way, and systemd
/// then reports the start as timed out, which says enough.
pub fn notify(state: &str) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let socket = socket.to_string_lossy().into_owned();
    if let Err(e) = send(&socket, state) {
        tracing::warn!("cannot notify systemd at {socket} ({state:?}): {e}");
    }
}

/// Send one datagram with `state` to the socket named `socket`.
fn send(socket: &str, state: &str) -> std::io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    let sent = match socket.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
            sock.send_to_addr(state.as_bytes(), &addr)?
        }
        None if socket.starts_with('/') => sock.send_to(state.as_bytes(), socket)?,
        None => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not an absolute path nor an abstract socket name",
            ))
        }
    };
    if sent != state.len() {
        return Err(std::io::Error::other("short datagram"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn recv(l: &UnixDatagram) -> String {
        l.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 512];
        let n = l.recv(&mut buf).expect("a datagram");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn sends_to_a_socket_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let l = UnixDatagram::bind(&path).unwrap();
        send(path.to_str().unwrap(), "READY=1\nSTATUS=serving").unwrap();
        assert_eq!(recv(&l), "READY=1\nSTATUS=serving");
        send(path.to_str().unwrap(), "STOPPING=1").unwrap();
        assert_eq!(recv(&l), "STOPPING=1");
    }

    #[test]
    fn sends_to_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("drove-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let l = UnixDatagram::bind_addr(&addr).unwrap();
        send(&format!("@{name}"), "READY=1").unwrap();
        assert_eq!(recv(&l), "READY=1");
    }

    #[test]
    fn refuses_a_relative_name_and_reports_a_missing_socket() {
        assert!(send("relative.sock", "READY=1").is_err());
        let dir = tempfile::tempdir().unwrap();
        assert!(send(dir.path().join("none").to_str().unwrap(), "READY=1").is_err());
    }

    #[test]
    fn notify_without_the_variable_does_nothing() {
        // NOTIFY_SOCKET is not set under cargo test (nor changed here: tests run in
        // threads of one process); notify must simply return.
        if std::env::var_os("NOTIFY_SOCKET").is_none() {
            notify("READY=1");
        }
    }
}
