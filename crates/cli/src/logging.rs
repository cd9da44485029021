//! Where `drove node run` logs: stderr by default (for systemd/journald, which
//! stores and rotates it), or with `--log-file PATH` a file it rotates itself
//! ([`LogFile`]). Either way repeated warnings are rate-limited per callsite
//! ([`RateLimit`]), and a panic is logged before the default hook prints it to
//! stderr, so that it is in the log file too.
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::log_file::LogFile;
use crate::log_limit::{Limit, RateLimit};

/// At most this many warnings or errors per callsite and minute; then one line
/// says how many more there were. openraft logs about 40 a second while a peer is
/// down; 20 a minute still shows that it goes on, and what it says.
const LIMIT: Limit = Limit {
    burst: 20,
    per: Duration::from_secs(60),
    level: tracing::Level::WARN,
};

/// The logging flags of `drove node run`.
#[derive(Args, Debug, Clone)]
pub struct LogArgs {
    /// Write the log to this file, rotated by size (FILE.1, FILE.2, ...), instead
    /// of stderr.
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// Size at which --log-file is rotated (K/M/G suffixes).
    #[arg(long, default_value = "64M", value_name = "SIZE")]
    pub log_max_size: String,
    /// Rotated files kept besides --log-file (0: the file is emptied instead).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub log_keep: u32,
}

/// Install the log subscriber and the panic hook; call once, first thing.
pub fn init(a: &LogArgs) -> Result<()> {
    let max_size = drove_types::parse_size(&a.log_max_size)
        .with_context(|| format!("Bad --log-max-size '{}'", a.log_max_size))?;
    let (writer, ansi) = match &a.log_file {
        None => (
            BoxMakeWriter::new(std::io::stderr),
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
        ),
        Some(path) => {
            let file = LogFile::open(path, max_size, a.log_keep)
                .with_context(|| format!("Cannot open the log file {}", path.display()))?;
            (BoxMakeWriter::new(file), false)
        }
    };
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(ansi);
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,openraft=warn".into());
    // Already set (a test that runs two nodes in one process): keep the first.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(RateLimit::new(fmt, LIMIT))
        .try_init();
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // A panic inside the logging itself does not come back here: tracing
        // drops events raised while it is already dispatching one on this thread.
        tracing::error!("{info}");
        default_hook(info);
    }));
    Ok(())
}
