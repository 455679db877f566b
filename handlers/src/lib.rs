//! The business handlers of the `outbox` binary, one file per keyword, registered here.
//!
//! To add one: write `src/<keyword>.rs` with a `pub fn handle(task: &TaskContext, tx: &mut
//! TaskTx) -> HandlerResult` (`tx.conn()?` is the connection inside the task's transaction),
//! and register it in [`registry`] below.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod coupon_grant;
pub mod points_credit;

use outbox::demo::{COUPON_GRANT, POINTS_CREDIT};
use outbox::Registry;

/// Every handler of this binary, by keyword.
pub fn registry() -> Registry {
    let mut registry = Registry::new();
    registry
        .register(POINTS_CREDIT, points_credit::handle)
        .register(COUPON_GRANT, coupon_grant::handle);
    registry
}
