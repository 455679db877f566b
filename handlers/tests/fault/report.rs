//! The report: each scenario's block of figures, appended to
//! `$CARGO_TARGET_TMPDIR/fault-report.txt` (`fault-report-lock.txt` with lock claims).

use std::fmt::Display;
use std::sync::Once;
use std::time::Duration;

use crate::{claim, Claim};

/// The report file of this run's claim style: a run with lock claims keeps the default
/// run's report.
pub fn report_path() -> &'static str {
    match claim() {
        Claim::Default => concat!(env!("CARGO_TARGET_TMPDIR"), "/fault-report.txt"),
        Claim::Lock => concat!(env!("CARGO_TARGET_TMPDIR"), "/fault-report-lock.txt"),
    }
}
pub static REPORT_RESET: Once = Once::new();

/// One scenario's block of figures.
pub struct Report {
    pub lines: Vec<(String, String)>,
}

impl Report {
    pub fn new() -> Report {
        Report { lines: Vec::new() }
    }

    pub fn add(&mut self, key: &str, value: impl Display) {
        self.lines.push((key.to_owned(), value.to_string()));
    }
}

pub fn secs(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}

/// "median M, max X (n samples)" of some durations.
pub fn latency_summary(samples: &[Duration]) -> String {
    if samples.is_empty() {
        return "no samples".into();
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    let max = sorted[sorted.len() - 1];
    format!(
        "median {}, max {} ({} samples)",
        secs(median),
        secs(max),
        sorted.len()
    )
}
