//! Unit tests of the worker's settings.

use super::*;
use crate::worker::config::{DEFAULT_TASK_TIMEOUT, QUEUE_PER_THREAD, SQLITE_DEFAULT_QUEUE};
use crate::worker::style::ClaimStyle;

#[test]
fn defaults_follow_the_backend() {
    let pg = WorkerConfig::default().resolve(Backend::Postgres).unwrap();
    assert_eq!(pg.threads, default_threads());
    assert_eq!(pg.queue, default_threads() * QUEUE_PER_THREAD);
    let sqlite = WorkerConfig::default().resolve(Backend::Sqlite).unwrap();
    assert_eq!((sqlite.threads, sqlite.queue), (1, SQLITE_DEFAULT_QUEUE));
    let three = WorkerConfig::default().threads(3);
    assert_eq!(three.resolve(Backend::Sqlite).unwrap().queue, 24);
    let batched = WorkerConfig::default().threads(4).commit_batch(50);
    let stamped = batched.clone().claim_style(ClaimStyle::Stamp);
    let stamped = stamped.resolve(Backend::Postgres).unwrap();
    assert_eq!((stamped.queue, stamped.page_size), (4, 450));
    // Lock claims (auto, batched on PostgreSQL) have no queue.
    let batched = batched.resolve(Backend::Postgres).unwrap();
    assert_eq!((batched.queue, batched.page_size), (0, 250));
    assert_eq!(batched.claim_timeout(), DEFAULT_TASK_TIMEOUT * 50);
}

#[test]
fn an_out_of_range_setting_is_named() {
    let error = WorkerConfig::default()
        .threads(0)
        .resolve(Backend::Postgres)
        .unwrap_err();
    assert!(
        matches!(
            error,
            Error::InvalidConfig {
                setting: "threads",
                ..
            }
        ),
        "{error}"
    );
    let error = WorkerConfig::default()
        .heartbeat(Duration::from_secs(5))
        .dead_after(Duration::from_secs(6))
        .resolve(Backend::Postgres)
        .unwrap_err();
    assert!(
        matches!(
            error,
            Error::InvalidConfig {
                setting: "dead-after",
                ..
            }
        ),
        "{error}"
    );
}

fn locks(config: WorkerConfig, backend: Backend) -> bool {
    config.resolve(backend).unwrap().lock
}

#[test]
fn auto_locks_in_batched_mode_on_postgresql_only() {
    let batched = || WorkerConfig::default().threads(4).commit_batch(50);
    assert!(locks(batched(), Backend::Postgres));
    assert!(!locks(WorkerConfig::default(), Backend::Postgres));
    assert!(!locks(batched(), Backend::Sqlite));
    assert!(
        !locks(batched().queue(4), Backend::Postgres),
        "a queue asks for stamps"
    );
    let stamp = batched().claim_style(ClaimStyle::Stamp);
    assert!(!locks(stamp, Backend::Postgres));
    let strict_lock = WorkerConfig::default().claim_style(ClaimStyle::Lock);
    assert!(locks(strict_lock, Backend::Postgres));
    // No queue: a chunk per thread and one for the claiming thread.
    let settings = batched().resolve(Backend::Postgres).unwrap();
    assert_eq!((settings.queue, settings.page_size), (0, 250));
}
