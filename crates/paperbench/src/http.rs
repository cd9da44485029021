//! A blocking HTTP client (ureq) for the three local HTTP endpoints the harness
//! talks to: the WAN proxy's REST API, the nodes' `/metrics`, and the timed round
//! trip of the delay check. A new connection per request, so that a timed request
//! includes its connect, as a client's first request across the WAN would.
use anyhow::{bail, Context, Result};
use std::time::{Duration, Instant};

/// An answer.
#[derive(Clone, Debug)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// The body.
    pub body: String,
    /// Time from before connecting to the end of the answer.
    pub elapsed: Duration,
}

/// Send one request to `addr` (host:port) and read the whole answer; an answer
/// with any status is a `Response`, only a failure to get one is an error.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> Result<Response> {
    let agent = ureq::AgentBuilder::new()
        .timeout(timeout)
        .max_idle_connections(0)
        .build();
    let url = format!("http://{addr}{path}");
    let start = Instant::now();
    let req = agent
        .request(method, &url)
        .set("Content-Type", "application/json");
    let res = match body {
        Some(b) => req.send_string(b),
        None => req.call(),
    };
    let resp = match res {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => return Err(anyhow::Error::new(e)).with_context(|| format!("{method} {url}")),
    };
    let status = resp.status();
    let body = resp
        .into_string()
        .with_context(|| format!("Reading the answer of {method} {url}"))?;
    Ok(Response {
        status,
        body,
        elapsed: start.elapsed(),
    })
}

/// GET `path` and require a 2xx answer.
pub fn get_ok(addr: &str, path: &str, timeout: Duration) -> Result<String> {
    let r = request(addr, "GET", path, None, timeout)?;
    if !(200..300).contains(&r.status) {
        bail!("GET {addr}{path} answered {}: {}", r.status, r.body.trim());
    }
    Ok(r.body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn test_request_against_a_local_server() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let t = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut buf = [0u8; 1024];
            let n = c.read(&mut buf).unwrap();
            let req = String::from_utf8_lossy(&buf[..n]).to_string();
            c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nyes")
                .unwrap();
            req
        });
        let body = get_ok(&addr, "/version", Duration::from_secs(5)).unwrap();
        assert_eq!(body, "yes");
        let req = t.join().unwrap();
        assert!(req.starts_with("GET /version HTTP/1.1\r\n"), "{req}");
    }

    #[test]
    fn test_an_error_status_is_an_answer_and_chunked_bodies_are_read() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let t = std::thread::spawn(move || {
            for _ in 0..2 {
                let (mut c, _) = l.accept().unwrap();
                let mut buf = [0u8; 1024];
                let _ = c.read(&mut buf).unwrap();
                c.write_all(
                    b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nno!\r\n0\r\n\r\n",
                )
                .unwrap();
            }
        });
        let r = request(&addr, "DELETE", "/x", None, Duration::from_secs(5)).unwrap();
        assert_eq!((r.status, r.body.as_str()), (404, "no!"));
        let e = get_ok(&addr, "/x", Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains("answered 404: no!"), "{e}");
        t.join().unwrap();
        // Nothing listens: an error, not an answer.
        let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = gone.local_addr().unwrap().to_string();
        drop(gone);
        assert!(request(&dead, "GET", "/", None, Duration::from_secs(5)).is_err());
    }
}
