//! Proof that the WAN routes are taken: the TCP connections each node process
//! holds, from /proc/net/tcp{,6} and the node's /proc/PID/fd. A node's connection
//! to the peer port of a node in another zone would bypass the delay; a connection
//! to one of its proxies is the route taken. (toxiproxy only counts a connection's
//! bytes when it closes, so its counters cannot show this while nodes keep their
//! peer connections open.)
use anyhow::{Context, Result};
use std::collections::HashSet;

/// One established TCP connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpConn {
    /// Local port.
    pub local_port: u16,
    /// Remote port.
    pub remote_port: u16,
    /// Socket inode.
    pub inode: u64,
}

fn port(field: &str) -> Option<u16> {
    let (_, p) = field.rsplit_once(':')?;
    u16::from_str_radix(p, 16).ok()
}

/// Established connections in /proc/net/tcp (or tcp6) text. All addresses of the
/// experiment are 127.0.0.1, so ports identify the endpoints.
pub fn parse_proc_net_tcp(text: &str) -> Vec<TcpConn> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
            if f.len() < 10 || f[3] != "01" {
                return None;
            }
            Some(TcpConn {
                local_port: port(f[1])?,
                remote_port: port(f[2])?,
                inode: f[9].parse().ok()?,
            })
        })
        .collect()
}

/// Socket inodes open in process `pid`.
pub fn socket_inodes(pid: u32) -> Result<HashSet<u64>> {
    let dir = format!("/proc/{pid}/fd");
    let mut set = HashSet::new();
    for e in std::fs::read_dir(&dir).with_context(|| format!("Cannot read {dir}"))? {
        let Ok(e) = e else { continue };
        if let Ok(target) = std::fs::read_link(e.path()) {
            let t = target.to_string_lossy();
            if let Some(n) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                if let Ok(i) = n.parse() {
                    set.insert(i);
                }
            }
        }
    }
    Ok(set)
}

/// Established TCP connections held by process `pid`.
pub fn connections_of(pid: u32) -> Result<Vec<TcpConn>> {
    let inodes = socket_inodes(pid)?;
    let mut all = Vec::new();
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(t) = std::fs::read_to_string(f) {
            all.extend(parse_proc_net_tcp(&t));
        }
    }
    Ok(all
        .into_iter()
        .filter(|c| inodes.contains(&c.inode))
        .collect())
}

/// Count `conns` going to `proxy_ports` and to `direct_ports` (ports that must
/// only be reached through a proxy).
pub fn classify(
    conns: &[TcpConn],
    proxy_ports: &HashSet<u16>,
    direct_ports: &HashSet<u16>,
) -> (usize, usize) {
    let via = conns
        .iter()
        .filter(|c| proxy_ports.contains(&c.remote_port))
        .count();
    let direct = conns
        .iter()
        .filter(|c| direct_ports.contains(&c.remote_port))
        .count();
    (via, direct)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1593 1 0 100 0 0 10 0\n\
   1: 0100007F:B055 0100007F:B35E 01 00000000:00000000 00:00000000 00000000     0        0 4242 1 0 20 4 30 10 -1\n\
   2: 0100007F:B056 0100007F:1F90 06 00000000:00000000 03:00000D83 00000000     0        0 0 3 0\n";

    #[test]
    fn test_parse_established_only() {
        let c = parse_proc_net_tcp(TCP);
        assert_eq!(
            c,
            vec![TcpConn {
                local_port: 0xB055,
                remote_port: 0xB35E,
                inode: 4242
            }]
        );
        let proxies: HashSet<u16> = [0xB35E].into_iter().collect();
        let direct: HashSet<u16> = [0x1F90].into_iter().collect();
        assert_eq!(classify(&c, &proxies, &direct), (1, 0));
        assert_eq!(classify(&c, &direct, &proxies), (0, 1));
    }

    #[test]
    fn test_own_connection_is_found() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let _c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _a = l.accept().unwrap();
        let mine = connections_of(std::process::id()).unwrap();
        assert!(mine.iter().any(|c| c.remote_port == port), "{mine:?}");
        assert!(mine.iter().any(|c| c.local_port == port), "{mine:?}");
    }
}
