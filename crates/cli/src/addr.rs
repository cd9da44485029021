//! The admin address of a node as a user types it (`--cluster`, `DROVE_CLUSTER`,
//! `--join`): `host`, `host:port`, `http[s]://host[:port][/]`, IPv6 in brackets
//! (`[::1]:7000`). The admin API listens on port 7000 unless told otherwise, so a
//! missing port means 7000 (not HTTP's 80). Anything that is not an address of the
//! admin API (another scheme, a path, a user name) is refused with the reason,
//! rather than sent somewhere it cannot work.
use std::fmt;
use std::net::Ipv6Addr;

/// The admin port a node listens on by default (`drove node run --listen`).
pub const DEFAULT_PORT: u16 = 7000;

/// The address used when neither `--cluster` nor `DROVE_CLUSTER` is given.
pub const DEFAULT_CLUSTER: &str = "127.0.0.1:7000";

/// Where a cluster address came from, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `--cluster`.
    Flag,
    /// The `DROVE_CLUSTER` environment variable.
    Env,
    /// Neither: [`DEFAULT_CLUSTER`].
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Flag => "--cluster",
            Source::Env => "DROVE_CLUSTER",
            Source::Default => "the default",
        })
    }
}

/// A parsed cluster address: what to connect to and what the user wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterAddr {
    /// `host:port`, with an IPv6 host in brackets: what goes into `http://…/`.
    pub authority: String,
    /// The scheme written (`http` or `https`, lower case), if one was: without one
    /// the CLI speaks HTTPS when it has the cluster's CA (`DROVE_CA`).
    pub scheme: Option<&'static str>,
    /// The text as given.
    pub given: String,
    /// Where it came from.
    pub source: Source,
}

impl ClusterAddr {
    /// Parse `given`, which came from `source`.
    pub fn parse(given: &str, source: Source) -> Result<ClusterAddr, String> {
        let authority = authority(given).map_err(|why| match source {
            Source::Default => format!("Bad default cluster address '{given}': {why}"),
            _ => format!("Bad {source} '{given}': {why}"),
        })?;
        Ok(ClusterAddr {
            authority,
            scheme: scheme(given),
            given: given.to_string(),
            source,
        })
    }

    /// Where the address came from, for "Cannot reach …" messages: `from --cluster
    /// localhost`, `from DROVE_CLUSTER=…`, or the default with how to change it.
    pub fn origin(&self) -> String {
        match self.source {
            Source::Flag => format!("from --cluster {}", self.given),
            Source::Env => format!("from DROVE_CLUSTER={}", self.given),
            Source::Default => "the default; set --cluster or DROVE_CLUSTER".to_string(),
        }
    }
}

/// The scheme of an admin address that has one (`http` or `https`).
fn scheme(given: &str) -> Option<&'static str> {
    match given.trim().split_once("://") {
        Some((s, _)) if s.eq_ignore_ascii_case("https") => Some("https"),
        Some((s, _)) if s.eq_ignore_ascii_case("http") => Some("http"),
        _ => None,
    }
}

/// `host:port` of an admin address in any accepted form, or why it is not one.
pub fn authority(given: &str) -> Result<String, String> {
    let s = given.trim();
    if s.is_empty() {
        return Err("empty address; give host, host:port or http://host:port".into());
    }
    let rest = match s.split_once("://") {
        Some((scheme, rest))
            if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") =>
        {
            rest
        }
        Some((scheme, _)) => {
            return Err(format!(
                "scheme '{scheme}' is not supported: the admin API speaks http or https \
                 (https with the cluster's CA, DROVE_CA); give host:port or http://host:port"
            ))
        }
        None => s,
    };
    // One trailing slash is how URLs are often written; anything after it is a path
    // the admin API does not have.
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if let Some(i) = rest.find(['/', '?', '#']) {
        return Err(format!(
            "'{}' is a path; give only host:port (the admin API's routes are fixed)",
            &rest[i..]
        ));
    }
    if rest.contains('@') {
        return Err("a user name is not supported; give only host:port".into());
    }
    let (host, port) = split_host_port(rest)?;
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err(format!("port '{p}' is not a number from 1 to 65535")),
            Ok(p) => p,
        },
    };
    Ok(format!("{host}:{port}"))
}

/// Split `host[:port]`; an IPv6 host comes back in brackets.
fn split_host_port(s: &str) -> Result<(String, Option<&str>), String> {
    if let Some(inner) = s.strip_prefix('[') {
        let (ip, after) = inner
            .split_once(']')
            .ok_or("missing ']' after an IPv6 address")?;
        ip.parse::<Ipv6Addr>()
            .map_err(|_| format!("'{ip}' is not an IPv6 address"))?;
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| format!("unexpected '{after}' after ']'"))?,
            ),
        };
        return Ok((format!("[{ip}]"), port));
    }
    if s.matches(':').count() > 1 {
        // A bare IPv6 address: its colons cannot be told from a port's.
        return Err(match s.parse::<Ipv6Addr>() {
            Ok(ip) => format!("write an IPv6 address in brackets: [{ip}]:{DEFAULT_PORT}"),
            Err(_) => "too many ':' (an IPv6 address goes in brackets: [::1]:7000)".into(),
        });
    }
    let (host, port) = match s.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    };
    if host.is_empty() {
        return Err("no host name".into());
    }
    if let Some(c) = host
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
    {
        return Err(format!("'{c}' cannot be part of a host name"));
    }
    Ok((host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> String {
        authority(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn err(s: &str) -> String {
        match authority(s) {
            Ok(a) => panic!("{s} was accepted as {a}"),
            Err(e) => e,
        }
    }

    #[test]
    fn test_accepted_forms_give_host_and_port() {
        assert_eq!(ok("127.0.0.1:7010"), "127.0.0.1:7010");
        assert_eq!(ok("localhost"), "localhost:7000");
        assert_eq!(ok("node-1.example.org:8000"), "node-1.example.org:8000");
        assert_eq!(ok("http://127.0.0.1:7000"), "127.0.0.1:7000");
        assert_eq!(ok("http://127.0.0.1:7000/"), "127.0.0.1:7000");
        assert_eq!(ok("HTTP://localhost/"), "localhost:7000");
        assert_eq!(ok("http://localhost"), "localhost:7000");
        assert_eq!(ok("  10.0.0.5:7020 "), "10.0.0.5:7020");
    }

    #[test]
    fn test_ipv6_in_brackets_with_and_without_port() {
        assert_eq!(ok("[::1]:7000"), "[::1]:7000");
        assert_eq!(ok("[::1]"), "[::1]:7000");
        assert_eq!(ok("http://[fe80::1]:7010/"), "[fe80::1]:7010");
        assert!(err("::1").contains("[::1]:7000"), "{}", err("::1"));
        assert!(err("[::1").contains("']'"));
        assert!(err("[zz::1]:7000").contains("not an IPv6"));
        assert!(err("[::1]7000").contains("after ']'"));
    }

    #[test]
    fn test_other_schemes_paths_and_bad_ports_are_refused_with_the_reason() {
        assert!(err("nbds://127.0.0.1:7000").contains("scheme 'nbds'"));
        assert!(err("nbd://127.0.0.1:7002").contains("scheme 'nbd'"));
        assert!(err("http://127.0.0.1:7000/api/status").contains("'/api/status' is a path"));
        assert!(err("localhost/x").contains("path"));
        assert!(err("http://h:7000?x=1").contains("path"));
        assert!(err("user@host:7000").contains("user name"));
        assert!(err("host:0").contains("port '0'"));
        assert!(err("host:70000").contains("port '70000'"));
        assert!(err("host:").contains("port ''"));
        assert!(err(":7000").contains("no host"));
        assert!(err("").contains("empty"));
        assert!(err("bad host:1").contains("' '"));
    }

    #[test]
    fn test_errors_and_origin_name_where_the_address_came_from() {
        let e = ClusterAddr::parse("ftp://x", Source::Env).unwrap_err();
        assert!(e.starts_with("Bad DROVE_CLUSTER 'ftp://x': scheme"), "{e}");
        let a = ClusterAddr::parse("HTTPS://x", Source::Env).unwrap();
        assert_eq!((a.authority.as_str(), a.scheme), ("x:7000", Some("https")));
        let a = ClusterAddr::parse("x:1", Source::Env).unwrap();
        assert_eq!(a.scheme, None);
        let e = ClusterAddr::parse("x/y", Source::Flag).unwrap_err();
        assert!(e.starts_with("Bad --cluster 'x/y': "), "{e}");
        let a = ClusterAddr::parse("localhost", Source::Flag).unwrap();
        assert_eq!(a.authority, "localhost:7000");
        assert_eq!(a.origin(), "from --cluster localhost");
        let a = ClusterAddr::parse("http://h:1/", Source::Env).unwrap();
        assert_eq!(a.origin(), "from DROVE_CLUSTER=http://h:1/");
        let a = ClusterAddr::parse(DEFAULT_CLUSTER, Source::Default).unwrap();
        assert!(a.origin().contains("set --cluster or DROVE_CLUSTER"));
    }
}
