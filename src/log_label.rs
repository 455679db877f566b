//! Which database a log record is about, in a process that serves several ([`crate::Fleet`]).
//!
//! Task ids and node ids are each database's own: in a fleet, `task 7 … is dead` could be
//! about any of them. Every thread that works for one of a fleet's databases carries that
//! database's label (its URL, password masked, as the fleet's reports name it) while it does:
//! its claim loop, its background services, and each of its tasks or chunks on the shared
//! pool. A logger's format reads it with [`log_database`]; the `outbox` binary writes it
//! before the message, as its reports do (`postgres://app:***@shard-1/app: task 7 …`). A
//! worker of one database sets none, and its lines are as they were.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::Arc;

thread_local! {
    static DATABASE: RefCell<Option<Arc<str>>> = const { RefCell::new(None) };
}

/// The label of the database the current thread works for, when it works for one of the
/// databases of a [`crate::Fleet`] of several (`outbox run|drain` with `--database-url`
/// repeated); `None` otherwise, and in the threads a handler starts itself. For a logger's
/// format, which writes it before the message as the `outbox` binary does:
///
/// ```
/// fn message(record: &log::Record) -> String {
///     match outbox::log_database() {
///         Some(database) => format!("{database}: {}", record.args()),
///         None => record.args().to_string(),
///     }
/// }
/// ```
pub fn log_database() -> Option<Arc<str>> {
    // `try_with`: a logger may be called while the thread's locals are torn down.
    DATABASE
        .try_with(|label| label.borrow().clone())
        .ok()
        .flatten()
}

/// Sets the current thread's label to `label` until the returned guard drops, which puts back
/// the one before (a claiming thread that runs a task itself keeps its own).
#[must_use = "the label is unset when the guard drops"]
pub(crate) fn labelled(label: Option<&Arc<str>>) -> Restore {
    Restore(
        DATABASE.with(|current| current.replace(label.cloned())),
        PhantomData,
    )
}

/// Puts back a thread's label on drop (see [`labelled`]); stays on its thread (not `Send`).
pub(crate) struct Restore(Option<Arc<str>>, PhantomData<*const ()>);

impl Drop for Restore {
    fn drop(&mut self) {
        let before = self.0.take();
        let _ = DATABASE.try_with(|current| *current.borrow_mut() = before);
    }
}

/// Runs `f` on a new thread that carries the spawning thread's label: what a worker's
/// services, started while its label is set, need to be labelled too.
pub(crate) fn inherited<T>(f: impl FnOnce() -> T) -> impl FnOnce() -> T {
    let label = log_database();
    move || {
        let _label = labelled(label.as_ref());
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_holds_until_its_guard_drops_and_a_nested_one_puts_the_outer_back() {
        assert_eq!(log_database(), None);
        let a: Arc<str> = Arc::from("sqlite:///a.db");
        let b: Arc<str> = Arc::from("sqlite:///b.db");
        {
            let _a = labelled(Some(&a));
            assert_eq!(log_database().as_deref(), Some("sqlite:///a.db"));
            {
                let _b = labelled(Some(&b));
                assert_eq!(log_database().as_deref(), Some("sqlite:///b.db"));
            }
            assert_eq!(log_database().as_deref(), Some("sqlite:///a.db"));
            let on_thread = std::thread::spawn(inherited(log_database)).join().unwrap();
            assert_eq!(on_thread.as_deref(), Some("sqlite:///a.db"));
            let unset = std::thread::spawn(log_database).join().unwrap();
            assert_eq!(unset, None, "a thread spawned plainly carries no label");
        }
        assert_eq!(log_database(), None);
    }
}
