//! The rate limit with a hand-moved clock and the real fmt layer writing to memory:
//! what an operator would read in node.log.
use super::*;
use tracing_subscriber::layer::SubscriberExt;

/// Everything written, shared between the writer and the test.
#[derive(Clone, Default)]
pub(crate) struct Buf(pub(crate) Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buf {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock())
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// A clock the test moves by hand.
#[derive(Clone)]
struct FakeClock(Arc<Mutex<Instant>>);

impl FakeClock {
    fn new() -> Self {
        FakeClock(Arc::new(Mutex::new(Instant::now())))
    }
    fn advance(&self, d: Duration) {
        *self.0.lock() += d;
    }
    fn clock(&self) -> Clock {
        let t = self.0.clone();
        Arc::new(move || *t.lock())
    }
}

const LIMIT: Limit = Limit {
    burst: 3,
    per: Duration::from_secs(60),
    level: Level::WARN,
    targets: &[drove_types::CONNECTION_LOG],
};

/// Run `f` with a subscriber whose only output is the limited fmt layer.
fn logged(clock: &FakeClock, f: impl FnOnce()) -> Vec<String> {
    let buf = Buf::default();
    let out = buf.clone();
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(move || out.clone())
        .with_ansi(false)
        .without_time();
    let sub = tracing_subscriber::registry().with(RateLimit::with_clock(fmt, LIMIT, clock.clock()));
    tracing::subscriber::with_default(sub, f);
    buf.lines()
}

/// One callsite: every call of this function is the same `warn!`.
fn peer_down(i: u32) {
    tracing::warn!(i, "peer 2 unreachable");
}

fn other_warning() {
    tracing::warn!("another warning");
}

#[test]
fn test_a_callsite_logs_burst_lines_per_window_then_one_summary() {
    let clock = FakeClock::new();
    let lines = logged(&clock, || {
        for i in 0..10 {
            peer_down(i);
        }
        clock.advance(Duration::from_secs(59));
        peer_down(10); // still the first window: suppressed
        clock.advance(Duration::from_secs(2));
        peer_down(11); // a new window: the summary, then this one
        peer_down(12);
        peer_down(13);
        peer_down(14); // the new window's burst is spent again
    });
    let shown: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("peer 2 unreachable"))
        .collect();
    assert_eq!(shown.len(), 6, "{lines:#?}");
    for (l, i) in shown.iter().zip([0, 1, 2, 11, 12, 13]) {
        assert!(l.contains(&format!("i={i}")), "{l}");
    }
    let summaries: Vec<&String> = lines.iter().filter(|l| l.contains("suppressed")).collect();
    assert_eq!(summaries.len(), 1, "{lines:#?}");
    assert!(
        summaries[0].contains("WARN")
            && summaries[0].contains("suppressed 8 similar messages from")
            && summaries[0].contains("log_limit_tests.rs:")
            && summaries[0].contains("in the last 61 s"),
        "{}",
        summaries[0]
    );
    // The summary comes before the first line of the next window.
    let at = |needle: &str| lines.iter().position(|l| l.contains(needle)).unwrap();
    assert!(at("suppressed 8") < at("i=11"), "{lines:#?}");
}

#[test]
fn test_callsites_have_their_own_budget_and_info_is_not_limited() {
    let clock = FakeClock::new();
    let lines = logged(&clock, || {
        for i in 0..5 {
            peer_down(i);
        }
        for _ in 0..3 {
            other_warning();
        }
        for i in 0..20 {
            tracing::info!(i, "node ready");
        }
    });
    let count = |needle: &str| lines.iter().filter(|l| l.contains(needle)).count();
    assert_eq!(count("peer 2 unreachable"), 3, "{lines:#?}");
    assert_eq!(count("another warning"), 3, "{lines:#?}");
    assert_eq!(count("node ready"), 20, "{lines:#?}");
    // No window has ended: nothing summarized yet.
    assert_eq!(count("suppressed"), 0, "{lines:#?}");
}

#[test]
fn test_a_summary_is_written_with_the_next_event_from_any_callsite() {
    let clock = FakeClock::new();
    let lines = logged(&clock, || {
        for i in 0..4 {
            peer_down(i);
        }
        clock.advance(Duration::from_secs(60));
        // Not from the noisy callsite, and not even limited: still the occasion.
        tracing::info!("scrub done");
        clock.advance(Duration::from_secs(60));
        tracing::info!("scrub done again"); // nothing left to summarize
    });
    let summaries: Vec<&String> = lines.iter().filter(|l| l.contains("suppressed")).collect();
    assert_eq!(summaries.len(), 1, "{lines:#?}");
    assert!(
        summaries[0].contains("suppressed 1 similar messages"),
        "{lines:#?}"
    );
    let at = |needle: &str| lines.iter().position(|l| l.contains(needle)).unwrap();
    assert!(at("suppressed 1") < at("scrub done"), "{lines:#?}");
}

#[test]
fn test_an_error_summary_keeps_the_error_level() {
    let clock = FakeClock::new();
    let lines = logged(&clock, || {
        for _ in 0..5 {
            tracing::error!("append entries failed");
        }
        clock.advance(Duration::from_secs(61));
        other_warning();
    });
    let summary = lines
        .iter()
        .find(|l| l.contains("suppressed 2 similar messages"))
        .unwrap_or_else(|| panic!("no summary: {lines:#?}"));
    assert!(summary.contains("ERROR"), "{summary}");
}

#[test]
fn test_summaries_name_a_dependency_by_its_crate_path() {
    assert_eq!(
        short_path("/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/openraft-0.9.25/src/replication/mod.rs"),
        "openraft-0.9.25/src/replication/mod.rs"
    );
    assert_eq!(
        short_path("crates/meta/src/startup.rs"),
        "crates/meta/src/startup.rs"
    );
}

#[test]
fn test_per_connection_lines_are_limited_whatever_their_level() {
    let clock = FakeClock::new();
    let lines = logged(&clock, || {
        for i in 0..10 {
            tracing::info!(target: drove_types::CONNECTION_LOG, i, "nbd connection ended");
        }
        clock.advance(Duration::from_secs(61));
        tracing::info!("scrub done");
    });
    let count = |needle: &str| lines.iter().filter(|l| l.contains(needle)).count();
    assert_eq!(count("nbd connection ended"), 3, "{lines:#?}");
    let summary = lines
        .iter()
        .find(|l| l.contains("suppressed 7 similar messages from drove::connection"))
        .unwrap_or_else(|| panic!("no summary: {lines:#?}"));
    assert!(summary.contains("INFO"), "{summary}");
}
