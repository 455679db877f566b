//! Handlers: the function a keyword runs ([`Handler`]), what it sees of its task
//! ([`TaskContext`]), the task's transaction ([`TaskTx`]), and what it returns
//! ([`HandlerResult`], [`HandlerError`]).

mod context;
mod tx;

use std::fmt;

pub use context::TaskContext;
pub use tx::TaskTx;

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
/// Any error converts into a retryable `HandlerError` with `?`. Its message (the whole
/// context chain, truncated to 2,000 bytes) is stored in the task's `last_error` and logged:
/// do not put the payload or secrets in it.
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
