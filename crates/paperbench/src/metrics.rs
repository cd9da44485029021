//! Bytes moved, read from Prometheus text: the nodes' `/metrics` (client bytes per
//! NBD operation, bytes each node sent to and received from each peer node) and
//! toxiproxy's `/metrics` (bytes through each proxy). Counters are read before and
//! after a run; the difference is what the run moved.
use std::collections::BTreeMap;

/// One sample line: `name{label="v",...} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Metric name.
    pub name: String,
    /// Labels in order.
    pub labels: Vec<(String, String)>,
    /// Value.
    pub value: f64,
}

impl Sample {
    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn parse_labels(s: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if rest.is_empty() {
            return Some(out);
        }
        let eq = rest.find('=')?;
        let key = rest[..eq].trim().to_string();
        let after = rest[eq + 1..].strip_prefix('"')?;
        // Values may contain escaped quotes (\"): find the closing unescaped quote.
        let mut val = String::new();
        let mut chars = after.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        val.push(if n == 'n' { '\n' } else { n });
                    }
                }
                '"' => {
                    end = Some(i);
                    break;
                }
                c => val.push(c),
            }
        }
        out.push((key, val));
        rest = &after[end? + 1..];
    }
}

/// Every sample of a Prometheus text exposition (comments and bad lines skipped).
pub fn parse_prometheus(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, labels, rest) = match line.find('{') {
            Some(open) => {
                let Some(close) = line.rfind('}') else {
                    continue;
                };
                let Some(labels) = parse_labels(&line[open + 1..close]) else {
                    continue;
                };
                (&line[..open], labels, &line[close + 1..])
            }
            None => match line.split_once(' ') {
                Some((n, r)) => (n, Vec::new(), r),
                None => continue,
            },
        };
        let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        out.push(Sample {
            name: name.trim().to_string(),
            labels,
            value,
        });
    }
    out
}

/// The counters of one drove node that the experiment uses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeCounters {
    /// Bytes clients wrote through this node.
    pub nbd_write: u64,
    /// Bytes clients read through this node.
    pub nbd_read: u64,
    /// Bytes sent to each peer node id.
    pub peer_sent: BTreeMap<u64, u64>,
    /// Bytes received from each peer node id (on connections this node opened).
    pub peer_received: BTreeMap<u64, u64>,
}

/// Extract a node's counters from its `/metrics` text.
pub fn node_counters(text: &str) -> NodeCounters {
    let mut c = NodeCounters::default();
    for s in parse_prometheus(text) {
        let v = s.value as u64;
        match s.name.as_str() {
            "drove_nbd_bytes_total" => match s.label("op") {
                Some("write") => c.nbd_write = v,
                Some("read") => c.nbd_read = v,
                _ => {}
            },
            "drove_peer_sent_bytes_total" | "drove_peer_received_bytes_total" => {
                let Some(peer) = s.label("peer").and_then(|p| p.parse().ok()) else {
                    continue;
                };
                let map = if s.name == "drove_peer_sent_bytes_total" {
                    &mut c.peer_sent
                } else {
                    &mut c.peer_received
                };
                map.insert(peer, v);
            }
            _ => {}
        }
    }
    c
}

/// Bytes moved between two readings of every node's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeDelta {
    /// Client bytes written.
    pub nbd_write: u64,
    /// Client bytes read.
    pub nbd_read: u64,
    /// Bytes sent between nodes.
    pub peer_sent: u64,
    /// Bytes received between nodes.
    pub peer_received: u64,
    /// Of `peer_sent`, to a node in another zone.
    pub cross_sent: u64,
    /// Of `peer_received`, from a node in another zone.
    pub cross_received: u64,
}

/// Sum the differences over nodes. `nodes[i]` is `(node id, zone)` of the node
/// whose counters are `before[i]` / `after[i]`; a peer id missing from `nodes`
/// counts as another zone.
pub fn node_delta(
    nodes: &[(u64, String)],
    before: &[NodeCounters],
    after: &[NodeCounters],
) -> NodeDelta {
    let zone_of = |id: u64| nodes.iter().find(|(n, _)| *n == id).map(|(_, z)| z);
    let mut d = NodeDelta::default();
    for (i, (_, zone)) in nodes.iter().enumerate() {
        let (Some(b), Some(a)) = (before.get(i), after.get(i)) else {
            continue;
        };
        d.nbd_write += a.nbd_write.saturating_sub(b.nbd_write);
        d.nbd_read += a.nbd_read.saturating_sub(b.nbd_read);
        for (map_a, map_b, total, cross) in [
            (
                &a.peer_sent,
                &b.peer_sent,
                &mut d.peer_sent,
                &mut d.cross_sent,
            ),
            (
                &a.peer_received,
                &b.peer_received,
                &mut d.peer_received,
                &mut d.cross_received,
            ),
        ] {
            for (peer, v) in map_a {
                let delta = v.saturating_sub(map_b.get(peer).copied().unwrap_or(0));
                *total += delta;
                if zone_of(*peer) != Some(zone) {
                    *cross += delta;
                }
            }
        }
    }
    d
}

/// Bytes toxiproxy carried (received, both directions) on proxies whose name
/// starts with `prefix`.
pub fn proxy_bytes(text: &str, prefix: &str) -> u64 {
    parse_prometheus(text)
        .iter()
        .filter(|s| s.name == "toxiproxy_proxy_received_bytes_total")
        .filter(|s| s.label("proxy").is_some_and(|p| p.starts_with(prefix)))
        .map(|s| s.value as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: &str = "# HELP drove_nbd_bytes NBD payload bytes by operation.\n\
# TYPE drove_nbd_bytes counter\n\
drove_nbd_bytes_total{op=\"read\"} 4096\n\
drove_nbd_bytes_total{op=\"write\"} 67108864\n\
drove_peer_sent_bytes_total{peer=\"2\"} 1000\n\
drove_peer_sent_bytes_total{peer=\"3\"} 500\n\
drove_peer_received_bytes_total{peer=\"2\"} 70\n\
drove_nbd_ops_total{op=\"write\",result=\"ok\"} 64\n";

    #[test]
    fn test_parse_node_metrics() {
        let c = node_counters(NODE);
        assert_eq!(c.nbd_write, 67108864);
        assert_eq!(c.nbd_read, 4096);
        assert_eq!(c.peer_sent.get(&2), Some(&1000));
        assert_eq!(c.peer_sent.get(&3), Some(&500));
        assert_eq!(c.peer_received.get(&2), Some(&70));
        let s = parse_prometheus("a{x=\"q\\\"uote\",y=\"b\"} 2.5e3\nplain 7\nbroken{ 1\n");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].label("x"), Some("q\"uote"));
        assert_eq!(s[0].label("y"), Some("b"));
        assert_eq!(s[0].value, 2500.0);
        assert_eq!(s[1].name, "plain");
    }

    #[test]
    fn test_delta_splits_cross_zone_bytes() {
        let nodes = vec![
            (1, "z1".to_string()),
            (2, "z1".to_string()),
            (3, "z2".to_string()),
        ];
        let before = vec![
            node_counters(NODE),
            NodeCounters::default(),
            NodeCounters::default(),
        ];
        let mut a1 = node_counters(NODE);
        a1.nbd_write += 100;
        *a1.peer_sent.entry(2).or_default() += 100; // same zone
        *a1.peer_sent.entry(3).or_default() += 100; // other zone
        let mut a3 = NodeCounters::default();
        a3.peer_sent.insert(1, 40);
        a3.peer_received.insert(2, 7);
        let d = node_delta(&nodes, &before, &[a1, NodeCounters::default(), a3]);
        assert_eq!(d.nbd_write, 100);
        assert_eq!(d.peer_sent, 240);
        assert_eq!(d.cross_sent, 140);
        assert_eq!(d.peer_received, 7);
        assert_eq!(d.cross_received, 7);
    }

    #[test]
    fn test_proxy_bytes_filters_by_prefix() {
        let t = "toxiproxy_proxy_received_bytes_total{direction=\"downstream\",listener=\"127.0.0.1:1\",proxy=\"drove-1-2\",upstream=\"u\"} 2342\n\
toxiproxy_proxy_received_bytes_total{direction=\"upstream\",listener=\"127.0.0.1:1\",proxy=\"drove-1-2\",upstream=\"u\"} 89\n\
toxiproxy_proxy_sent_bytes_total{direction=\"upstream\",listener=\"127.0.0.1:1\",proxy=\"drove-1-2\",upstream=\"u\"} 89\n\
toxiproxy_proxy_received_bytes_total{direction=\"upstream\",listener=\"127.0.0.1:2\",proxy=\"base-c2\",upstream=\"u\"} 5\n";
        assert_eq!(proxy_bytes(t, "drove-"), 2431);
        assert_eq!(proxy_bytes(t, "base-"), 5);
        assert_eq!(proxy_bytes(t, "none-"), 0);
    }
}
