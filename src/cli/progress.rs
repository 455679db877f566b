//! A drain's progress: a bar (`indicatif`: done/total, rate, ETA) when standard output is a
//! terminal, plain lines otherwise, so that cron's logs stay clean: one line at the start
//! and one every [`LINE_INTERVAL`] while the drain lasts.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle as BarStyle};

/// How often a plain progress line is printed.
pub const LINE_INTERVAL: Duration = Duration::from_secs(10);
/// How often the bar is redrawn.
const BAR_INTERVAL: Duration = Duration::from_millis(100);

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressStyle {
    /// A bar redrawn in place, on a terminal.
    Bar,
    /// A line at the start and one every `LINE_INTERVAL`, for logs.
    Lines,
    /// Nothing (`--json`: standard output holds the summary object alone).
    Quiet,
}

impl ProgressStyle {
    /// The bar when standard output is a terminal, nothing with `--json`, lines otherwise.
    pub fn choose(stdout_is_terminal: bool, json: bool) -> ProgressStyle {
        match (json, stdout_is_terminal) {
            (true, _) => ProgressStyle::Quiet,
            (false, true) => ProgressStyle::Bar,
            (false, false) => ProgressStyle::Lines,
        }
    }

    /// [`ProgressStyle::choose`] for this process's standard output.
    pub fn detect(json: bool) -> ProgressStyle {
        Self::choose(std::io::stdout().is_terminal(), json)
    }
}

/// Shows the progress of some work.
#[derive(Debug)]
pub struct Progress {
    style: ProgressStyle,
    /// What is being done, for the lines (`draining`).
    verb: &'static str,
    total: u64,
}

impl Progress {
    /// Progress of `total` tasks to go through, shown in `style`.
    pub fn new(style: ProgressStyle, verb: &'static str, total: u64) -> Progress {
        Progress { style, verb, total }
    }

    /// Runs `work` on this thread while another shows `done()` (the tasks finished so far)
    /// against the total; the bar is cleared before this returns.
    pub fn run_while<T>(&self, done: impl Fn() -> u64 + Sync, work: impl FnOnce() -> T) -> T {
        if self.style == ProgressStyle::Quiet {
            return work();
        }
        let finished = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| match self.style {
                ProgressStyle::Bar => self.bar(&done, &finished),
                _ => self.lines(&done, &finished),
            });
            let result = work();
            finished.store(true, Ordering::Relaxed);
            result
        })
    }

    fn bar(&self, done: &dyn Fn() -> u64, finished: &AtomicBool) {
        let bar = ProgressBar::with_draw_target(Some(self.total), ProgressDrawTarget::stdout());
        bar.set_style(
            BarStyle::with_template(
                "{spinner} {msg} [{elapsed_precise}] {wide_bar} {pos}/{len} tasks ({rate}, ETA {eta})",
            )
            .expect("a valid template")
            .with_key(
                "rate",
                |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = write!(w, "{:.0} tasks/s", state.per_sec());
                },
            ),
        );
        bar.set_message(self.verb);
        while !finished.load(Ordering::Relaxed) {
            let now = done();
            // Tasks the drain makes due as it goes (follow-ups, retries) add to the total.
            if now > bar.length().unwrap_or(0) {
                bar.set_length(now);
            }
            bar.set_position(now);
            std::thread::sleep(BAR_INTERVAL);
        }
        bar.finish_and_clear();
    }

    fn lines(&self, done: &dyn Fn() -> u64, finished: &AtomicBool) {
        println!("{} {} due tasks", self.verb, self.total);
        let started = Instant::now();
        let mut next = started + LINE_INTERVAL;
        while !finished.load(Ordering::Relaxed) {
            if Instant::now() >= next {
                println!("{}", line(done(), self.total, started.elapsed()));
                next += LINE_INTERVAL;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A plain progress line: `  1200/5000 tasks, 240 tasks/s, about 16s left`.
fn line(done: u64, total: u64, elapsed: Duration) -> String {
    let rate = done as f64 / elapsed.as_secs_f64().max(1e-3);
    let left = total.saturating_sub(done);
    let eta = if left == 0 {
        String::new()
    } else if rate > 0.0 {
        format!(", about {}s left", (left as f64 / rate).ceil() as u64)
    } else {
        ", none finished yet".to_owned()
    };
    format!("  {done}/{} tasks, {rate:.0} tasks/s{eta}", total.max(done))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_only_on_a_terminal_and_nothing_with_json() {
        assert_eq!(ProgressStyle::choose(true, false), ProgressStyle::Bar);
        assert_eq!(ProgressStyle::choose(false, false), ProgressStyle::Lines);
        assert_eq!(ProgressStyle::choose(true, true), ProgressStyle::Quiet);
        assert_eq!(ProgressStyle::choose(false, true), ProgressStyle::Quiet);
    }

    #[test]
    fn a_line_shows_done_total_rate_and_time_left() {
        let ten = Duration::from_secs(10);
        assert_eq!(
            line(1200, 5000, ten),
            "  1200/5000 tasks, 120 tasks/s, about 32s left"
        );
        assert_eq!(
            line(0, 5000, ten),
            "  0/5000 tasks, 0 tasks/s, none finished yet"
        );
        // Tasks made due during the drain: the total grows with them.
        assert_eq!(line(5200, 5000, ten), "  5200/5200 tasks, 520 tasks/s");
    }

    #[test]
    fn quiet_progress_runs_the_work_alone() {
        let progress = Progress::new(ProgressStyle::Quiet, "draining", 3);
        assert_eq!(progress.run_while(|| 3, || 42), 42);
    }
}
