//! `drove bench paper`: the experiment of Shima and Dang, "Indexes for Distributed
//! File/Storage Systems as a Large Scale Virtual Machine Disk Image Storage in a Wide
//! Area Network", run against drove and against a centralized baseline (one qemu-nbd
//! box in zone 1) in the same run.
//!
//! This crate sits outside the data path: it drives real processes from the outside.
//! It starts a drove cluster with the `drove` binary, routes every node-to-node
//! connection between zones through a delay proxy (the WAN: `drove bench wan-proxy`,
//! or toxiproxy with `--wan-proxy toxiproxy`), starts the
//! baseline's qemu-nbd servers behind the same kind of proxy, and runs fio
//! (`ioengine=nbd`) clients in parallel. It reads throughput from fio's JSON, bytes
//! moved from the nodes' `/metrics`, machine load from `/proc/stat`, and writes
//! results.csv, indexes.csv, results.md and (with matplotlib) PNG charts.
//!
//! Pure parts (index arithmetic, parsing, layout, CSV) are separate modules so that
//! they are unit-tested without any process.
#![deny(missing_docs)]

/// `eprintln!` that never panics. Progress goes to stderr while the run owns child
/// processes (nodes, proxies, fio) that only its own cleanup stops; a closed stderr
/// (`2>&1 | head` after head exited) must drop the line, not panic part-way.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod baseline;
pub mod charts;
pub mod cluster;
pub mod config;
pub mod cpu;
pub mod fio;
pub mod http;
pub mod index;
pub mod measure;
pub mod metrics;
pub mod procs;
pub mod progress;
pub mod report;
pub mod report_compare;
pub mod report_traffic;
pub mod results;
pub mod runner;
pub mod sockets;
pub mod toxiproxy;
pub mod wan;

pub use config::{Op, PaperConfig, System};
pub use index::{latency_impact_ratio, median, parallelism_impact_ratio, ratio};
pub use procs::Cancel;
pub use results::{PointResult, Report};
pub use runner::{missing_tools, run};
