//! drove's WAN proxy over real loopback TCP: delays, bandwidth cap, byte counts,
//! half-close, and the API's refusals. Timing checks are lower bounds only (a delay
//! can only make things slower), so a busy machine cannot make them fail.
use drove_wanproxy::Server;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Start a proxy server; its API address.
async fn server() -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(Arc::new(Server::default()).serve(l));
    addr
}

/// One API request; (status, body).
async fn call(api: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(api).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).to_string();
    let status = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Create proxy `name` to `upstream`; the address it listens on.
async fn proxy(api: &str, name: &str, upstream: &str) -> String {
    let (st, body) = call(
        api,
        "POST",
        "/proxies",
        &json!({"name": name, "listen": "127.0.0.1:0", "upstream": upstream}).to_string(),
    )
    .await;
    assert_eq!(st, 201, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["listen"].as_str().unwrap().to_string()
}

async fn latency(api: &str, name: &str, stream: &str, ms: u64) {
    let body = json!({"name": format!("latency_{stream}"), "type": "latency", "stream": stream,
        "toxicity": 1.0, "attributes": {"latency": ms, "jitter": 0}});
    let (st, text) = call(
        api,
        "POST",
        &format!("/proxies/{name}/toxics"),
        &body.to_string(),
    )
    .await;
    assert_eq!(st, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["attributes"]["latency"], ms);
}

/// A server that echoes every byte back; its address.
async fn echo() -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let (mut c, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                let (mut r, mut w) = c.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn test_a_delay_each_way_makes_every_round_trip_at_least_twice_as_long() {
    let api = server().await;
    let at = proxy(&api, "p", &echo().await).await;
    let mut c = TcpStream::connect(&at).await.unwrap();
    let mut b = [0u8; 1];
    c.write_all(b"a").await.unwrap();
    c.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"a", "bytes pass before any toxic");
    // Added while the connection is open, as the bench does between its phases.
    latency(&api, "p", "upstream", 40).await;
    latency(&api, "p", "downstream", 40).await;
    for i in 0..3u8 {
        let t = Instant::now();
        c.write_all(&[i]).await.unwrap();
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(b[0], i);
        assert!(
            t.elapsed() >= Duration::from_millis(80),
            "round trip {:?}",
            t.elapsed()
        );
    }
}

#[tokio::test]
async fn test_bytes_arrive_whole_and_in_order_and_are_counted() {
    let api = server().await;
    let at = proxy(&api, "bulk", &echo().await).await;
    latency(&api, "bulk", "upstream", 5).await;
    latency(&api, "bulk", "downstream", 5).await;
    let data: Vec<u8> = (0..4u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let c = TcpStream::connect(&at).await.unwrap();
    let (mut r, mut w) = c.into_split();
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        w.write_all(&sent).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let mut back = Vec::new();
    r.read_to_end(&mut back).await.unwrap();
    writer.await.unwrap();
    assert!(
        back == data,
        "4 MiB came back changed ({} bytes)",
        back.len()
    );
    let (st, m) = call(&api, "GET", "/metrics", "").await;
    assert_eq!(st, 200);
    let count = |dir: &str| -> u64 {
        m.lines()
            .find(|l| {
                l.starts_with("toxiproxy_proxy_received_bytes_total")
                    && l.contains(&format!("direction=\"{dir}\""))
                    && l.contains("proxy=\"bulk\"")
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {dir} count in {m}"))
    };
    assert_eq!(count("upstream"), 4 << 20);
    assert_eq!(count("downstream"), 4 << 20);
}

#[tokio::test]
async fn test_a_bandwidth_cap_holds_the_sender_to_it() {
    let api = server().await;
    // A sink that says how long the bytes took to arrive.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sink = l.local_addr().unwrap().to_string();
    let took = tokio::spawn(async move {
        let (mut c, _) = l.accept().await.unwrap();
        let mut first = [0u8; 1];
        c.read_exact(&mut first).await.unwrap();
        let t = Instant::now();
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).await.unwrap();
        (t.elapsed(), rest.len() + 1)
    });
    let at = proxy(&api, "slow", &sink).await;
    let body = json!({"name": "bandwidth_upstream", "type": "bandwidth", "stream": "upstream",
        "toxicity": 1.0, "attributes": {"rate": 100}});
    let (st, text) = call(&api, "POST", "/proxies/slow/toxics", &body.to_string()).await;
    assert_eq!(st, 200, "{text}");
    let mut c = TcpStream::connect(&at).await.unwrap();
    c.write_all(&vec![7u8; 100_000]).await.unwrap();
    c.shutdown().await.unwrap();
    let (elapsed, n) = took.await.unwrap();
    assert_eq!(n, 100_000);
    // 100 KB at 100 KB/s, in 10 KB slices: the last starts 0.9 s after the first.
    assert!(elapsed >= Duration::from_millis(850), "took {elapsed:?}");
}

#[tokio::test]
async fn test_a_half_close_reaches_the_server_and_its_answer_comes_back() {
    let api = server().await;
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let srv = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (mut c, _) = l.accept().await.unwrap();
        let mut got = Vec::new();
        c.read_to_end(&mut got).await.unwrap();
        c.write_all(format!("done:{}", got.len()).as_bytes())
            .await
            .unwrap();
    });
    let at = proxy(&api, "half", &srv).await;
    latency(&api, "half", "downstream", 10).await;
    let mut c = TcpStream::connect(&at).await.unwrap();
    c.write_all(b"hello").await.unwrap();
    c.shutdown().await.unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).await.unwrap();
    assert_eq!(answer, "done:5");
}

#[tokio::test]
async fn test_bad_requests_are_refused_with_a_reason() {
    let api = server().await;
    let at = proxy(&api, "p", "127.0.0.1:9").await;
    assert!(at.starts_with("127.0.0.1:") && !at.ends_with(":0"));
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        (
            "POST",
            "/proxies",
            json!({"name": "p", "listen": "127.0.0.1:0", "upstream": "x:1"}).to_string(),
            409,
            "exists",
        ),
        (
            "POST",
            "/proxies",
            json!({"name": "q", "listen": "0.0.0.0:0", "upstream": "x:1"}).to_string(),
            400,
            "loopback",
        ),
        (
            "POST",
            "/proxies",
            json!({"name": "", "listen": "127.0.0.1:0", "upstream": "x:1"}).to_string(),
            400,
            "name",
        ),
        ("POST", "/proxies", "{not json".to_string(), 400, "JSON"),
        (
            "POST",
            "/proxies/nope/toxics",
            json!({"type": "latency", "attributes": {"latency": 1}}).to_string(),
            404,
            "No proxy",
        ),
        (
            "POST",
            "/proxies/p/toxics",
            json!({"type": "slicer"}).to_string(),
            400,
            "Unknown toxic",
        ),
        (
            "POST",
            "/proxies/p/toxics",
            json!({"type": "latency", "stream": "sideways", "attributes": {"latency": 1}})
                .to_string(),
            400,
            "stream",
        ),
        (
            "POST",
            "/proxies/p/toxics",
            json!({"type": "latency", "attributes": {"latency": 1, "jitter": 5}}).to_string(),
            400,
            "jitter",
        ),
        (
            "POST",
            "/proxies/p/toxics",
            json!({"type": "bandwidth", "attributes": {"rate": 0}}).to_string(),
            400,
            "rate",
        ),
        (
            "DELETE",
            "/proxies/p/toxics/none",
            String::new(),
            404,
            "No toxic",
        ),
        ("GET", "/nothing", String::new(), 404, "No route"),
    ];
    for (method, path, body, want, says) in cases {
        let (st, text) = call(&api, method, path, &body).await;
        assert_eq!(st, want, "{method} {path} {body}: {text}");
        assert!(text.contains(says), "{method} {path}: {text}");
    }
    latency(&api, "p", "upstream", 3).await;
    let (st, _) = call(&api, "DELETE", "/proxies/p/toxics/latency_upstream", "").await;
    assert_eq!(st, 204);
    let (st, _) = call(&api, "DELETE", "/proxies/p/toxics/latency_upstream", "").await;
    assert_eq!(st, 404, "removed once");
    // Garbage instead of HTTP.
    let mut s = TcpStream::connect(&api).await.unwrap();
    s.write_all(b"\x00\x01garbage\r\n\r\n").await.unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw).await;
    let raw = String::from_utf8_lossy(&raw);
    assert!(raw.is_empty() || raw.starts_with("HTTP/1.1 4"), "{raw}");
    let (st, _) = call(&api, "GET", "/version", "").await;
    assert_eq!(st, 200, "the server still answers");
}
