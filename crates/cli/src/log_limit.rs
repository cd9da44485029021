//! A rate limit on repeated log events, as a [`Layer`] wrapped around the layer that
//! writes them (the fmt layer of `drove node run`). While peers are down openraft
//! logs the same warning tens of times a second; left alone that buried everything
//! else in node.log and filled the disk. Per callsite (one `warn!` in the source), at
//! most `burst` events pass in each window of `per`; the rest are counted, and once
//! the window is over one line says how many were suppressed. Only events at
//! `level` or more severe are limited, and those of the `targets` named whatever
//! their level: the node's own info lines (ready, joined, scrub done) are rare and
//! each one matters, but a line any client causes once per connection
//! ([`drove_types::CONNECTION_LOG`]: an NBD handshake timeout) is as many as a flood
//! of connections makes.
//!
//! The summary of a window is written with the next event that reaches the layer
//! after the window ended, from any callsite, before that event; a node that falls
//! silent keeps the count until it logs again. The clock is injected for tests.
use parking_lot::Mutex;
use std::any::TypeId;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::span;
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_core::callsite::{Callsite, Identifier};
use tracing_core::field::FieldSet;
use tracing_core::metadata::Kind;
use tracing_subscriber::layer::{Context, Layer};

/// A source of "now", injected so tests can move time.
pub type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// How much of a callsite's output passes.
#[derive(Debug, Clone, Copy)]
pub struct Limit {
    /// Events that pass per window and callsite.
    pub burst: u32,
    /// The window.
    pub per: Duration,
    /// Events at this level or more severe are limited; others pass, unless their
    /// target is one of `targets`.
    pub level: Level,
    /// Targets whose events are limited whatever their level.
    pub targets: &'static [&'static str],
}

impl Limit {
    /// Whether events of `meta` are limited.
    fn limits(&self, meta: &Metadata<'_>) -> bool {
        *meta.level() <= self.level || self.targets.contains(&meta.target())
    }
}

/// One callsite's current window.
struct Window {
    meta: &'static Metadata<'static>,
    start: Instant,
    passed: u32,
    suppressed: u64,
}

/// The windows, keyed by the callsite's metadata address (unique per callsite and
/// stable for the process; the order only decides which summary prints first).
#[derive(Default)]
struct State {
    windows: BTreeMap<usize, Window>,
    /// The earliest end of a window with suppressed events, if any.
    next_due: Option<Instant>,
}

/// A window that ended with suppressed events: the summary to print.
struct Summary {
    meta: &'static Metadata<'static>,
    suppressed: u64,
    over: Duration,
}

/// `inner`, with repeated events limited per callsite.
pub struct RateLimit<L> {
    inner: L,
    limit: Limit,
    clock: Clock,
    state: Mutex<State>,
}

impl<L> RateLimit<L> {
    /// Limit `inner` by `limit`, on the real clock.
    pub fn new(inner: L, limit: Limit) -> Self {
        Self::with_clock(inner, limit, Arc::new(Instant::now))
    }

    /// Limit `inner` by `limit`, with time read from `clock`.
    pub fn with_clock(inner: L, limit: Limit, clock: Clock) -> Self {
        RateLimit {
            inner,
            limit,
            clock,
            state: Mutex::new(State::default()),
        }
    }

    /// Decide about one event at `now`: the summaries now due, and whether it passes.
    fn admit(&self, meta: &'static Metadata<'static>, now: Instant) -> (Vec<Summary>, bool) {
        let per = self.limit.per;
        let mut st = self.state.lock();
        let mut due = Vec::new();
        if st.next_due.is_some_and(|t| now >= t) {
            for w in st.windows.values_mut() {
                if w.suppressed > 0 && now >= w.start + per {
                    due.push(Summary {
                        meta: w.meta,
                        suppressed: w.suppressed,
                        over: now - w.start,
                    });
                    *w = Window {
                        meta: w.meta,
                        start: now,
                        passed: 0,
                        suppressed: 0,
                    };
                }
            }
            st.next_due = st
                .windows
                .values()
                .filter(|w| w.suppressed > 0)
                .map(|w| w.start + per)
                .min();
        }
        if !self.limit.limits(meta) {
            return (due, true);
        }
        let key = meta as *const Metadata<'static> as usize;
        let w = st.windows.entry(key).or_insert(Window {
            meta,
            start: now,
            passed: 0,
            suppressed: 0,
        });
        if now >= w.start + per {
            // Over, with nothing suppressed (else it was summarized above).
            w.start = now;
            w.passed = 0;
        }
        if w.passed < self.limit.burst {
            w.passed += 1;
            return (due, true);
        }
        w.suppressed += 1;
        let end = w.start + per;
        st.next_due = Some(st.next_due.map_or(end, |t| t.min(end)));
        (due, false)
    }
}

/// The metadata of summary lines, one per level (a summary keeps the level of what
/// it stands for, so level filters treat it alike).
macro_rules! summary_callsite {
    ($cs:ident, $ty:ident, $meta:ident, $level:expr) => {
        struct $ty;
        static $cs: $ty = $ty;
        static $meta: Metadata<'static> = Metadata::new(
            "suppressed similar messages",
            "drove::log_limit",
            $level,
            Some(file!()),
            Some(line!()),
            Some(module_path!()),
            FieldSet::new(&["message"], Identifier(&$cs)),
            Kind::EVENT,
        );
        impl Callsite for $ty {
            fn set_interest(&self, _: Interest) {}
            fn metadata(&self) -> &Metadata<'_> {
                &$meta
            }
        }
    };
}
summary_callsite!(ERROR_CS, ErrorCs, ERROR_META, Level::ERROR);
summary_callsite!(WARN_CS, WarnCs, WARN_META, Level::WARN);
summary_callsite!(INFO_CS, InfoCs, INFO_META, Level::INFO);
summary_callsite!(DEBUG_CS, DebugCs, DEBUG_META, Level::DEBUG);
summary_callsite!(TRACE_CS, TraceCs, TRACE_META, Level::TRACE);

fn summary_meta(level: Level) -> &'static Metadata<'static> {
    match level {
        Level::ERROR => &ERROR_META,
        Level::WARN => &WARN_META,
        Level::INFO => &INFO_META,
        Level::DEBUG => &DEBUG_META,
        _ => &TRACE_META,
    }
}

impl<L> RateLimit<L> {
    /// Hand one summary line to the inner layer as an event of its own.
    fn summarize<S: Subscriber>(&self, s: &Summary, ctx: &Context<'_, S>)
    where
        L: Layer<S>,
    {
        let meta = summary_meta(*s.meta.level());
        let Some(field) = meta.fields().field("message") else {
            return;
        };
        let at = match (s.meta.file(), s.meta.line()) {
            (Some(f), Some(l)) => format!(" ({}:{l})", short_path(f)),
            _ => String::new(),
        };
        let text = format!(
            "suppressed {} similar messages from {}{at} in the last {} s",
            s.suppressed,
            s.meta.target(),
            s.over.as_secs()
        );
        let text = text.as_str();
        let values = [(&field, Some(&text as &dyn tracing::Value))];
        let values = meta.fields().value_set(&values);
        self.inner.on_event(&Event::new(meta, &values), ctx.clone());
    }
}

/// A dependency's source path from the crate on (`openraft-0.9.25/src/…`), not
/// from the build machine's cargo registry; drove's own paths are short already.
fn short_path(file: &str) -> &str {
    const REGISTRY: &str = "/registry/src/";
    match file.find(REGISTRY) {
        // Past the registry's index directory (`index.crates.io-…/`).
        Some(i) => {
            let rest = &file[i + REGISTRY.len()..];
            rest.split_once('/').map_or(rest, |(_, krate)| krate)
        }
        None => file,
    }
}

impl<S: Subscriber, L: Layer<S>> Layer<S> for RateLimit<L> {
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let (due, pass) = self.admit(event.metadata(), (self.clock)());
        // Written outside the lock: the inner layer does I/O.
        for s in &due {
            self.summarize(s, &ctx);
        }
        if pass {
            self.inner.on_event(event, ctx);
        }
    }

    // Everything else goes to the inner layer unchanged.
    fn on_register_dispatch(&self, subscriber: &tracing::Dispatch) {
        self.inner.on_register_dispatch(subscriber);
    }
    fn on_layer(&mut self, subscriber: &mut S) {
        self.inner.on_layer(subscriber);
    }
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        self.inner.register_callsite(metadata)
    }
    fn enabled(&self, metadata: &Metadata<'_>, ctx: Context<'_, S>) -> bool {
        self.inner.enabled(metadata, ctx)
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        self.inner.max_level_hint()
    }
    fn event_enabled(&self, event: &Event<'_>, ctx: Context<'_, S>) -> bool {
        self.inner.event_enabled(event, ctx)
    }
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        self.inner.on_new_span(attrs, id, ctx);
    }
    fn on_record(&self, span: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        self.inner.on_record(span, values, ctx);
    }
    fn on_follows_from(&self, span: &span::Id, follows: &span::Id, ctx: Context<'_, S>) {
        self.inner.on_follows_from(span, follows, ctx);
    }
    fn on_enter(&self, id: &span::Id, ctx: Context<'_, S>) {
        self.inner.on_enter(id, ctx);
    }
    fn on_exit(&self, id: &span::Id, ctx: Context<'_, S>) {
        self.inner.on_exit(id, ctx);
    }
    fn on_close(&self, id: span::Id, ctx: Context<'_, S>) {
        self.inner.on_close(id, ctx);
    }
    fn on_id_change(&self, old: &span::Id, new: &span::Id, ctx: Context<'_, S>) {
        self.inner.on_id_change(old, new, ctx);
    }
    unsafe fn downcast_raw(&self, id: TypeId) -> Option<*const ()> {
        if id == TypeId::of::<Self>() {
            return Some(self as *const Self as *const ());
        }
        // SAFETY: the caller upholds downcast_raw's contract (it casts the pointer
        // only to the type `id` names); the inner layer answers for its own types.
        unsafe { self.inner.downcast_raw(id) }
    }
}

#[cfg(test)]
#[path = "log_limit_tests.rs"]
pub(crate) mod tests;
