//! How a replay shows that it moves: a progress bar on a terminal, and off
//! one (CI logs, scripts, a file) a plain line on stderr every few seconds.

use super::Timing;
use gpool_core::sched::Plan;
use gpool_core::sim::{self, Observer};
use std::time::{Duration, Instant};

/// Off a terminal, a progress line at most this often.
const LINE_EVERY: Duration = Duration::from_secs(5);

const DAY_MS: i64 = 86_400_000;
const HOUR_MS: i64 = 3_600_000;

/// Times every cycle and shows the progress of the virtual clock.
pub(super) struct Watch {
    label: String,
    cycle_secs: Vec<f64>,
    started: Instant,
    shown: Shown,
}

/// Where the progress goes.
enum Shown {
    Bar(indicatif::ProgressBar),
    /// Plain lines on stderr: the next is due at `next_at`.
    Lines {
        next_at: Instant,
    },
}

impl Observer for Watch {
    fn cycle(&mut self, run: &mut dyn FnMut() -> Plan) -> Plan {
        let started = Instant::now();
        let plan = run();
        self.cycle_secs.push(started.elapsed().as_secs_f64());
        plan
    }

    fn progress(&mut self, done_ms: i64, total_ms: i64) {
        match &mut self.shown {
            Shown::Bar(bar) => {
                bar.set_length(total_ms.max(1) as u64);
                bar.set_position(done_ms.clamp(0, total_ms) as u64);
            }
            Shown::Lines { next_at } => {
                let now = Instant::now();
                if now >= *next_at {
                    *next_at = now + LINE_EVERY;
                    let elapsed = now.duration_since(self.started);
                    eprintln!("{}", progress_line(&self.label, done_ms, total_ms, elapsed));
                }
            }
        }
    }
}

impl Watch {
    /// A bar in `bars` where stderr is a terminal, else plain lines (the
    /// first at the first cycle).
    pub(super) fn new(label: &str, bars: &indicatif::MultiProgress) -> Watch {
        use std::io::IsTerminal;
        let shown = if std::io::stderr().is_terminal() {
            let bar = bars.add(indicatif::ProgressBar::new(1));
            if let Ok(style) =
                indicatif::ProgressStyle::with_template("{prefix:>12} [{bar:40}] {percent:>3}% {elapsed}")
            {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(label.to_string());
            Shown::Bar(bar)
        } else {
            Shown::Lines {
                next_at: Instant::now(),
            }
        };
        Watch {
            label: label.to_string(),
            cycle_secs: Vec::new(),
            started: Instant::now(),
            shown,
        }
    }

    /// Clears the bar (or says the replay is done) and gives its timing.
    pub(super) fn finish(self, replay: Duration) -> Timing {
        match self.shown {
            Shown::Bar(bar) => bar.finish_and_clear(),
            Shown::Lines { .. } => eprintln!(
                "sim: {}: done, {:.0} s",
                self.label,
                self.started.elapsed().as_secs_f64()
            ),
        }
        let dist = sim::Dist::of(self.cycle_secs);
        Timing {
            replay_secs: replay.as_secs_f64(),
            cycles: dist.n,
            cycle_mean_ms: dist.mean * 1e3,
            cycle_p99_ms: dist.p99 * 1e3,
            cycle_max_ms: dist.max * 1e3,
        }
    }
}

/// One replay of the savings search, watched while it runs: done (its bar
/// cleared, or a line saying so) when the search drops it.
pub(super) struct Scaled(Option<Watch>);

impl Scaled {
    pub(super) fn new(watch: Watch) -> Scaled {
        Scaled(Some(watch))
    }
}

impl Observer for Scaled {
    fn cycle(&mut self, run: &mut dyn FnMut() -> Plan) -> Plan {
        match &mut self.0 {
            Some(watch) => watch.cycle(run),
            None => run(),
        }
    }

    fn progress(&mut self, done_ms: i64, total_ms: i64) {
        if let Some(watch) = &mut self.0 {
            watch.progress(done_ms, total_ms);
        }
    }
}

impl Drop for Scaled {
    fn drop(&mut self) {
        if let Some(watch) = self.0.take() {
            watch.finish(Duration::ZERO);
        }
    }
}

/// One progress line: `done_ms` of the virtual clock of the `total_ms`
/// from the trace's first arrival to its last (past it, the queue
/// drains), in days (hours for a trace under two days).
pub(super) fn progress_line(label: &str, done_ms: i64, total_ms: i64, elapsed: Duration) -> String {
    let (done_ms, total_ms) = (done_ms.max(0), total_ms.max(1));
    let (unit, unit_ms) = if total_ms >= 2 * DAY_MS {
        ("day", DAY_MS)
    } else {
        ("hour", HOUR_MS)
    };
    // Day 1 is the first day: the clock at 0 ms is in it.
    let at = done_ms / unit_ms + 1;
    let of = ((total_ms + unit_ms - 1) / unit_ms).max(1);
    let secs = elapsed.as_secs();
    if done_ms <= total_ms {
        let pct = done_ms * 100 / total_ms;
        let at = at.min(of);
        format!("sim: {label}: {pct}% of the trace (simulated {unit} {at} of {of}), {secs} s")
    } else {
        let at = at.max(of);
        format!("sim: {label}: the whole trace has arrived, its queue drains (simulated {unit} {at}, the last arrival on {unit} {of}), {secs} s")
    }
}
