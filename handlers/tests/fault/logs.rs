//! What the processes wrote: the workers' log lines (stderr) and summaries (stdout).

use std::collections::HashSet;

use crate::scenario::Proc;

/// The worker's log line when its claims start failing (`Worker::run`).
pub const OUTAGE_LOG: &[&str] = &["retrying with backoff"];
/// The worker's log lines when a task is released because the database failed under it.
pub const RELEASE_LOG: &[&str] = &["while running it", "the connection broke under its handler"];

/// The tasks whose claim the workers logged as taken over before completion.
pub fn lost_claim_tasks(procs: &[&Proc]) -> HashSet<i64> {
    procs
        .iter()
        .flat_map(|p| lost_claim_ids(&p.stderr_text(), ""))
        .collect()
}

/// The task ids of a worker log's "task N: …its claim was taken over" lines, of those logged
/// at `since` or later (a time as the log writes it, `2026-11-23T15:41:48Z`; "" for all).
pub fn lost_claim_ids(log: &str, since: &str) -> Vec<i64> {
    log.lines()
        .filter(|l| l.get(1..21).is_some_and(|at| at >= since))
        .filter(|l| l.contains("its claim was taken over"))
        .filter_map(|l| {
            let rest = &l[l.find("] task ")? + "] task ".len()..];
            rest[..rest.find(':')?].parse().ok()
        })
        .collect()
}

#[test]
fn lost_claim_ids_reads_both_log_lines_of_a_lost_claim() {
    let log = "\
[2026-11-23T15:41:48Z WARN  outbox::worker::execute] task 1784: its claim was taken over before completion; effects rolled back
[2026-11-23T15:41:48Z WARN  outbox::worker::execute] task 17: task fail: its claim was taken over
[2026-11-23T15:41:48Z WARN  outbox::worker::execute] task 1765: could not open its transaction: server closed the connection unexpectedly
";
    assert_eq!(lost_claim_ids(log, ""), vec![1784, 17]);
    assert_eq!(lost_claim_ids(log, "2026-11-23T15:41:48Z"), vec![1784, 17]);
    assert_eq!(
        lost_claim_ids(log, "2026-11-23T15:41:49Z"),
        Vec::<i64>::new()
    );
}

/// Lines of the workers' stderr that contain one of `needles`.
pub fn log_lines(procs: &[&Proc], needles: &[&str]) -> usize {
    procs
        .iter()
        .map(|p| {
            p.stderr_text()
                .lines()
                .filter(|l| needles.iter().any(|n| l.contains(n)))
                .count()
        })
        .sum()
}

/// Each process's summary line (`drained …` or `ran …`; a drain's progress lines come
/// before it), or a fleet's, one per database (`<database>: ran …`).
pub fn summaries(procs: &[Proc]) -> String {
    procs
        .iter()
        .map(|p| {
            // A fleet prints one line per database, each after its name and a colon.
            let lines: Vec<String> = p
                .stdout_text()
                .lines()
                .filter(|l| {
                    let summary = |l: &str| l.starts_with("drained ") || l.starts_with("ran ");
                    summary(l) || l.split_once(": ").is_some_and(|(_, rest)| summary(rest))
                })
                .map(str::to_owned)
                .collect();
            match lines.is_empty() {
                true => "(nothing)".to_owned(),
                false => lines.join("; "),
            }
        })
        .collect::<Vec<_>>()
        .join(" | ")
}
