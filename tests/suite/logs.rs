//! What the library logged, captured for assertions: a `log` logger installed once for the
//! test binary, keeping every record of the `outbox` crate (debug and above) as a line
//! `LEVEL target: message`. Tests run in parallel, so a test looks for lines that name its
//! own task or value.

use std::sync::{Mutex, OnceLock, PoisonError};

struct Capture {
    lines: Mutex<Vec<String>>,
}

impl log::Log for Capture {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.target().starts_with("outbox")
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            let line = format!("{} {}: {}", record.level(), record.target(), record.args());
            self.lines
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(line);
        }
    }

    fn flush(&self) {}
}

fn capture() -> &'static Capture {
    static CAPTURE: OnceLock<&'static Capture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let capture: &'static Capture = Box::leak(Box::new(Capture {
            lines: Mutex::default(),
        }));
        log::set_logger(capture).expect("the only logger of the suite");
        log::set_max_level(log::LevelFilter::Debug);
        capture
    })
}

/// Starts capturing (idempotent): call before the code under test runs.
pub fn start() {
    capture();
}

/// The captured lines that contain `needle`.
pub fn containing(needle: &str) -> Vec<String> {
    capture()
        .lines
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter(|line| line.contains(needle))
        .cloned()
        .collect()
}
