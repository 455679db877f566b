//! Handlers: one function per keyword, and what they return.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::db::TaskTx;
use crate::task::{validate_keyword, TaskContext};

/// What a handler returns: `Ok(())`, or a [`HandlerError`].
pub type HandlerResult = Result<(), HandlerError>;

/// Runs the side-effect of one task.
///
/// `tx.conn()?` is the connection inside the task's transaction: everything the handler
/// writes through it commits together with the task's completion, or not at all
/// (exactly-once). A handler that returns an error, or panics, has its writes rolled back.
/// Effects outside the database (an HTTP call, a file) are at-least-once: make them
/// idempotent by `biz_id`. A handler that never asks for the connection opens no transaction:
/// its completion is one statement (see [`TaskTx`]).
///
/// Any `Fn(&TaskContext, &mut TaskTx) -> HandlerResult + Send + Sync` is a handler.
pub trait Handler: Send + Sync + 'static {
    /// Runs the task.
    fn handle(&self, task: &TaskContext, tx: &mut TaskTx<'_>) -> HandlerResult;
}

impl<F> Handler for F
where
    F: Fn(&TaskContext, &mut TaskTx<'_>) -> HandlerResult + Send + Sync + 'static,
{
    fn handle(&self, task: &TaskContext, tx: &mut TaskTx<'_>) -> HandlerResult {
        self(task, tx)
    }
}

/// A handler's failure: retryable (the default — the task runs again after a backoff, until
/// its max attempts) or permanent (the task is dead at once, e.g. a payload that can never be
/// processed).
///
/// Any error converts into a retryable `HandlerError` with `?`:
///
/// ```
/// use outbox::{HandlerError, HandlerResult};
///
/// fn parse_points(text: &str) -> HandlerResult {
///     let points: i64 = text.parse()?; // a ParseIntError becomes a retryable failure
///     if points < 0 {
///         return Err(HandlerError::permanent(anyhow::anyhow!("negative points {points}")));
///     }
///     Ok(())
/// }
/// assert!(parse_points("12").is_ok());
/// assert!(!parse_points("x").unwrap_err().is_permanent());
/// assert!(parse_points("-1").unwrap_err().is_permanent());
/// ```
pub struct HandlerError {
    permanent: bool,
    error: anyhow::Error,
}

impl HandlerError {
    /// A failure worth retrying.
    pub fn retry(error: impl Into<anyhow::Error>) -> Self {
        HandlerError {
            permanent: false,
            error: error.into(),
        }
    }

    /// A failure that retrying cannot fix: the task is dead at once.
    pub fn permanent(error: impl Into<anyhow::Error>) -> Self {
        HandlerError {
            permanent: true,
            error: error.into(),
        }
    }

    /// Whether the failure is permanent.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// The underlying error.
    pub fn error(&self) -> &anyhow::Error {
        &self.error
    }
}

// Like anyhow::Error, HandlerError is deliberately not std::error::Error, so that this
// blanket conversion (which makes `?` work on any error in a handler) does not overlap with
// `impl From<T> for T`.
impl<E: Into<anyhow::Error>> From<E> for HandlerError {
    fn from(error: E) -> Self {
        HandlerError::retry(error)
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `{:#}` prints the whole context chain on one line.
        write!(f, "{:#}", self.error)
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("permanent", &self.permanent)
            .field("error", &self.error)
            .finish()
    }
}

/// The handlers a worker runs, one per keyword. A worker claims only tasks whose keyword is
/// registered here; other keywords stay pending (useful in a rolling deploy) and show up in
/// `outbox stats`.
///
/// ```
/// use outbox::{HandlerResult, Registry, TaskContext, TaskTx};
///
/// fn credit_points(task: &TaskContext, tx: &mut TaskTx) -> HandlerResult {
///     let _ = (task.biz_id(), tx.conn()?);
///     Ok(())
/// }
///
/// let mut registry = Registry::new();
/// registry.register("points.credit", credit_points);
/// assert_eq!(registry.keywords().collect::<Vec<_>>(), ["points.credit"]);
/// ```
#[derive(Clone, Default)]
pub struct Registry {
    handlers: BTreeMap<String, Arc<dyn Handler>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `handler` for `keyword`.
    ///
    /// # Panics
    ///
    /// When `keyword` is already registered, or is not a valid keyword: both are programming
    /// errors that must stop the process at start-up, not surface later as stuck tasks.
    pub fn register(&mut self, keyword: &str, handler: impl Handler) -> &mut Self {
        if let Err(e) = validate_keyword(keyword) {
            panic!("cannot register handler: {e}");
        }
        if self
            .handlers
            .insert(keyword.to_owned(), Arc::new(handler))
            .is_some()
        {
            panic!("duplicate handler registered for keyword {keyword:?}");
        }
        self
    }

    /// The handler for `keyword`.
    pub fn get(&self, keyword: &str) -> Option<&dyn Handler> {
        self.handlers.get(keyword).map(|h| &**h)
    }

    /// The registered keywords, sorted.
    pub fn keywords(&self) -> impl Iterator<Item = &str> {
        self.handlers.keys().map(String::as_str)
    }

    /// Whether no handler is registered.
    pub fn is_empty(&self) -> bool {
        self.handlers.is_empty()
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.handlers.keys()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noop(_: &TaskContext, _: &mut TaskTx) -> HandlerResult {
        Ok(())
    }

    #[test]
    #[should_panic(expected = "duplicate handler registered for keyword \"a\"")]
    fn duplicate_keyword_panics() {
        Registry::new().register("a", noop).register("a", noop);
    }

    #[test]
    #[should_panic(expected = "invalid keyword")]
    fn invalid_keyword_panics() {
        Registry::new().register("Not Valid", noop);
    }
}
