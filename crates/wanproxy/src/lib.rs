//! drove's emulated WAN, for `drove bench paper` and the WAN tests: TCP proxies that
//! delay every byte by a fixed time in each direction and may cap a direction's
//! bandwidth, run as `drove bench wan-proxy`. It is driven over HTTP with the part of
//! toxiproxy's REST API the harness uses, so the harness speaks to either:
//!
//! - `GET /version`
//! - `POST /proxies` `{"name", "listen", "upstream"}`: listen (port 0: a free one)
//!   and forward every connection to `upstream`; answers the proxy with the address
//!   it listens on.
//! - `POST /proxies/NAME/toxics` `{"name", "type": "latency"|"bandwidth", "stream":
//!   "upstream"|"downstream", "attributes": {"latency": MS} | {"rate": KB_PER_S}}`
//!   (upstream: client to server). Connections already open take it at once.
//! - `DELETE /proxies/NAME/toxics/TOXIC`
//! - `GET /metrics`: `toxiproxy_proxy_received_bytes_total` and
//!   `toxiproxy_proxy_sent_bytes_total` per proxy and direction.
//!
//! Why not toxiproxy itself: on the paper's bench it spent about half a core of the
//! two this machine has, passing 1 MiB writes between zones at X = 1; the proxy is
//! part of the experiment's own load, which makes most points CPU-bound. Here a
//! chunk costs one read, one write, a timer and one queue between two tasks.
//!
//! The API (axum) listens on loopback only and trusts its caller (it is a test
//! harness, not a service): requests are still bounded in size and checked, and a bad
//! one gets a 4xx with the reason.
pub mod pipe;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use parking_lot::Mutex;
use pipe::Shape;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// The largest API request body.
const MAX_REQUEST: usize = 64 << 10;
/// How long a proxied connection waits for its upstream to accept.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most proxies one server holds.
const MAX_PROXIES: usize = 4096;
/// Toxics per proxy.
const MAX_TOXICS: usize = 16;

/// The two directions of a proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stream {
    /// Client to server.
    Upstream,
    /// Server to client.
    Downstream,
}

impl Stream {
    fn parse(s: &str) -> Option<Stream> {
        match s {
            "upstream" => Some(Stream::Upstream),
            "downstream" => Some(Stream::Downstream),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Stream::Upstream => "upstream",
            Stream::Downstream => "downstream",
        }
    }
}

/// A toxic: what it does to which direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Toxic {
    /// Delay in milliseconds.
    Latency(Stream, u64),
    /// Cap in KB (1,000 bytes) per second, as toxiproxy counts it.
    Bandwidth(Stream, u64),
}

impl Toxic {
    fn stream(self) -> Stream {
        match self {
            Toxic::Latency(s, _) | Toxic::Bandwidth(s, _) => s,
        }
    }

    fn json(self, name: &str) -> Value {
        match self {
            Toxic::Latency(s, ms) => json!({"name": name, "type": "latency", "stream": s.name(),
                "toxicity": 1.0, "attributes": {"latency": ms, "jitter": 0}}),
            Toxic::Bandwidth(s, kb) => {
                json!({"name": name, "type": "bandwidth", "stream": s.name(),
                "toxicity": 1.0, "attributes": {"rate": kb}})
            }
        }
    }
}

/// One proxy.
struct Proxy {
    listen: SocketAddr,
    upstream: String,
    up: Arc<Shape>,
    down: Arc<Shape>,
    toxics: Mutex<BTreeMap<String, Toxic>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    fn shape(&self, s: Stream) -> &Arc<Shape> {
        match s {
            Stream::Upstream => &self.up,
            Stream::Downstream => &self.down,
        }
    }

    /// Set both directions' shapes from the toxics.
    fn apply(&self, toxics: &BTreeMap<String, Toxic>) {
        for s in [Stream::Upstream, Stream::Downstream] {
            let (mut delay_ms, mut rate) = (0u64, 0u64);
            for t in toxics.values().filter(|t| t.stream() == s) {
                match *t {
                    Toxic::Latency(_, ms) => delay_ms += ms,
                    Toxic::Bandwidth(_, kb) => {
                        let b = kb.saturating_mul(1000);
                        rate = if rate == 0 { b } else { rate.min(b) };
                    }
                }
            }
            let shape = self.shape(s);
            shape
                .delay_us
                .store(delay_ms.saturating_mul(1000), Ordering::Relaxed);
            shape.rate.store(rate, Ordering::Relaxed);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Every proxy, by name.
#[derive(Default)]
pub struct Server {
    proxies: Mutex<BTreeMap<String, Arc<Proxy>>>,
}

/// An API answer: status and JSON (or text) body.
struct Answer {
    status: StatusCode,
    body: String,
    content_type: &'static str,
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        (
            self.status,
            [(header::CONTENT_TYPE, self.content_type)],
            self.body,
        )
            .into_response()
    }
}

fn answer(status: StatusCode, v: Value) -> Answer {
    Answer {
        status,
        body: v.to_string(),
        content_type: "application/json",
    }
}

fn refuse(status: StatusCode, why: impl Into<String>) -> Answer {
    answer(
        status,
        json!({"error": why.into(), "status": status.as_u16()}),
    )
}

/// The body as JSON, or the answer refusing it.
fn parse(body: &[u8]) -> Result<Value, Answer> {
    serde_json::from_slice(body)
        .map_err(|e| refuse(StatusCode::BAD_REQUEST, format!("Body is not JSON: {e}")))
}

impl Server {
    /// Serve the API on `api` until the task is dropped.
    pub async fn serve(self: Arc<Self>, api: TcpListener) {
        let router = Router::new()
            .route("/version", get(version))
            .route("/metrics", get(metrics))
            .route("/proxies", post(create_proxy))
            .route("/proxies/{name}/toxics", post(add_toxic))
            .route("/proxies/{name}/toxics/{toxic}", delete(remove_toxic))
            .fallback(|uri: axum::http::Uri| async move {
                refuse(StatusCode::NOT_FOUND, format!("No route {uri}"))
            })
            .layer(DefaultBodyLimit::max(MAX_REQUEST))
            .with_state(self);
        if let Err(e) = axum::serve(api, router).await {
            tracing::error!("the WAN proxy's API stopped: {e}");
        }
    }

    async fn create(&self, v: &Value) -> Answer {
        let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default();
        let (name, listen, upstream) = (field("name"), field("listen"), field("upstream"));
        if name.is_empty() || name.len() > 200 || name.contains('/') {
            return refuse(
                StatusCode::BAD_REQUEST,
                "A proxy needs a name (1-200 characters, no '/')",
            );
        }
        let Ok(listen_at) = listen.parse::<SocketAddr>() else {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("Bad listen address '{listen}'"),
            );
        };
        if !listen_at.ip().is_loopback() {
            return refuse(
                StatusCode::BAD_REQUEST,
                "A proxy listens on a loopback address only",
            );
        }
        if upstream.is_empty() || upstream.len() > 200 {
            return refuse(
                StatusCode::BAD_REQUEST,
                "A proxy needs an upstream host:port",
            );
        }
        {
            let proxies = self.proxies.lock();
            if proxies.contains_key(name) {
                return refuse(StatusCode::CONFLICT, format!("Proxy {name} exists"));
            }
            if proxies.len() >= MAX_PROXIES {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    format!("At most {MAX_PROXIES} proxies"),
                );
            }
        }
        let l = match TcpListener::bind(listen_at).await {
            Ok(l) => l,
            Err(e) => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    format!("Cannot listen on {listen}: {e}"),
                )
            }
        };
        let Ok(at) = l.local_addr() else {
            return refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                "The listener has no address",
            );
        };
        let (up, down) = (Arc::new(Shape::default()), Arc::new(Shape::default()));
        let accept = tokio::spawn(accept_loop(
            l,
            upstream.to_string(),
            up.clone(),
            down.clone(),
        ));
        let p = Arc::new(Proxy {
            listen: at,
            upstream: upstream.to_string(),
            up,
            down,
            toxics: Mutex::new(BTreeMap::new()),
            accept,
        });
        let mut proxies = self.proxies.lock();
        if proxies.contains_key(name) {
            return refuse(StatusCode::CONFLICT, format!("Proxy {name} exists"));
        }
        proxies.insert(name.to_string(), p);
        answer(
            StatusCode::CREATED,
            json!({"name": name, "listen": at.to_string(), "upstream": upstream,
                "enabled": true, "toxics": []}),
        )
    }

    fn proxy(&self, name: &str) -> Option<Arc<Proxy>> {
        self.proxies.lock().get(name).cloned()
    }

    fn add_toxic(&self, proxy: &str, v: &Value) -> Answer {
        let bad = |why: &str| refuse(StatusCode::BAD_REQUEST, why);
        let Some(p) = self.proxy(proxy) else {
            return refuse(StatusCode::NOT_FOUND, format!("No proxy {proxy}"));
        };
        let stream = v
            .get("stream")
            .and_then(Value::as_str)
            .unwrap_or("downstream");
        let Some(stream) = Stream::parse(stream) else {
            return bad("stream must be upstream or downstream");
        };
        if v.get("toxicity")
            .and_then(Value::as_f64)
            .is_some_and(|t| t != 1.0)
        {
            return bad("Only toxicity 1.0 (every connection) is supported");
        }
        let attr = |k: &str| {
            v.pointer(&format!("/attributes/{k}"))
                .and_then(Value::as_u64)
        };
        let kind = v.get("type").and_then(Value::as_str).unwrap_or_default();
        let toxic = match kind {
            "latency" => {
                if attr("jitter").is_some_and(|j| j != 0) {
                    return bad("Only jitter 0 is supported");
                }
                match attr("latency") {
                    Some(ms) if ms <= 60_000 => Toxic::Latency(stream, ms),
                    _ => return bad("latency: attributes.latency in ms, at most 60000"),
                }
            }
            "bandwidth" => match attr("rate") {
                Some(kb) if kb > 0 => Toxic::Bandwidth(stream, kb),
                _ => return bad("bandwidth: attributes.rate in KB/s, more than 0"),
            },
            other => {
                return bad(&format!(
                    "Unknown toxic type '{other}' (latency, bandwidth)"
                ))
            }
        };
        let name = match v.get("name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() && n.len() <= 200 && !n.contains('/') => n.to_string(),
            Some(_) => return bad("A toxic's name is 1-200 characters, no '/'"),
            None => format!("{kind}_{}", stream.name()),
        };
        let mut toxics = p.toxics.lock();
        if toxics.contains_key(&name) {
            return refuse(
                StatusCode::CONFLICT,
                format!("Toxic {name} exists on {proxy}"),
            );
        }
        if toxics.len() >= MAX_TOXICS {
            return bad(&format!("At most {MAX_TOXICS} toxics per proxy"));
        }
        toxics.insert(name.clone(), toxic);
        p.apply(&toxics);
        answer(StatusCode::OK, toxic.json(&name))
    }

    fn remove_toxic(&self, proxy: &str, toxic: &str) -> Answer {
        let Some(p) = self.proxy(proxy) else {
            return refuse(StatusCode::NOT_FOUND, format!("No proxy {proxy}"));
        };
        let mut toxics = p.toxics.lock();
        if toxics.remove(toxic).is_none() {
            return refuse(
                StatusCode::NOT_FOUND,
                format!("No toxic {toxic} on {proxy}"),
            );
        }
        p.apply(&toxics);
        Answer {
            status: StatusCode::NO_CONTENT,
            body: String::new(),
            content_type: "text/plain",
        }
    }

    /// Prometheus text, with toxiproxy's metric names and labels.
    fn metrics(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let proxies = self.proxies.lock();
        for (metric, received) in [
            ("toxiproxy_proxy_received_bytes_total", true),
            ("toxiproxy_proxy_sent_bytes_total", false),
        ] {
            let _ = writeln!(s, "# TYPE {metric} counter");
            for (name, p) in proxies.iter() {
                for dir in [Stream::Upstream, Stream::Downstream] {
                    let shape = p.shape(dir);
                    let n = if received {
                        &shape.received
                    } else {
                        &shape.sent
                    };
                    let _ = writeln!(
                        s,
                        "{metric}{{direction=\"{}\",listener=\"{}\",proxy=\"{name}\",proxy_type=\"tcp\",upstream=\"{}\"}} {}",
                        dir.name(),
                        p.listen,
                        p.upstream,
                        n.load(Ordering::Relaxed)
                    );
                }
            }
        }
        s
    }
}

async fn version() -> Answer {
    answer(StatusCode::OK, json!({"version": "drove-wanproxy 1"}))
}

async fn metrics(State(s): State<Arc<Server>>) -> Answer {
    Answer {
        status: StatusCode::OK,
        body: s.metrics(),
        content_type: "text/plain; version=0.0.4",
    }
}

async fn create_proxy(State(s): State<Arc<Server>>, body: Bytes) -> Answer {
    match parse(&body) {
        Ok(v) => s.create(&v).await,
        Err(a) => a,
    }
}

async fn add_toxic(State(s): State<Arc<Server>>, Path(name): Path<String>, body: Bytes) -> Answer {
    match parse(&body) {
        Ok(v) => s.add_toxic(&name, &v),
        Err(a) => a,
    }
}

async fn remove_toxic(
    State(s): State<Arc<Server>>,
    Path((name, toxic)): Path<(String, String)>,
) -> Answer {
    s.remove_toxic(&name, &toxic)
}

/// Accept clients of one proxy and connect each to `upstream`.
async fn accept_loop(l: TcpListener, upstream: String, up: Arc<Shape>, down: Arc<Shape>) {
    loop {
        let Ok((client, _)) = l.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let (upstream, up, down) = (upstream.clone(), up.clone(), down.clone());
        tokio::spawn(async move {
            let server =
                match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&upstream)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!("cannot connect to {upstream}: {e}");
                        return;
                    }
                    Err(_) => return,
                };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::join!(pipe::run(cr, sw, up), pipe::run(sr, cw, down));
        });
    }
}

/// Run the proxy server's API on `api` (a loopback address) until the process ends.
pub async fn run(api: SocketAddr) -> std::io::Result<()> {
    if !api.ip().is_loopback() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("The API listens on a loopback address only, not {api}"),
        ));
    }
    let l = TcpListener::bind(api).await?;
    Arc::new(Server::default()).serve(l).await;
    Ok(())
}
