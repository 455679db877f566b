//! `coupon.grant`: grant a coupon for an order (the campaign of seed 003).

use crate::demo::{schema::demo_coupon, OrderPayload};
use anyhow::Context;
use diesel::prelude::*;
use outbox::{HandlerError, HandlerResult, TaskContext, TaskTx};

/// Writes one coupon row in the task's transaction, so each order gets exactly one coupon.
pub fn handle(task: &TaskContext, tx: &mut TaskTx) -> HandlerResult {
    let order: OrderPayload = task.payload()?;
    let order_id: i64 = task.biz_id().parse().map_err(|e| {
        HandlerError::permanent(anyhow::anyhow!("biz_id is not an order number: {e}"))
    })?;
    diesel::insert_into(demo_coupon::table)
        .values((
            demo_coupon::order_id.eq(order_id),
            demo_coupon::user_id.eq(order.user_id),
            demo_coupon::code.eq(format!("CPN-{order_id}")),
        ))
        .execute(tx.conn()?)
        .context("inserting the coupon")?;
    Ok(())
}
