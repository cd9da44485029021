//! The CLI's side of the admin API: one HTTP client, errors turned into sentences.
use crate::addr::ClusterAddr;
use anyhow::{anyhow, Result};
use drove_daemon::api::ApiError;
use serde::{de::DeserializeOwned, Serialize};
use std::time::Duration;

/// Where the cluster is and how to print.
pub struct Ctx {
    /// The parsed `--cluster` / `DROVE_CLUSTER` / default; a bad one is reported by
    /// the first command that needs the cluster, so that `drove up` or `node run` do
    /// not fail on a variable they never read.
    cluster: std::result::Result<ClusterAddr, String>,
    pub json: bool,
    http: reqwest::Client,
}

impl Ctx {
    pub fn new(cluster: std::result::Result<ClusterAddr, String>, json: bool) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .connect_timeout(Duration::from_secs(3))
            // Nodes close admin connections silent for 60 s; never reuse one that old.
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        Ctx {
            cluster,
            json,
            http,
        }
    }

    /// The cluster's admin `host:port`, or why the given address is not one.
    fn cluster(&self) -> Result<&str> {
        match &self.cluster {
            Ok(c) => Ok(&c.authority),
            Err(e) => Err(anyhow!("{e}")),
        }
    }

    fn url(&self, addr: &str, path: &str) -> String {
        format!("http://{addr}{path}")
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
        let resp = self.http.post(self.url(addr, path)).json(body).send().await;
        self.decode(addr, resp).await
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
        let resp = self.http.delete(self.url(addr, path)).send().await;
        self.decode(addr, resp).await
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
            anyhow!(
                "Cannot reach the cluster at {addr} ({}): {}; is a drove node running there?",
                self.origin(addr),
                root_cause(&e)
            )
        })?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| anyhow!("Reading the answer from {addr} failed: {e}"))?;
        if !status.is_success() {
            if let Ok(err) = serde_json::from_slice::<ApiError>(&body) {
                return Err(anyhow!("{}", err.message));
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
