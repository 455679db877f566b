//! The registry: one handler per keyword.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::handler::Handler;
use crate::task::validate_keyword;

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
    use crate::handler::{HandlerResult, TaskContext, TaskTx};

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
