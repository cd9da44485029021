//! The progress line: which point runs, how many are left, and an ETA from the
//! time the finished runs took. On a terminal the line is rewritten in place
//! (indicatif); in a log (tests, CI) each run gets its own line.
use std::io::IsTerminal;
use std::time::Instant;

/// Progress of the measured runs (one run = one point's repeat on one system).
#[derive(Debug)]
pub struct Progress {
    total_points: usize,
    total_runs: usize,
    done_runs: usize,
    run_secs: f64,
    guess_secs: f64,
    /// The line redrawn in place, on a terminal only.
    bar: Option<indicatif::ProgressBar>,
    started: Instant,
}

/// `secs` as `1h02m`, `3m05s` or `42s`.
pub fn fmt_duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

impl Progress {
    /// `total_points` points of `repeat` runs each; a run is guessed to take
    /// `guess_secs` until one finished.
    pub fn new(total_points: usize, repeat: usize, guess_secs: f64) -> Self {
        Progress {
            total_points,
            total_runs: total_points * repeat,
            done_runs: 0,
            run_secs: 0.0,
            guess_secs,
            bar: std::io::stderr().is_terminal().then(|| {
                let bar = indicatif::ProgressBar::no_length();
                if let Ok(style) = indicatif::ProgressStyle::with_template("{msg}") {
                    bar.set_style(style);
                }
                bar
            }),
            started: Instant::now(),
        }
    }

    /// Seconds left, from the mean time of finished runs.
    pub fn eta_secs(&self) -> f64 {
        let per = if self.done_runs == 0 {
            self.guess_secs
        } else {
            self.run_secs / self.done_runs as f64
        };
        per * self.total_runs.saturating_sub(self.done_runs) as f64
    }

    /// The line shown while run `point` (1-based) described by `what` goes.
    pub fn line(&self, point: usize, what: &str) -> String {
        format!(
            "[point {point}/{}, run {}/{}] {what} | elapsed {}, ETA {}",
            self.total_points,
            self.done_runs + 1,
            self.total_runs,
            fmt_duration(self.started.elapsed().as_secs_f64()),
            fmt_duration(self.eta_secs())
        )
    }

    /// Show that run `point` starts.
    pub fn begin(&self, point: usize, what: &str) {
        let line = self.line(point, what);
        match &self.bar {
            Some(bar) => bar.set_message(line),
            None => say!("{line}"),
        }
    }

    /// Record that a run took `secs`.
    pub fn end_run(&mut self, secs: f64) {
        self.done_runs += 1;
        self.run_secs += secs;
    }

    /// Print a message on its own line (keeps the progress line intact).
    pub fn note(&self, msg: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| say!("{msg}")),
            None => say!("{msg}"),
        }
    }

    /// End the progress display.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        say!(
            "{} runs done in {}",
            self.done_runs,
            fmt_duration(self.started.elapsed().as_secs_f64())
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_eta_uses_measured_runs() {
        let mut p = Progress::new(4, 2, 10.0);
        assert_eq!(p.eta_secs(), 80.0);
        p.end_run(3.0);
        p.end_run(5.0);
        assert_eq!(p.eta_secs(), 24.0);
        let l = p.line(2, "drove block-write X=1");
        assert!(
            l.starts_with("[point 2/4, run 3/8] drove block-write X=1"),
            "{l}"
        );
        assert!(l.ends_with("ETA 24s"), "{l}");
    }

    #[test]
    fn test_fmt_duration() {
        assert_eq!(fmt_duration(42.4), "42s");
        assert_eq!(fmt_duration(185.0), "3m05s");
        assert_eq!(fmt_duration(3720.0), "1h02m");
        assert_eq!(fmt_duration(-1.0), "0s");
    }
}
