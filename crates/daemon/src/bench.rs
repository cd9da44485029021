//! `POST /api/bench/locks`: write-lock acquire+release cycles run by this node, the
//! way its gateway takes and gives back a VDI's lock (`Meta::execute` of
//! `AcquireLock` then `ReleaseLock`: proposed here on the leader, forwarded to it
//! from any other node), for `drove bench meta`. Like `ceph tell osd.N bench`, the
//! work runs in the daemon so that it measures the daemon's own path; it touches
//! only VDIs whose names start with [`BENCH_PREFIX`], which the benchmark creates.
use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use drove_meta::{Command, Reply};
use drove_types::Error;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::admin::{Admin, ApiResult};
use crate::api::{BenchLocks, BenchResult};
use drove_types::clock::unix_ms as now_ms;

/// Names of the VDIs the lock benchmark may lock.
pub const BENCH_PREFIX: &str = "drove-bench-";

/// Most VDIs (workers) in one run, and most cycles.
const MAX_WORKERS: usize = 4096;
const MAX_CYCLES: usize = 10_000_000;

/// Lease of the benchmark's locks: each is released at once.
const LEASE_MS: u64 = 10_000;

pub fn router() -> Router<Admin> {
    Router::new().route("/api/bench/locks", post(locks))
}

async fn locks(State(a): State<Admin>, Json(req): Json<BenchLocks>) -> ApiResult<BenchResult> {
    if req.vdis.is_empty() || req.vdis.len() > MAX_WORKERS {
        return Err(Error::invalid(format!(
            "Give 1 to {MAX_WORKERS} VDIs (one worker each), not {}",
            req.vdis.len()
        ))
        .into());
    }
    if req.count == 0 || req.count > MAX_CYCLES {
        return Err(
            Error::invalid(format!("Give 1 to {MAX_CYCLES} cycles, not {}", req.count)).into(),
        );
    }
    let state = a.meta.state();
    for v in &req.vdis {
        if !v.starts_with(BENCH_PREFIX) {
            return Err(Error::invalid(format!(
                "VDI '{v}' is not the benchmark's: its name must start with '{BENCH_PREFIX}'"
            ))
            .into());
        }
        if !state.vdis.contains_key(v) {
            return Err(Error::not_found(format!("No VDI named '{v}'")).into());
        }
    }
    let next = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for vdi in req.vdis {
        let (meta, next, count) = (a.meta.clone(), next.clone(), req.count);
        workers.spawn(async move {
            // A run of its own per worker: its locks are never this node's real ones.
            let incarnation = drove_meta::random_u64();
            let mut lat = Vec::new();
            let mut failed = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < count {
                let t = Instant::now();
                match cycle(&meta, &vdi, incarnation).await {
                    Ok(()) => lat.push(t.elapsed().as_secs_f64() * 1e3),
                    Err(e) => failed.push(e.to_string()),
                }
            }
            (lat, failed)
        });
    }
    let mut lat = Vec::new();
    let mut failed = Vec::new();
    while let Some(w) = workers.join_next().await {
        let (l, f) = w.map_err(|e| Error::unavailable(format!("A benchmark task failed: {e}")))?;
        lat.extend(l);
        failed.extend(f);
    }
    let seconds = t0.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    Ok(Json(BenchResult {
        count: req.count,
        failed: failed.len(),
        seconds,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        first_error: failed.into_iter().next(),
    }))
}

/// Take `vdi`'s write lock and give it back.
async fn cycle(meta: &drove_meta::Meta, vdi: &str, incarnation: u64) -> drove_types::Result<()> {
    let reply = meta
        .execute(Command::AcquireLock {
            vdi: vdi.to_string(),
            node: meta.node_id(),
            now_ms: now_ms(),
            lease_ms: LEASE_MS,
            incarnation,
        })
        .await?;
    let Reply::Lock(l) = reply else {
        return Err(Error::invalid(format!(
            "Unexpected reply to a lock request: {reply:?}"
        )));
    };
    meta.execute(Command::ReleaseLock {
        vdi: vdi.to_string(),
        node: meta.node_id(),
        generation: l.generation,
    })
    .await?;
    Ok(())
}
