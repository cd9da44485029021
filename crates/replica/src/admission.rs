//! Who may hold how many of a listener's connections; used by [`crate::accept`] for
//! the peer port and the node's admin API.
//!
//! A cap on connections in all is not enough: 1,500 idle TCP connections from one
//! host, with no credentials, once filled the admin API's 1,024 and locked every
//! operator and node out of it for as long as the flood was held. So each
//! listener also keeps:
//! - a cap per client address, for addresses that are not the cluster's own
//!   ([`ConnLimits::per_client`]);
//! - a share of the cap that only trusted addresses may take
//!   ([`ConnLimits::reserved`]): loopback (127.0.0.1 and ::1, an operator on the
//!   node's host) and the addresses of the cluster's nodes in the map
//!   ([`KnownNodes`]). Other loopback addresses (127.0.0.2, ...) are not trusted:
//!   a local process can bind any of them, as a flooder on a single host would use
//!   many.
//!
//! Trusted addresses have no cap of their own: all the nodes of a `drove up`
//! cluster, and every CLI on a node's host, come from 127.0.0.1. A flood from
//! enough addresses can still take the shared part, never the reserved one.
use crate::MapCell;
use drove_types::ClusterMap;
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// How many connections a listener holds, and for whom.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Open connections at most; more are closed at once.
    pub max_conns: usize,
    /// Open connections at most from one address that is not trusted.
    pub per_client: usize,
    /// Of `max_conns`, how many only trusted addresses may take.
    pub reserved: usize,
}

impl ConnLimits {
    /// `max_conns` in all, `per_client` from one untrusted address, and a quarter
    /// of `max_conns` kept for trusted addresses.
    pub fn new(max_conns: usize, per_client: usize) -> ConnLimits {
        ConnLimits {
            max_conns,
            per_client,
            reserved: max_conns / 4,
        }
    }
}

/// Which client addresses are the cluster's own.
pub trait Trusted: Send + Sync + 'static {
    /// Whether a connection from `ip` may take the reserved share.
    fn trusts(&self, ip: IpAddr) -> bool;
}

/// Trusts loopback (127.0.0.1, ::1) only.
pub struct LocalOnly;

impl Trusted for LocalOnly {
    fn trusts(&self, ip: IpAddr) -> bool {
        is_local(ip)
    }
}

/// 127.0.0.1 or ::1 (also as an IPv4-mapped IPv6 address).
fn is_local(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(a) => a == Ipv4Addr::LOCALHOST,
        IpAddr::V6(a) => a == Ipv6Addr::LOCALHOST,
    }
}

/// Trusts loopback and every address of a node of the current cluster map (its
/// admin, peer and NBD addresses; up or down, a node coming back is one of ours).
pub struct KnownNodes {
    map: Arc<MapCell>,
    /// The addresses of the last map looked at.
    cache: Mutex<Option<Addresses>>,
}

/// The addresses of the nodes of `map` (the cell swaps in a new `Arc` at every
/// change, so the pointer says whether they are still current).
struct Addresses {
    map: Arc<ClusterMap>,
    ips: Arc<BTreeSet<IpAddr>>,
}

impl KnownNodes {
    /// Trust the nodes of `map`, as it changes.
    pub fn new(map: Arc<MapCell>) -> Arc<KnownNodes> {
        Arc::new(KnownNodes {
            map,
            cache: Mutex::new(None),
        })
    }

    fn addresses(&self) -> Arc<BTreeSet<IpAddr>> {
        let map = self.map.get();
        let mut cache = self.cache.lock();
        match &*cache {
            Some(a) if Arc::ptr_eq(&a.map, &map) => a.ips.clone(),
            _ => {
                let ips = Arc::new(node_ips(&map));
                *cache = Some(Addresses {
                    map,
                    ips: ips.clone(),
                });
                ips
            }
        }
    }
}

impl Trusted for KnownNodes {
    fn trusts(&self, ip: IpAddr) -> bool {
        is_local(ip) || self.addresses().contains(&ip.to_canonical())
    }
}

/// The IP addresses the nodes of `map` listen on (an unspecified one, 0.0.0.0,
/// names no client and is left out).
fn node_ips(map: &ClusterMap) -> BTreeSet<IpAddr> {
    map.nodes
        .values()
        .flat_map(|n| [&n.admin_addr, &n.peer_addr, &n.nbd_addr])
        .filter_map(|a| a.parse::<SocketAddr>().ok())
        .map(|a| a.ip().to_canonical())
        .filter(|ip| !ip.is_unspecified())
        .collect()
}

/// Why a connection was not let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The listener holds `max_conns`.
    Full,
    /// Untrusted addresses hold all but the reserved share.
    Shared,
    /// This address holds `per_client`.
    PerClient,
}

impl Refused {
    /// Said in logs.
    pub fn why(self, limits: &ConnLimits) -> String {
        match self {
            Refused::Full => format!("{} connections open, the limit", limits.max_conns),
            Refused::Shared => format!(
                "{} connections open from addresses outside the cluster, all but the {} kept \
                 for its nodes and loopback",
                limits.max_conns - limits.reserved,
                limits.reserved
            ),
            Refused::PerClient => format!(
                "{} connections open from this address, the limit per client",
                limits.per_client
            ),
        }
    }
}

/// Connections open now.
#[derive(Default)]
struct Open {
    total: usize,
    untrusted: usize,
    by_ip: HashMap<IpAddr, usize>,
}

/// The connections one listener holds, checked against its [`ConnLimits`].
pub struct Admission {
    limits: ConnLimits,
    trusted: Arc<dyn Trusted>,
    open: Mutex<Open>,
}

/// A connection's place; dropping it (when the connection ends) frees it.
pub struct Slot {
    admission: Arc<Admission>,
    /// The address, for a connection counted as untrusted.
    untrusted: Option<IpAddr>,
}

impl Admission {
    /// Connections held to `limits` (made sane: at least one in all and per
    /// client, at most all of them reserved), `trusted` saying who is the
    /// cluster's.
    pub fn new(limits: ConnLimits, trusted: Arc<dyn Trusted>) -> Arc<Admission> {
        let max_conns = limits.max_conns.max(1);
        let limits = ConnLimits {
            max_conns,
            per_client: limits.per_client.max(1),
            reserved: limits.reserved.min(max_conns),
        };
        Arc::new(Admission {
            limits,
            trusted,
            open: Mutex::new(Open::default()),
        })
    }

    /// The limits held to.
    pub fn limits(&self) -> &ConnLimits {
        &self.limits
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.lock().total
    }

    /// A place for a connection from `ip`, or why not.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Slot, Refused> {
        let ip = ip.to_canonical();
        // Asked before the lock: the map's cell has its own.
        let trusted = self.trusted.trusts(ip);
        let l = &self.limits;
        let mut o = self.open.lock();
        if o.total >= l.max_conns {
            return Err(Refused::Full);
        }
        if trusted {
            o.total += 1;
            return Ok(Slot {
                admission: self.clone(),
                untrusted: None,
            });
        }
        if o.untrusted >= l.max_conns - l.reserved {
            return Err(Refused::Shared);
        }
        let n = o.by_ip.entry(ip).or_default();
        if *n >= l.per_client {
            return Err(Refused::PerClient);
        }
        *n += 1;
        o.untrusted += 1;
        o.total += 1;
        Ok(Slot {
            admission: self.clone(),
            untrusted: Some(ip),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut o = self.admission.open.lock();
        o.total -= 1;
        if let Some(ip) = self.untrusted {
            o.untrusted -= 1;
            if let Some(n) = o.by_ip.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    o.by_ip.remove(&ip);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drove_types::{NodeId, NodeInfo};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn test_untrusted_addresses_are_capped_each_and_together_and_leave_the_reserve() {
        let a = Admission::new(
            ConnLimits {
                max_conns: 10,
                per_client: 2,
                reserved: 4,
            },
            Arc::new(LocalOnly),
        );
        let mut held = Vec::new();
        // Two per address; the third from one is refused.
        held.push(a.admit(ip("127.0.0.2")).unwrap());
        held.push(a.admit(ip("127.0.0.2")).unwrap());
        assert_eq!(a.admit(ip("127.0.0.2")).err(), Some(Refused::PerClient));
        // Six untrusted in all (10 less the 4 reserved).
        for h in ["127.0.0.3", "127.0.0.3", "10.1.2.3", "::ffff:10.1.2.4"] {
            held.push(a.admit(ip(h)).unwrap());
        }
        assert_eq!(a.admit(ip("127.0.0.5")).err(), Some(Refused::Shared));
        // The reserve is loopback's, with no cap per address; then nothing.
        for _ in 0..4 {
            held.push(a.admit(ip("127.0.0.1")).unwrap());
        }
        assert_eq!(a.open(), 10);
        assert_eq!(a.admit(ip("::1")).err(), Some(Refused::Full));
        // A slot comes back when its connection ends, to the same kind.
        drop(held.remove(0));
        assert_eq!(a.open(), 9);
        assert_eq!(a.admit(ip("127.0.0.5")).map(|_| ()), Ok(()));
        held.push(a.admit(ip("127.0.0.2")).unwrap());
        assert_eq!(a.admit(ip("127.0.0.2")).err(), Some(Refused::Full));
        held.clear();
        assert_eq!(a.open(), 0);
        assert!(a.open.lock().by_ip.is_empty(), "no address left counted");
    }

    #[test]
    fn test_limits_are_made_sane() {
        let a = Admission::new(
            ConnLimits {
                max_conns: 0,
                per_client: 0,
                reserved: 5,
            },
            Arc::new(LocalOnly),
        );
        assert_eq!(
            *a.limits(),
            ConnLimits {
                max_conns: 1,
                per_client: 1,
                reserved: 1
            }
        );
        // Everything reserved: only loopback gets in.
        assert_eq!(a.admit(ip("127.0.0.2")).err(), Some(Refused::Shared));
        let _one = a.admit(ip("127.0.0.1")).unwrap();
        assert_eq!(ConnLimits::new(1024, 64).reserved, 256);
    }

    #[test]
    fn test_the_nodes_of_the_map_are_trusted_as_the_map_changes() {
        let node = |id: u64, host: &str| NodeInfo {
            admin_addr: format!("{host}:7000"),
            peer_addr: format!("{host}:7001"),
            nbd_addr: "0.0.0.0:7002".to_string(),
            ..NodeInfo::new(NodeId(id), "z1")
        };
        let mut map = ClusterMap::default();
        map.nodes.insert(NodeId(1), node(1, "10.0.0.1"));
        map.nodes.insert(NodeId(2), node(2, "[fd00::2]"));
        let cell = Arc::new(MapCell::new(map.clone()));
        let known = KnownNodes::new(cell.clone());
        for (who, trusted) in [
            ("10.0.0.1", true),
            ("::ffff:10.0.0.1", true),
            ("fd00::2", true),
            ("127.0.0.1", true),
            ("::1", true),
            ("10.0.0.3", false),
            ("127.0.0.2", false),
            ("0.0.0.0", false),
        ] {
            assert_eq!(known.trusts(ip(who)), trusted, "{who}");
        }
        map.nodes.insert(NodeId(3), node(3, "10.0.0.3"));
        map.nodes.remove(&NodeId(1));
        cell.set(Arc::new(map));
        assert!(known.trusts(ip("10.0.0.3")));
        assert!(
            !known.trusts(ip("10.0.0.1")),
            "a removed node is a stranger"
        );
    }
}
