//! [`HttpNet`]: the metadata's calls to other nodes as HTTP(S) requests to their
//! peer ports, the carrier in production. Mutual TLS with the node's certificate
//! when the cluster has certificates (`https`), plain HTTP otherwise; the sender's
//! cluster id in a header ([`CLUSTER_HEADER`]) that the receiver checks. A routes
//! file (peer address -> address to dial instead) is followed like the peer pool
//! follows it: WAN emulation sends cross-zone traffic through delay proxies.
use crate::net::{MetaNet, Method, NetAnswer, NetCall, NetError, NetFuture};
use drove_types::{Error, Result};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The HTTP header that carries the sender's cluster id on every internal call.
pub(crate) const CLUSTER_HEADER: &str = "x-drove-cluster";

/// Connect timeout of internal HTTP calls; a refused or silent peer is retried later.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Internal calls over HTTP(S).
pub struct HttpNet {
    /// Replaced (with its pool of kept-alive connections) when the routes change,
    /// so no call keeps going straight to an address that is now routed.
    http: parking_lot::Mutex<reqwest::Client>,
    tls: Option<Arc<rustls::ClientConfig>>,
    scheme: &'static str,
    routes: Option<Routes>,
}

impl HttpNet {
    /// Calls in mutual TLS with `tls` (the node's client configuration), or plain
    /// HTTP without; `routes`, a JSON file of peer address -> address to dial
    /// instead, read again whenever it changes (absent or unreadable: no routes).
    pub fn new(
        tls: Option<Arc<rustls::ClientConfig>>,
        routes: Option<PathBuf>,
    ) -> Result<Arc<HttpNet>> {
        let http = build(tls.as_ref())?;
        Ok(Arc::new(HttpNet {
            http: parking_lot::Mutex::new(http),
            scheme: if tls.is_some() { "https" } else { "http" },
            tls,
            routes: routes.map(|path| Routes {
                path,
                seen: Default::default(),
            }),
        }))
    }

    /// The URL of `path` at `addr`, or where the routes file sends it.
    fn url(&self, addr: &str, path: &str) -> String {
        let (routed, changed) = match &self.routes {
            Some(r) => r.route(addr),
            None => (None, false),
        };
        if changed {
            if let Ok(fresh) = build(self.tls.as_ref()) {
                *self.http.lock() = fresh;
            }
        }
        let addr = routed.as_deref().unwrap_or(addr);
        format!("{}://{addr}{path}", self.scheme)
    }
}

fn build(tls: Option<&Arc<rustls::ClientConfig>>) -> Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        // Admin listeners close connections silent for 60 s (drove-daemon's
        // http_listen); letting go of pooled ones at 30 s keeps a call from being
        // sent on a connection the other node is closing.
        .pool_idle_timeout(Duration::from_secs(30))
        .http1_only();
    if let Some(tls) = tls {
        builder = builder.use_preconfigured_tls(rustls::ClientConfig::clone(tls));
    }
    builder
        .build()
        .map_err(|e| Error::unavailable(format!("Cannot build HTTP client: {e}")))
}

impl MetaNet for HttpNet {
    fn call<'a>(&'a self, to: &'a str, call: NetCall) -> NetFuture<'a> {
        Box::pin(async move {
            let url = self.url(to, &call.path);
            let http = self.http.lock().clone();
            let mut req = match call.method {
                Method::Get => http.get(&url),
                Method::Post => http
                    .post(&url)
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(call.body),
            };
            if let Some(id) = call.cluster {
                req = req.header(CLUSTER_HEADER, id.to_hex());
            }
            let resp = req.timeout(call.timeout).send().await.map_err(|e| {
                let why = format!("{url}: {}", cause(&e));
                if e.is_connect() {
                    NetError::Connect(why)
                } else if e.is_timeout() {
                    NetError::Timeout(why)
                } else {
                    NetError::Broken(why)
                }
            })?;
            let status = resp.status().as_u16();
            let body = resp.bytes().await.map_err(|e| {
                let why = format!("{url}: bad answer: {}", cause(&e));
                if e.is_timeout() {
                    NetError::Timeout(why)
                } else {
                    NetError::Broken(why)
                }
            })?;
            Ok(NetAnswer {
                status,
                body: body.to_vec(),
            })
        })
    }

    fn scheme(&self) -> &'static str {
        self.scheme
    }
}

/// The node's routes file, read again when its modification time changes.
struct Routes {
    path: PathBuf,
    seen: parking_lot::Mutex<(Option<std::time::SystemTime>, HashMap<String, String>)>,
}

impl Routes {
    /// Where to dial `addr`, and whether the table changed since the last call.
    fn route(&self, addr: &str) -> (Option<String>, bool) {
        let modified = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok();
        let mut seen = self.seen.lock();
        let changed = seen.0 != modified;
        if changed {
            let table = std::fs::read(&self.path)
                .ok()
                .and_then(|b| serde_json::from_slice::<HashMap<String, String>>(&b).ok())
                .unwrap_or_default();
            *seen = (modified, table);
        }
        (seen.1.get(addr).cloned(), changed)
    }
}

/// The root cause of a failed call ("Connection refused (os error 111)"): reqwest's
/// own message only names the URL, which the caller already says.
fn cause(e: &reqwest::Error) -> String {
    let mut cur: &dyn std::error::Error = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    if e.is_timeout() {
        return format!("timed out ({cur})");
    }
    cur.to_string()
}
