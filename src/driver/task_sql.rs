//! Task statements that every backend writes alike, built here once and run by each
//! backend's driver.

use diesel::backend::Backend;
use diesel::sql_types::{BigInt, HasSqlType};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use diesel::sql_types::{Double, Integer};

#[cfg(any(feature = "postgres", feature = "sqlite"))]
use super::RescueParams;
use crate::sql::Statement;

/// A task's state, owner and claim token (a [`super::ClaimState`]), by id.
pub(super) fn claim_state<DB>(id: i64) -> Statement<DB>
where
    DB: Backend + HasSqlType<BigInt>,
    i64: diesel::serialize::ToSql<BigInt, DB>,
{
    Statement::new("SELECT state, owner, claim_token FROM async_task WHERE id = ")
        .bind::<BigInt, _>(id)
}

// Not on MySQL: MariaDB has no `WITH … UPDATE`; its rescue binds the values in place.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
/// `WITH params AS (SELECT … AS default_max, … AS dead_ms, … AS base_ms, … AS max_ms, … AS
/// jitter)`, the head of the PostgreSQL and SQLite rescue statements.
pub(super) fn rescue_params<DB>(rescue: &RescueParams) -> Statement<DB>
where
    DB: Backend + HasSqlType<BigInt> + HasSqlType<Integer> + HasSqlType<Double>,
    i64: diesel::serialize::ToSql<BigInt, DB>,
    i32: diesel::serialize::ToSql<Integer, DB>,
    f64: diesel::serialize::ToSql<Double, DB>,
{
    Statement::new("WITH params AS (SELECT ")
        .bind::<Integer, _>(rescue.default_max_attempts)
        .sql(" AS default_max, ")
        .bind::<BigInt, _>(rescue.dead_after_ms)
        .sql(" AS dead_ms, ")
        .bind::<BigInt, _>(rescue.backoff_base_ms)
        .sql(" AS base_ms, ")
        .bind::<BigInt, _>(rescue.backoff_max_ms)
        .sql(" AS max_ms, ")
        .bind::<Double, _>(rescue.backoff_jitter)
        .sql(" AS jitter)")
}
