//! The quick-start scenario of seed 003: placing an order credits points and grants a coupon,
//! each as a task enqueued in the order's own transaction.
//!
//! The business tables (`demo_order`, `demo_points_ledger`, `demo_coupon`) are defined here so
//! that the `outbox demo` command and the handlers in `handlers/` share one definition. The
//! ledger and coupon tables deliberately have no unique constraint on `order_id`: a duplicate
//! side-effect would be stored, and [`check`] would find it.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use serde::{Deserialize, Serialize};

use anyhow::Context;
use outbox::{enqueue_batch, write_transaction, DbConnection, Enqueued, NewTask};

/// The keyword of the points task.
pub const POINTS_CREDIT: &str = "points.credit";
/// The keyword of the coupon task.
pub const COUPON_GRANT: &str = "coupon.grant";

/// The demo's tables, for diesel's DSL on every backend.
pub mod schema {
    diesel::table! {
        /// Orders placed by the demo.
        demo_order (id) {
            /// Order number (the tasks' biz_id).
            id -> BigInt,
            /// The customer.
            user_id -> BigInt,
            /// Amount in cents.
            amount_cents -> BigInt,
        }
    }

    diesel::table! {
        /// One row per points credit: the side-effect of `points.credit`.
        demo_points_ledger (id) {
            /// Row id.
            id -> BigInt,
            /// The credited order.
            order_id -> BigInt,
            /// The customer.
            user_id -> BigInt,
            /// Points credited.
            points -> BigInt,
        }
    }

    diesel::table! {
        /// One row per coupon: the side-effect of `coupon.grant`.
        demo_coupon (id) {
            /// Row id.
            id -> BigInt,
            /// The order that earned it.
            order_id -> BigInt,
            /// The customer.
            user_id -> BigInt,
            /// The coupon code.
            code -> Text,
        }
    }
}

/// The payload of both demo tasks.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderPayload {
    /// The customer.
    pub user_id: i64,
    /// The order amount in cents; one point per whole unit.
    pub amount_cents: i64,
}

const POSTGRES_TABLES: &str = "
CREATE TABLE IF NOT EXISTS demo_order (
    id BIGSERIAL PRIMARY KEY, user_id BIGINT NOT NULL, amount_cents BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS demo_points_ledger (
    id BIGSERIAL PRIMARY KEY, order_id BIGINT NOT NULL, user_id BIGINT NOT NULL, points BIGINT NOT NULL);
CREATE INDEX IF NOT EXISTS demo_points_ledger_order_idx ON demo_points_ledger (order_id);
CREATE TABLE IF NOT EXISTS demo_coupon (
    id BIGSERIAL PRIMARY KEY, order_id BIGINT NOT NULL, user_id BIGINT NOT NULL, code TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS demo_coupon_order_idx ON demo_coupon (order_id);
";

#[cfg(feature = "mysql")]
const MYSQL_TABLES: &str = "
CREATE TABLE IF NOT EXISTS demo_order (
    id BIGINT AUTO_INCREMENT PRIMARY KEY, user_id BIGINT NOT NULL, amount_cents BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS demo_points_ledger (
    id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id BIGINT NOT NULL, user_id BIGINT NOT NULL,
    points BIGINT NOT NULL, INDEX demo_points_ledger_order_idx (order_id));
CREATE TABLE IF NOT EXISTS demo_coupon (
    id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id BIGINT NOT NULL, user_id BIGINT NOT NULL,
    code TEXT NOT NULL, INDEX demo_coupon_order_idx (order_id));
";

const SQLITE_TABLES: &str = "
CREATE TABLE IF NOT EXISTS demo_order (
    id INTEGER PRIMARY KEY AUTOINCREMENT, user_id INTEGER NOT NULL, amount_cents INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS demo_points_ledger (
    id INTEGER PRIMARY KEY AUTOINCREMENT, order_id INTEGER NOT NULL, user_id INTEGER NOT NULL,
    points INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS demo_points_ledger_order_idx ON demo_points_ledger (order_id);
CREATE TABLE IF NOT EXISTS demo_coupon (
    id INTEGER PRIMARY KEY AUTOINCREMENT, order_id INTEGER NOT NULL, user_id INTEGER NOT NULL,
    code TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS demo_coupon_order_idx ON demo_coupon (order_id);
";

/// Creates the demo tables if they do not exist.
pub fn setup(conn: &mut DbConnection) -> anyhow::Result<()> {
    let sql = match conn {
        DbConnection::Pg(_) => POSTGRES_TABLES,
        DbConnection::Sqlite(_) => SQLITE_TABLES,
        #[cfg(feature = "mysql")]
        DbConnection::Mysql(_) => MYSQL_TABLES,
    };
    conn.batch_execute(sql).context("creating the demo tables")
}

/// Inserts one `demo_order` row; returns its id (`RETURNING`, or MySQL's `LAST_INSERT_ID()`).
fn insert_order(conn: &mut DbConnection, customer: i64, amount: i64) -> QueryResult<i64> {
    use schema::demo_order::dsl::*;
    let row = (user_id.eq(customer), amount_cents.eq(amount));
    match conn {
        #[cfg(feature = "mysql")]
        DbConnection::Mysql(c) => {
            diesel::insert_into(demo_order).values(row).execute(c)?;
            diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
                "CAST(LAST_INSERT_ID() AS SIGNED)",
            ))
            .get_result(c)
        }
        DbConnection::Pg(c) => diesel::insert_into(demo_order)
            .values(row)
            .returning(id)
            .get_result(c),
        DbConnection::Sqlite(c) => diesel::insert_into(demo_order)
            .values(row)
            .returning(id)
            .get_result(c),
    }
}

/// Places `count` orders, each in its own business transaction that inserts the order and
/// enqueues `points.credit` and `coupon.grant` for it. Returns the new order ids.
pub fn place_orders(conn: &mut DbConnection, count: u64) -> anyhow::Result<Vec<i64>> {
    let mut ids = Vec::with_capacity(count as usize);
    for n in 0..count {
        let customer = (n % 97 + 1) as i64;
        let amount = 1_000 + (n as i64 * 37) % 9_000;
        let order_id = write_transaction(conn, |conn| -> anyhow::Result<i64> {
            let order = insert_order(conn, customer, amount).context("inserting the demo order")?;
            let payload = OrderPayload {
                user_id: customer,
                amount_cents: amount,
            };
            let tasks = [
                NewTask::new(POINTS_CREDIT, order.to_string()).payload(&payload),
                NewTask::new(COUPON_GRANT, order.to_string()).payload(&payload),
            ];
            let enqueued: Vec<Enqueued> = enqueue_batch(conn, &tasks)?;
            debug_assert!(enqueued.iter().all(|e| e.created));
            Ok(order)
        })?;
        ids.push(order_id);
    }
    Ok(ids)
}

/// An order whose side-effects did not happen exactly once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Offender {
    /// The order.
    pub order_id: i64,
    /// Points ledger rows for it.
    pub credits: i64,
    /// Coupons for it.
    pub coupons: i64,
}

/// The result of the exactly-once check.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    /// Orders in `demo_order`.
    pub orders: i64,
    /// Orders with exactly one points credit and exactly one coupon.
    pub exactly_once: i64,
    /// The others (at most 100 listed).
    pub offenders: Vec<Offender>,
}

#[derive(QueryableByName)]
struct OffenderRow {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    order_id: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    credits: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    coupons: i64,
}

/// Checks that every order was credited exactly once and got exactly one coupon.
pub fn check(conn: &mut DbConnection) -> anyhow::Result<CheckReport> {
    use schema::demo_order::dsl::demo_order;
    let orders: i64 = demo_order
        .count()
        .get_result(conn)
        .context("demo check (are there demo tables here?)")?;
    let bad: Vec<OffenderRow> = diesel::sql_query(
        "SELECT o.id AS order_id,
                (SELECT count(*) FROM demo_points_ledger p WHERE p.order_id = o.id) AS credits,
                (SELECT count(*) FROM demo_coupon c WHERE c.order_id = o.id) AS coupons
         FROM demo_order o
         WHERE (SELECT count(*) FROM demo_points_ledger p WHERE p.order_id = o.id) <> 1
            OR (SELECT count(*) FROM demo_coupon c WHERE c.order_id = o.id) <> 1
         ORDER BY o.id",
    )
    .load(conn)
    .context("demo check")?;
    let offenders_total = bad.len() as i64;
    Ok(CheckReport {
        orders,
        exactly_once: orders - offenders_total,
        offenders: bad
            .into_iter()
            .take(100)
            .map(|r| Offender {
                order_id: r.order_id,
                credits: r.credits,
                coupons: r.coupons,
            })
            .collect(),
    })
}

impl CheckReport {
    /// `Ok` when every order's side-effects happened exactly once, else an error listing
    /// the first offenders.
    pub fn verify(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.orders > 0,
            "demo check failed: no demo orders in this database; place some with `outbox demo --enqueue-only`"
        );
        if self.offenders.is_empty() {
            return Ok(());
        }
        let listed: Vec<String> = self
            .offenders
            .iter()
            .take(20)
            .map(|o| {
                format!(
                    "order {} ({} credits, {} coupons)",
                    o.order_id, o.credits, o.coupons
                )
            })
            .collect();
        anyhow::bail!(
            "demo check failed: {} of {} orders not applied exactly once: {}",
            self.orders - self.exactly_once,
            self.orders,
            listed.join(", ")
        )
    }
}
