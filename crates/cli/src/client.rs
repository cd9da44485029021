//! The CLI's side of the admin API: one HTTP client, errors turned into sentences.
use anyhow::{anyhow, Result};
use drove_daemon::api::ApiError;
use serde::{de::DeserializeOwned, Serialize};
use std::time::Duration;

/// Where the cluster is and how to print.
pub struct Ctx {
    pub cluster: String,
    pub json: bool,
    http: reqwest::Client,
}

impl Ctx {
    pub fn new(cluster: Option<String>, json: bool) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .connect_timeout(Duration::from_secs(3))
            // Nodes close admin connections silent for 60 s; never reuse one that old.
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        Ctx {
            cluster: cluster.unwrap_or_else(|| "127.0.0.1:7000".to_string()),
            json,
            http,
        }
    }

    fn url(&self, addr: &str, path: &str) -> String {
        format!("http://{addr}{path}")
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.get_at(&self.cluster, path).await
    }

    pub async fn get_at<T: DeserializeOwned>(&self, addr: &str, path: &str) -> Result<T> {
        let resp = self.http.get(self.url(addr, path)).send().await;
        self.decode(addr, resp).await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> Result<T> {
        let resp = self
            .http
            .post(self.url(&self.cluster, path))
            .json(body)
            .send()
            .await;
        self.decode(&self.cluster, resp).await
    }

    /// POST with a longer timeout than the default (checks, scrubs).
    pub async fn post_long<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        timeout: Duration,
    ) -> Result<T> {
        let addr = self.cluster.clone();
        self.post_at_long(&addr, path, body, timeout).await
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
        let resp = self.http.delete(self.url(&self.cluster, path)).send().await;
        self.decode(&self.cluster, resp).await
    }

    async fn decode<T: DeserializeOwned>(
        &self,
        addr: &str,
        resp: reqwest::Result<reqwest::Response>,
    ) -> Result<T> {
        let resp = resp.map_err(|e| {
            anyhow!(
                "Cannot reach the cluster at {addr} ({}); is a node running there? Set --cluster or DROVE_CLUSTER",
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
