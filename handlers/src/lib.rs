//! The business handlers of the `outbox` binary, one file per keyword, registered here; and
//! the binary's own commands (`demo`, `bench`) around the library's CLI.
//!
//! To add a handler: write `src/<keyword>.rs` with a `pub fn handle(task: &TaskContext, tx:
//! &mut TaskTx) -> HandlerResult` (`tx.conn()?` is the connection inside the task's
//! transaction), and register it in [`registry`] below. To run it on a cron schedule as
//! well, register it with `registry.schedule("report.daily", "0 0 3 * * *", report::handle)`
//! (six fields with seconds; docs/guide/src/cron.md, "Cron schedules"); operators can schedule any
//! registered keyword without code with `outbox run --crontab FILE`.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod app;
pub mod bench;
pub mod coupon_grant;
pub mod demo;
pub mod points_credit;

use demo::{COUPON_GRANT, POINTS_CREDIT};
use outbox::Registry;

pub use app::main;

/// Every handler of this binary, by keyword.
pub fn registry() -> Registry {
    let mut registry = Registry::new();
    registry
        .register(POINTS_CREDIT, points_credit::handle)
        .register(COUPON_GRANT, coupon_grant::handle);
    registry
}
