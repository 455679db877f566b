//! `points.credit`: credit loyalty points for an order (one point per whole currency unit).

use crate::demo::{schema::demo_points_ledger, OrderPayload};
use anyhow::Context;
use diesel::prelude::*;
use outbox::{HandlerError, HandlerResult, TaskContext, TaskTx};

/// Writes one ledger row in the task's transaction: it commits with the task's completion,
/// so the order is credited exactly once.
pub fn handle(task: &TaskContext, tx: &mut TaskTx) -> HandlerResult {
    let order: OrderPayload = task.payload()?;
    let order_id: i64 = task.biz_id().parse().map_err(|e| {
        HandlerError::permanent(anyhow::anyhow!("biz_id is not an order number: {e}"))
    })?;
    diesel::insert_into(demo_points_ledger::table)
        .values((
            demo_points_ledger::order_id.eq(order_id),
            demo_points_ledger::user_id.eq(order.user_id),
            demo_points_ledger::points.eq(order.amount_cents / 100),
        ))
        .execute(tx.conn()?)
        .context("inserting the points ledger row")?;
    Ok(())
}
