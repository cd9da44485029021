//! A minimal blocking HTTP/1.1 client over `std::net::TcpStream`, for the three
//! local HTTP endpoints the harness talks to: toxiproxy's REST API, the nodes'
//! `/metrics`, and the timed round trip of the delay check. One request per
//! connection (`Connection: close`), body read to EOF, chunked bodies decoded.
use anyhow::{anyhow, bail, Context, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// An answer.
#[derive(Clone, Debug)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// The body, decoded from chunked transfer if needed.
    pub body: String,
    /// Time from before connecting to the end of the answer.
    pub elapsed: Duration,
}

fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .with_context(|| format!("Bad address {addr}"))?
        .next()
        .ok_or_else(|| anyhow!("Address {addr} resolves to nothing"))
}

/// Send one request to `addr` (host:port) and read the whole answer.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> Result<Response> {
    let sa = resolve(addr)?;
    let start = Instant::now();
    let mut s = TcpStream::connect_timeout(&sa, timeout)
        .with_context(|| format!("Cannot connect to {addr}"))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let _ = s.set_nodelay(true);
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())
        .with_context(|| format!("Cannot send to {addr}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .with_context(|| format!("Reading the answer of {addr}{path} failed"))?;
    let elapsed = start.elapsed();
    let (status, body) = parse_response(&raw).with_context(|| format!("{method} {addr}{path}"))?;
    Ok(Response {
        status,
        body,
        elapsed,
    })
}

/// Split a raw HTTP/1.1 answer into status and (de-chunked) body.
pub fn parse_response(raw: &[u8]) -> Result<(u16, String)> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("Answer without a header end"))?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let body = &raw[split + 4..];
    let status_line = head.lines().next().unwrap_or_default();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("Bad status line '{status_line}'"))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow!("Truncated chunked body"))?;
        let size_txt = String::from_utf8_lossy(&b[..eol]);
        let size_hex = size_txt.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| anyhow!("Bad chunk size '{size_hex}'"))?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if b.len() < size {
            bail!("Truncated chunk");
        }
        out.extend_from_slice(&b[..size]);
        b = b.get(size + 2..).unwrap_or_default();
    }
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

    #[test]
    fn test_parse_plain_and_chunked_answers() {
        let (s, b) =
            parse_response(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok").unwrap();
        assert_eq!((s, b.as_str()), (201, "ok"));
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\n\r\n";
        let (s, b) = parse_response(raw).unwrap();
        assert_eq!((s, b.as_str()), (200, "hello world"));
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse_response(b"garbage\r\n\r\n").is_err());
        let bad = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
        assert!(parse_response(bad).is_err());
    }

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
}
