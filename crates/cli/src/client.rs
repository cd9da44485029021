//! The CLI's side of the admin API: one HTTP client, errors turned into sentences.
use crate::addr::ClusterAddr;
use anyhow::{anyhow, Result};
use drove_daemon::api::{ApiError, ClientRequestId, REQUEST_ID_HEADER};
use serde::{de::DeserializeOwned, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a change whose outcome is not known is sent again (with the same
/// request id, so it is applied at most once) before the CLI says it is unknown.
const RETRY_FOR: Duration = Duration::from_secs(30);

/// Request ids of successive changes made by one command are this far apart (each
/// change may cause several metadata commands, numbered from its id).
const CALL_STRIDE: u64 = 1 << 16;

/// The outcome of a change is not known: it was sent, and no definite answer came
/// before [`RETRY_FOR`] ran out. Printed without "error:" (it may have happened);
/// `drove` exits with status 3.
#[derive(Debug)]
pub struct OutcomeUnknown {
    /// The request id the change was sent with.
    pub request_id: ClientRequestId,
    /// The last reason no answer came.
    pub why: String,
}

impl std::fmt::Display for OutcomeUnknown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}. This change may or may not have taken effect: no definite answer came \
             within {} s (it may still be applied once a metadata majority answers). To \
             learn its outcome without acting twice, run the same command again with \
             --request-id {} (the cluster remembers the outcomes of its last 1024 \
             commands); or look with `drove vdi list` or `drove cluster health`.",
            self.why,
            RETRY_FOR.as_secs(),
            self.request_id
        )
    }
}

impl std::error::Error for OutcomeUnknown {}

/// A node's definite "no" to a request: its error kind (`not_found`, `invalid`,
/// `already_exists`, ...) and message. Shown as the message; `--json` prints the kind.
#[derive(Debug)]
pub struct Refused {
    /// Snake-case kind, as the admin API names it.
    pub kind: String,
    /// What the node said.
    pub message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Refused {}

/// A random number (no cryptographic strength needed: it only has to differ
/// between commands).
fn random_u64() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new()
        .hash_one((std::time::SystemTime::now(), std::process::id()))
}

/// The admin API client: timeouts, the token in every request when there is one
/// (marked sensitive: never printed in debug output), HTTPS trusting the cluster's
/// CA when `tls` is given.
fn http_client(
    token: Option<&str>,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> std::result::Result<reqwest::Client, String> {
    let headers = drove_daemon::api::token_headers(token)?;
    let mut builder = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .connect_timeout(Duration::from_secs(3))
        // Nodes close admin connections silent for 60 s; never reuse one that old.
        .pool_idle_timeout(Duration::from_secs(30))
        .http1_only()
        .default_headers(headers);
    if let Some(tls) = tls {
        builder = builder.use_preconfigured_tls(rustls::ClientConfig::clone(tls));
    }
    builder
        .build()
        .map_err(|e| format!("Cannot make an HTTP client: {e}"))
}

/// The TLS of the admin API from `--ca` / `DROVE_CA`: a CA certificate file, or a
/// directory holding `ca-cert.pem` (and, when both are there, `client-cert.pem` and
/// `client-key.pem`, presented to the node: `drove up` writes DIR/tls so).
pub fn admin_tls(
    ca: Option<&Path>,
) -> std::result::Result<Option<Arc<rustls::ClientConfig>>, String> {
    let Some(ca) = ca else {
        return Ok(None);
    };
    let bad =
        |e: drove_tls::Error| format!("Cannot use the CA of DROVE_CA/--ca {}: {e}", ca.display());
    if ca.is_dir() {
        let id = drove_tls::Identity::client(ca);
        let id = (id.cert.is_file() && id.key.is_file()).then_some(id);
        drove_tls::admin_client_config(&ca.join(drove_tls::CA_CERT), id.as_ref())
            .map(Some)
            .map_err(bad)
    } else {
        drove_tls::admin_client_config(ca, None)
            .map(Some)
            .map_err(bad)
    }
}

/// The secret in token file `path`: its text without surrounding white space.
pub fn read_token_file(path: &std::path::Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow!("Cannot read the token file {}: {e}", path.display()))?;
    let t = text.trim();
    if t.is_empty() {
        return Err(anyhow!("The token file {} is empty", path.display()));
    }
    Ok(t.to_string())
}

/// The admin API token the CLI sends: `DROVE_TOKEN` (the secret itself), else the
/// content of `file` (`--token-file` / `DROVE_TOKEN_FILE`); `None` when neither is
/// given.
pub fn token_from(
    env: Option<String>,
    file: Option<&std::path::Path>,
) -> std::result::Result<Option<String>, String> {
    if let Some(t) = env.map(|t| t.trim().to_string()).filter(|t| !t.is_empty()) {
        return Ok(Some(t));
    }
    match file {
        Some(p) => read_token_file(p).map(Some).map_err(|e| format!("{e}")),
        None => Ok(None),
    }
}

/// Where the cluster is and how to print.
pub struct Ctx {
    /// The parsed `--cluster` / `DROVE_CLUSTER` / default; a bad one is reported by
    /// the first command that needs the cluster, so that `drove up` or `node run` do
    /// not fail on a variable they never read.
    cluster: std::result::Result<ClusterAddr, String>,
    pub json: bool,
    http: reqwest::Client,
    /// HTTPS trusting the cluster's CA (`DROVE_CA`); `None`: plain HTTP.
    tls: Option<Arc<rustls::ClientConfig>>,
    /// `DROVE_CA` / `--ca` as given (a file or a directory): NBD over TCP takes its
    /// client certificate from there ([`Ctx::nbd_tls_dir`]).
    ca: Option<PathBuf>,
    /// Why the admin API token or the CA could not be read (a bad DROVE_TOKEN_FILE
    /// or DROVE_CA): reported by the first command that asks the cluster, like a
    /// bad cluster address.
    token_error: Option<String>,
    /// The request id of this command's first change.
    request: ClientRequestId,
    /// Changes sent so far.
    calls: AtomicU64,
}

impl Ctx {
    /// `request`: the id of the first change this command makes (`--request-id`);
    /// a random one when absent.
    /// `token`: the admin API token to send (`DROVE_TOKEN`, `--token-file`), or why
    /// it could not be read.
    pub fn new(
        cluster: std::result::Result<ClusterAddr, String>,
        json: bool,
        request: Option<ClientRequestId>,
        token: std::result::Result<Option<String>, String>,
        ca: Option<&Path>,
    ) -> Self {
        let setup = token.and_then(|t| Ok((t, admin_tls(ca)?)));
        let (token, tls, token_error) = match setup {
            Ok((t, tls)) => (t, tls, None),
            Err(e) => (None, None, Some(e)),
        };
        let (http, token_error) = match http_client(token.as_deref(), tls.as_ref()) {
            Ok(h) => (h, token_error),
            Err(e) => (reqwest::Client::new(), Some(e)),
        };
        Ctx {
            cluster,
            json,
            http,
            tls,
            ca: ca.map(Path::to_path_buf),
            token_error,
            request: request.unwrap_or_else(|| ClientRequestId {
                client: random_u64(),
                seq: 0,
            }),
            calls: AtomicU64::new(0),
        }
    }

    /// The same context with a cluster's own credentials instead of the ones the
    /// environment gives (`DROVE_CA`, `DROVE_TOKEN`, `DROVE_TOKEN_FILE`, which may
    /// be another cluster's): admin API token `token`, and HTTPS with the CA (and
    /// client certificate) of directory `ca_dir`, or plain HTTP without one. For a
    /// command that runs its own cluster (`drove up` with its DIR/tls and token).
    pub fn for_own_cluster(&self, token: Option<String>, ca_dir: Option<&Path>) -> Result<Ctx> {
        let tls = admin_tls(ca_dir).map_err(|e| anyhow!("{e}"))?;
        self.rebuilt(token, tls, ca_dir.map(Path::to_path_buf))
    }

    fn rebuilt(
        &self,
        token: Option<String>,
        tls: Option<Arc<rustls::ClientConfig>>,
        ca: Option<PathBuf>,
    ) -> Result<Ctx> {
        Ok(Ctx {
            cluster: self.cluster.clone(),
            json: self.json,
            http: http_client(token.as_deref(), tls.as_ref()).map_err(|e| anyhow!("{e}"))?,
            tls,
            ca,
            token_error: None,
            request: self.request,
            calls: AtomicU64::new(self.calls.load(Ordering::Relaxed)),
        })
    }

    /// The directory of `DROVE_CA` / `--ca` when it holds a client certificate
    /// (`ca-cert.pem`, `client-cert.pem`, `client-key.pem`, the names QEMU and libnbd
    /// read): NBD over TCP then speaks TLS with it. `None` for a CA file, or a
    /// directory without a client certificate.
    pub(crate) fn nbd_tls_dir(&self) -> Option<&Path> {
        let dir = self.ca.as_deref().filter(|d| d.is_dir())?;
        let id = drove_tls::Identity::client(dir);
        (dir.join(drove_tls::CA_CERT).is_file() && id.cert.is_file() && id.key.is_file())
            .then_some(dir)
    }

    /// The request id of the next change.
    fn next_request_id(&self) -> ClientRequestId {
        let k = self.calls.fetch_add(1, Ordering::Relaxed);
        ClientRequestId {
            client: self.request.client,
            seq: self.request.seq.wrapping_add(k.wrapping_mul(CALL_STRIDE)),
        }
    }

    /// Send a change to `addr` (`build` makes the request) under one request id,
    /// again while its outcome is unknown (sent, no definite answer) and
    /// [`RETRY_FOR`] lasts. A call that never left (connection refused) and any
    /// definite answer end it at once.
    async fn change<T: DeserializeOwned>(
        &self,
        addr: &str,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<T> {
        let id = self.next_request_id();
        let deadline = Instant::now() + RETRY_FOR;
        let mut unknown: Option<String> = None;
        let mut delay = Duration::from_millis(500);
        loop {
            let resp = build()
                .header(REQUEST_ID_HEADER, id.to_string())
                .send()
                .await;
            let why = match resp {
                Err(e) if unknown.is_none() && e.is_connect() => {
                    return self.decode(addr, Err(e)).await;
                }
                Err(e) => format!("{addr}: {}", root_cause(&e)),
                Ok(r) if r.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE => {
                    let body = r.bytes().await.unwrap_or_default();
                    match serde_json::from_slice::<ApiError>(&body) {
                        Ok(err) if err.error == "outcome_unknown" || unknown.is_some() => {
                            err.message
                        }
                        Ok(err) => {
                            return Err(Refused {
                                kind: err.error,
                                message: err.message,
                            }
                            .into())
                        }
                        Err(_) if unknown.is_some() => {
                            format!("{addr} answered 503: {}", String::from_utf8_lossy(&body))
                        }
                        Err(_) => {
                            return Err(crate::fail::unavailable(format!(
                                "{addr} answered 503: {}",
                                String::from_utf8_lossy(&body)
                            )))
                        }
                    }
                }
                Ok(r) => {
                    let res = self.decode(addr, Ok(r)).await;
                    return match (res, &unknown) {
                        (Err(e), Some(_)) => Err(e.context(format!(
                            "an earlier try of this change (request id {id}) got no \
                             answer and may have taken effect, which would explain this answer"
                        ))),
                        (res, _) => res,
                    };
                }
            };
            if Instant::now() + delay >= deadline {
                return Err(OutcomeUnknown {
                    request_id: id,
                    why,
                }
                .into());
            }
            eprintln!(
                "no definite answer yet ({why}); asking again with the same request id, \
                 for up to {} s more",
                deadline.saturating_duration_since(Instant::now()).as_secs()
            );
            unknown = Some(why);
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(4));
        }
    }

    /// The cluster's admin `host:port`, or why the given address is not one (or
    /// the token cannot be sent).
    fn cluster(&self) -> Result<&str> {
        if let Some(e) = &self.token_error {
            return Err(crate::fail::invalid(e.clone()));
        }
        match &self.cluster {
            Ok(c) if c.scheme == Some("https") && self.tls.is_none() => {
                Err(crate::fail::invalid(format!(
                    "{} asks for https: give the cluster's CA certificate with DROVE_CA=FILE \
                     or --ca FILE (a cluster of `drove up`: its DIR/tls)",
                    c.given
                )))
            }
            Ok(c) => Ok(&c.authority),
            Err(e) => Err(crate::fail::invalid(e.clone())),
        }
    }

    /// `https` with the cluster's CA unless the address says `http://`.
    fn scheme(&self) -> &'static str {
        match &self.cluster {
            Ok(c) if c.scheme == Some("http") => "http",
            _ if self.tls.is_some() => "https",
            _ => "http",
        }
    }

    fn url(&self, addr: &str, path: &str) -> String {
        format!("{}://{addr}{path}", self.scheme())
    }

    /// GET `path` with `consistent=true` (the node first confirms with the metadata
    /// leader that its view is current); when it cannot (no majority), the node's
    /// last view, with a warning on stderr that it may be out of date.
    pub async fn get_consistent<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let addr = self.cluster()?;
        let sep = if path.contains('?') { '&' } else { '?' };
        let url = self.url(addr, &format!("{path}{sep}consistent=true"));
        let resp = self.http.get(&url).send().await;
        if let Ok(r) = &resp {
            if r.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE {
                let why = match resp {
                    Ok(r) => {
                        let body = r.bytes().await.unwrap_or_default();
                        serde_json::from_slice::<ApiError>(&body)
                            .map(|e| e.message)
                            .unwrap_or_else(|_| String::from_utf8_lossy(&body).into_owned())
                    }
                    Err(e) => e.to_string(),
                };
                eprintln!(
                    "WARNING: {addr} could not confirm that its view is current ({why}); \
                     showing its last view, which may be out of date"
                );
                return self.get(path).await;
            }
        }
        self.decode(addr, resp).await
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.get_at(self.cluster()?, path).await
    }

    pub async fn get_at<T: DeserializeOwned>(&self, addr: &str, path: &str) -> Result<T> {
        let resp = self.http.get(self.url(addr, path)).send().await;
        self.decode(addr, resp).await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> Result<T> {
        self.post_at(self.cluster()?, path, body).await
    }

    /// POST to a given node.
    pub async fn post_at<B: Serialize, T: DeserializeOwned>(
        &self,
        addr: &str,
        path: &str,
        body: &B,
    ) -> Result<T> {
        let url = self.url(addr, path);
        self.change(addr, || self.http.post(&url).json(body)).await
    }

    /// POST with a longer timeout than the default (checks, scrubs).
    pub async fn post_long<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        timeout: Duration,
    ) -> Result<T> {
        self.post_at_long(self.cluster()?, path, body, timeout)
            .await
    }

    /// POST to a given node with a longer timeout than the default.
    pub async fn post_at_long<B: Serialize, T: DeserializeOwned>(
        &self,
        addr: &str,
        path: &str,
        body: &B,
        timeout: Duration,
    ) -> Result<T> {
        let resp = self
            .http
            .post(self.url(addr, path))
            .timeout(timeout)
            .json(body)
            .send()
            .await;
        self.decode(addr, resp).await
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let addr = self.cluster()?;
        let url = self.url(addr, path);
        self.change(addr, || self.http.delete(&url)).await
    }

    /// How `addr` was chosen, when it is the cluster address the user gave (or
    /// the default): "from --cluster …", "from DROVE_CLUSTER=…", "the default; …".
    /// Other addresses come from the cluster map.
    fn origin(&self, addr: &str) -> String {
        match &self.cluster {
            Ok(c) if c.authority == addr => c.origin(),
            _ => "a node's address in the cluster map".to_string(),
        }
    }

    async fn decode<T: DeserializeOwned>(
        &self,
        addr: &str,
        resp: reqwest::Result<reqwest::Response>,
    ) -> Result<T> {
        let resp = resp.map_err(|e| {
            let how = match self.scheme() {
                "https" => {
                    " over HTTPS (DROVE_CA is set; a node without certificates \
                            speaks plain HTTP)"
                }
                _ => "",
            };
            crate::fail::unavailable(format!(
                "Cannot reach the cluster at {addr} ({}){how}: {}; is a drove node running there?",
                self.origin(addr),
                root_cause(&e)
            ))
        })?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| anyhow!("Reading the answer from {addr} failed: {e}"))?;
        if !status.is_success() {
            if let Ok(err) = serde_json::from_slice::<ApiError>(&body) {
                return Err(Refused {
                    kind: err.error,
                    message: err.message,
                }
                .into());
            }
            return Err(anyhow!(
                "{addr} answered {status}: {}",
                String::from_utf8_lossy(&body)
            ));
        }
        serde_json::from_slice(&body).map_err(|e| anyhow!("Unexpected answer from {addr}: {e}"))
    }
}

fn root_cause(e: &dyn std::error::Error) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// Print `v` as pretty JSON.
pub fn print_json<T: Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}
