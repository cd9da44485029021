//! The emulated WAN's layout and its check. Zones are `z1..zZ` (as `drove up`
//! names them). Every ordered pair of nodes (A, B) in different zones gets its own
//! proxy to B's peer address, and A's routes file sends its dials to B there; pairs
//! in one zone talk directly. Client i lives in zone (i mod Z) + 1 and attaches
//! through that zone's nodes in turn. Before measuring with a delay, a real round
//! trip through a proxy must take at least twice the delay.
use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::http;

/// Name of zone `k` (1-based), as `drove up` names it.
pub fn zone_name(k: usize) -> String {
    format!("z{k}")
}

/// The zone (1-based) of client `i` (0-based).
pub fn client_zone(i: usize, zones: usize) -> usize {
    i % zones.max(1) + 1
}

/// The node (index into `node_zones`) client `i` attaches through: the zone's
/// nodes taken round-robin, in cluster order. `None` if its zone has no node.
pub fn client_node(i: usize, zones: usize, node_zones: &[String]) -> Option<usize> {
    let zone = zone_name(client_zone(i, zones));
    let in_zone: Vec<usize> = node_zones
        .iter()
        .enumerate()
        .filter(|(_, z)| **z == zone)
        .map(|(k, _)| k)
        .collect();
    if in_zone.is_empty() {
        return None;
    }
    // Client i is the (i / zones)-th client of its zone.
    Some(in_zone[(i / zones.max(1)) % in_zone.len()])
}

/// Every ordered pair (from, to) of node indexes in different zones.
pub fn cross_zone_pairs(node_zones: &[String]) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    for (a, za) in node_zones.iter().enumerate() {
        for (b, zb) in node_zones.iter().enumerate() {
            if za != zb {
                v.push((a, b));
            }
        }
    }
    v
}

/// The routes file of one node: peer address -> proxy address.
pub fn routes_json(routes: &BTreeMap<String, String>) -> Result<String> {
    serde_json::to_string_pretty(routes).context("Cannot encode a routes file")
}

/// Fail unless `rtt` is at least twice `delay_ms`.
pub fn require_delay(what: &str, rtt: Duration, delay_ms: u64) -> Result<()> {
    let want = Duration::from_millis(2 * delay_ms);
    if rtt < want {
        bail!(
            "The WAN delay is not in effect: a round trip {what} took {:.1} ms, less than \
             2 x {delay_ms} ms; toxiproxy's latency toxics are not applied",
            rtt.as_secs_f64() * 1e3
        );
    }
    Ok(())
}

/// Shortest of three HTTP request/response round trips (connect included) to
/// `addr`.
pub fn http_rtt(addr: &str, path: &str) -> Result<Duration> {
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let r = http::request(addr, "GET", path, None, Duration::from_secs(10))?;
        if !(200..300).contains(&r.status) {
            bail!("GET {addr}{path} answered {}", r.status);
        }
        best = best.min(r.elapsed);
    }
    Ok(best)
}

const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
const NBD_OPT_LIST: u32 = 3;
const NBD_OPT_ABORT: u32 = 2;
const NBD_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

fn option(op: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(&IHAVEOPT.to_be_bytes());
    b.extend_from_slice(&op.to_be_bytes());
    b.extend_from_slice(&0u32.to_be_bytes());
    b
}

/// One NBD option round trip to the server at `addr`: after the handshake greeting,
/// the time from sending NBD_OPT_LIST to the first byte of its reply header.
pub fn nbd_rtt(addr: &str) -> Result<Duration> {
    let sa: SocketAddr = addr.parse().map_err(|_| anyhow!("Bad address {addr}"))?;
    let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(10))
        .with_context(|| format!("Cannot connect to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let _ = s.set_nodelay(true);
    let mut greet = [0u8; 18];
    s.read_exact(&mut greet)
        .with_context(|| format!("No NBD greeting from {addr}"))?;
    if &greet[..8] != b"NBDMAGIC" || greet[8..16] != IHAVEOPT.to_be_bytes() {
        bail!("{addr} is not a newstyle NBD server");
    }
    // Echo the fixed-newstyle and no-zeroes bits the server offered.
    let flags = u32::from(u16::from_be_bytes([greet[16], greet[17]]) & 0x3);
    s.write_all(&flags.to_be_bytes())?;
    let start = Instant::now();
    s.write_all(&option(NBD_OPT_LIST))?;
    let mut hdr = [0u8; 20];
    s.read_exact(&mut hdr)
        .with_context(|| format!("No NBD option reply from {addr}"))?;
    let rtt = start.elapsed();
    if hdr[..8] != NBD_REPLY_MAGIC.to_be_bytes() {
        bail!("{addr} answered NBD_OPT_LIST with a bad reply magic");
    }
    let _ = s.write_all(&option(NBD_OPT_ABORT));
    Ok(rtt)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zones(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn test_clients_round_robin_within_their_zone() {
        // 2 zones, 2 nodes each, as `drove up --nodes 4 --zones 2` lays them out.
        let nz = zones(&["z1", "z2", "z1", "z2"]);
        let picks: Vec<(usize, usize)> = (0..6)
            .map(|i| (client_zone(i, 2), client_node(i, 2, &nz).unwrap()))
            .collect();
        assert_eq!(picks, vec![(1, 0), (2, 1), (1, 2), (2, 3), (1, 0), (2, 1)]);
        assert_eq!(client_node(1, 2, &zones(&["z1", "z1"])), None);
    }

    #[test]
    fn test_cross_zone_pairs_skip_same_zone() {
        let nz = zones(&["z1", "z2", "z1"]);
        let p = cross_zone_pairs(&nz);
        assert_eq!(p, vec![(0, 1), (1, 0), (1, 2), (2, 1)]);
        // 4 zones x 2 nodes: each node has 6 nodes outside its zone.
        let nz: Vec<String> = (0..8).map(|i| zone_name(i % 4 + 1)).collect();
        assert_eq!(cross_zone_pairs(&nz).len(), 8 * 6);
    }

    #[test]
    fn test_require_delay() {
        assert!(require_delay("x", Duration::from_millis(21), 10).is_ok());
        let e = require_delay("x", Duration::from_millis(19), 10).unwrap_err();
        assert!(e.to_string().contains("not in effect"));
    }

    #[test]
    fn test_routes_file_is_a_json_object() {
        let mut m = BTreeMap::new();
        m.insert("127.0.0.1:1".to_string(), "127.0.0.1:2".to_string());
        let v: serde_json::Value = serde_json::from_str(&routes_json(&m).unwrap()).unwrap();
        assert_eq!(v["127.0.0.1:1"], "127.0.0.1:2");
    }
}
