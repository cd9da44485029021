//! Where `drove node run` logs: stderr by default (for systemd/journald, which
//! stores and rotates it), or with `--log-file PATH` a file it rotates itself
//! ([`LogFile`]). Either way repeated warnings, and lines clients cause per
//! connection, are rate-limited per callsite ([`RateLimit`]), and a panic is logged before the default hook prints it to
//! stderr, so that it is in the log file too.
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{self, FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::{Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

use crate::log_file::LogFile;
use crate::log_limit::{Limit, RateLimit};

/// At most this many warnings or errors per callsite and minute, and lines a
/// client causes per connection (an NBD handshake timeout) whatever their level;
/// then one line says how many more there were. openraft logs about 40 a second
/// while a peer is down; 20 a minute still shows that it goes on, and what it says.
const LIMIT: Limit = Limit {
    burst: 20,
    per: Duration::from_secs(60),
    level: tracing::Level::WARN,
    targets: &[drove_types::CONNECTION_LOG],
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

/// The subscriber the output layers sit on.
type Base = tracing_subscriber::layer::Layered<EnvFilter, tracing_subscriber::Registry>;

/// Install the log subscriber and the panic hook; call once, first thing.
///
/// Under systemd (`$INVOCATION_ID` or `$JOURNAL_STREAM` set) stderr always gets
/// the log, for the journal, even with `--log-file`; and when stderr is the
/// journal's stream itself, lines carry their syslog priority (`<4>` for a warning,
/// so `journalctl -p warning` works) and no time stamp (the journal has its own).
pub fn init(a: &LogArgs) -> Result<()> {
    let max_size = drove_types::parse_size(&a.log_max_size)
        .with_context(|| format!("Bad --log-max-size '{}'", a.log_max_size))?;
    let file = match &a.log_file {
        None => None,
        Some(path) => Some(
            LogFile::open(path, max_size, a.log_keep)
                .with_context(|| format!("Cannot open the log file {}", path.display()))?,
        ),
    };
    let file_layer = file.map(|f| fmt::layer().with_writer(f).with_ansi(false));
    let to_stderr = a.log_file.is_none() || under_systemd();
    let stderr_layer: Option<Box<dyn Layer<Base> + Send + Sync>> = to_stderr.then(|| {
        if stderr_is_journal() {
            Box::new(
                fmt::layer()
                    .with_writer(std::io::stderr)
                    .event_format(Journal(fmt::format().without_time()))
                    .with_ansi(false),
            ) as Box<dyn Layer<Base> + Send + Sync>
        } else {
            Box::new(
                fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
            )
        }
    });
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,openraft=warn".into());
    // Already set (a test that runs two nodes in one process): keep the first.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(RateLimit::new(
            Layer::and_then(file_layer, stderr_layer),
            LIMIT,
        ))
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

/// Whether this process runs as a systemd service.
fn under_systemd() -> bool {
    std::env::var_os("INVOCATION_ID").is_some() || std::env::var_os("JOURNAL_STREAM").is_some()
}

/// Whether stderr is the journal's stream: `$JOURNAL_STREAM` is its "device:inode"
/// (systemd's own test, so that a redirected stderr is not taken for it).
fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    let Ok(m) = std::fs::File::from(fd).metadata() else {
        return false;
    };
    dev.parse() == Ok(m.dev()) && ino.parse() == Ok(m.ino())
}

/// The syslog priority of a level, as journald reads it from a `<N>` line prefix.
fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// An event format with the line's syslog priority in front (`<4>...`).
struct Journal<F>(F);

impl<S, N, F> FormatEvent<S, N> for Journal<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        write!(writer, "<{}>", priority(event.metadata().level()))?;
        self.0.format_event(ctx, writer, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log_limit::tests::Buf;

    #[test]
    fn journal_lines_carry_their_priority_and_no_time() {
        let buf = Buf::default();
        let out = buf.clone();
        let sub = tracing_subscriber::registry().with(
            fmt::layer()
                .with_writer(move || out.clone())
                .event_format(Journal(fmt::format().without_time()))
                .with_ansi(false),
        );
        tracing::subscriber::with_default(sub, || {
            tracing::error!("e1");
            tracing::warn!("w1");
            tracing::info!("i1");
        });
        let text = String::from_utf8(buf.0.lock().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("<3>ERROR"), "{text}");
        assert!(lines[1].starts_with("<4> WARN"), "{text}");
        assert!(lines[2].starts_with("<6> INFO"), "{text}");
        assert!(lines[2].ends_with("i1"), "{text}");
    }
}
